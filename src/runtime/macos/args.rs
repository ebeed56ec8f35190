//! The argv of every `cocoon-macos` verb vk-cocoon issues. Pure: the
//! client runs these as they are, never through a shell.

/// A VNC display and its password (the CLI never persists the password: `vm start` needs it
/// again).
#[derive(Clone, PartialEq, Eq)]
pub struct Vnc {
    /// Display number: the TCP port is 5900 + display.
    pub display: u16,
    pub password: String,
}

impl std::fmt::Debug for Vnc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password: specs end up in logs.
        f.debug_struct("Vnc")
            .field("display", &self.display)
            .finish_non_exhaustive()
    }
}

/// `vm run`: everything the host decided for a new macOS VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MacRunSpec {
    pub name: String,
    pub image: String,
    /// Even (macOS wants an even vCPU count).
    pub cpus: u32,
    pub memory_mib: u64,
    pub vnc: Option<Vnc>,
    /// System disk size in bytes; `None` keeps the image's virtual size.
    pub storage_bytes: Option<u64>,
}

fn s(v: &str) -> String {
    v.to_string()
}

fn vnc_flags(out: &mut Vec<String>, vnc: &Option<Vnc>) {
    if let Some(v) = vnc {
        out.extend([
            s("--vnc"),
            v.display.to_string(),
            s("--vnc-password"),
            v.password.clone(),
        ]);
    }
}

/// `vm run --name N --cpus C --memory MIB [--vnc D --vnc-password P] [--storage BYTES]
/// --exit-on-reboot --random-smbios --net cni IMAGE`.
pub fn run(spec: &MacRunSpec) -> Vec<String> {
    let mut out = vec![
        s("vm"),
        s("run"),
        s("--name"),
        spec.name.clone(),
        s("--cpus"),
        spec.cpus.to_string(),
        s("--memory"),
        spec.memory_mib.to_string(),
    ];
    vnc_flags(&mut out, &spec.vnc);
    if let Some(bytes) = spec.storage_bytes {
        out.extend([s("--storage"), bytes.to_string()]);
    }
    // vk-cocoon supervises the VM: a guest reboot ends QEMU and the next create cold-boots it.
    out.extend([s("--exit-on-reboot"), s("--random-smbios"), s("--net"), s("cni")]);
    out.push(spec.image.clone());
    out
}

/// `vm start --vnc D --vnc-password P NAME`, or `vm start --vnc=-1 NAME` with VNC off: the record
/// keeps its display, and a CNI VM's display without a password would fail the launch.
pub fn start(name: &str, vnc: &Option<Vnc>) -> Vec<String> {
    let mut out = vec![s("vm"), s("start")];
    match vnc {
        Some(_) => vnc_flags(&mut out, vnc),
        None => out.push(s("--vnc=-1")),
    }
    out.push(s(name));
    out
}

pub fn inspect(name: &str) -> Vec<String> {
    vec![s("vm"), s("inspect"), s(name)]
}

pub fn rm(name: &str) -> Vec<String> {
    vec![s("vm"), s("rm"), s(name)]
}

pub fn image_inspect(image: &str) -> Vec<String> {
    vec![s("image"), s("inspect"), s(image)]
}

pub fn image_pull(image: &str) -> Vec<String> {
    vec![s("image"), s("pull"), s(image)]
}

/// The argv as logs may show it: the VNC password replaced.
pub fn redacted(args: &[String]) -> Vec<String> {
    let mut out = args.to_vec();
    for i in 1..out.len() {
        if out[i - 1] == "--vnc-password" {
            out[i] = "<redacted>".into();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> MacRunSpec {
        MacRunSpec {
            name: "mac-1".into(),
            image: "ghcr.io/cocoonstack/cocoon-macos/tahoe:26".into(),
            cpus: 4,
            memory_mib: 8192,
            vnc: None,
            storage_bytes: None,
        }
    }

    #[test]
    fn run_argv_without_vnc_or_storage() {
        assert_eq!(
            run(&spec()),
            [
                "vm",
                "run",
                "--name",
                "mac-1",
                "--cpus",
                "4",
                "--memory",
                "8192",
                "--exit-on-reboot",
                "--random-smbios",
                "--net",
                "cni",
                "ghcr.io/cocoonstack/cocoon-macos/tahoe:26"
            ]
        );
    }

    #[test]
    fn run_argv_with_vnc_and_storage_and_the_password_redacted() {
        let mut sp = spec();
        sp.vnc = Some(Vnc {
            display: 7,
            password: "s3cret".into(),
        });
        sp.storage_bytes = Some(107_374_182_400);
        let argv = run(&sp);
        assert_eq!(
            argv[8..14],
            ["--vnc", "7", "--vnc-password", "s3cret", "--storage", "107374182400"]
        );
        assert_eq!(argv.last().unwrap(), "ghcr.io/cocoonstack/cocoon-macos/tahoe:26");
        let shown = redacted(&argv);
        assert!(!shown.iter().any(|a| a.contains("s3cret")), "{shown:?}");
        assert!(!format!("{sp:?}").contains("s3cret"));
    }

    #[test]
    fn start_passes_the_vnc_flags_again() {
        assert_eq!(
            start("m", &None),
            ["vm", "start", "--vnc=-1", "m"],
            "VNC off: the display too"
        );
        let vnc = Some(Vnc {
            display: 3,
            password: "pw".into(),
        });
        assert_eq!(
            start("m", &vnc),
            ["vm", "start", "--vnc", "3", "--vnc-password", "pw", "m"]
        );
    }
}
