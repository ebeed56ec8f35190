//! Fault injection and settings: `<root>/control.json` (format in `tests/cocoon-sim/README.md`).

use crate::store::{Store, write_atomic};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Control {
    #[serde(default)]
    pub faults: Vec<Fault>,
    #[serde(default)]
    pub exec: Vec<ExecRule>,
    #[serde(default)]
    pub settings: Settings,
    /// A staged crash of the caller (see [`Crash`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash: Option<Crash>,
}

/// A crash of the daemon staged at a cocoon call: the invocations counted since it was staged
/// (every verb but the `vm status` event stream, whose timing is not the daemon's steps) run
/// normally up to the `after`-th; with `inside` that one does its work and then parks instead of
/// answering; every later one parks before doing anything. A parked invocation waits, changing
/// nothing, until it is killed (the crashed daemon's children die with it) or the crash is
/// cleared (it then kills itself): what it would have done never happens, as after a real crash.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Crash {
    pub after: u64,
    #[serde(default)]
    pub inside: bool,
    /// Counted invocations so far.
    #[serde(default)]
    pub seen: u64,
}

/// What a counted invocation does under a staged crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashStep {
    /// Runs normally (the `n`-th counted call).
    Run(u64),
    /// Does its work, then parks before answering.
    RunThenPark(u64),
    /// Parks before doing anything.
    Park(u64),
}

/// One fault rule: applies to invocations of `verb` (e.g. `"vm inspect"`, `"snapshot export"`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Fault {
    pub verb: String,
    /// Only invocations whose argv contains this exact element (e.g. a VM name) match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_arg: Option<String>,
    /// How many more invocations this rule applies to; `None` = forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u32>,
    pub action: FaultAction,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum FaultAction {
    /// Print `stdout` and `stderr` (verbatim; a newline is added to a non-empty stderr if missing) and exit with
    /// `exit_code`; nothing else happens. With exit code 0 this fakes an output (e.g. an old-format reply).
    Fail {
        #[serde(default)]
        stdout: String,
        stderr: String,
        exit_code: i32,
    },
    /// Sleep this long, then run the verb normally.
    Delay { ms: u64 },
    /// Kill the process with SIGKILL mid-operation: `vm run/clone` after the `creating` record is written,
    /// `snapshot export` after `after_bytes` bytes of tar, `snapshot import` / `image import` after reading
    /// `after_bytes` of input, `snapshot save` after the data is written but before it is registered;
    /// any other verb immediately.
    Die {
        #[serde(default)]
        after_bytes: u64,
    },
}

/// What `vm exec` answers for a matching command (first match wins).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExecRule {
    /// VM name or ID; `None` = any VM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<String>,
    /// The command's argv must start with these elements (empty = any command).
    #[serde(default)]
    pub argv_prefix: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u32>,
    #[serde(default)]
    pub exit_code: i32,
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    /// Run the command for real instead (the simulator's machine is the guest): stdin (with
    /// `-i`), stdout, stderr and the exit status are the child's, streamed as they come; the
    /// child dies with this `vm exec` process, as the agent's command does when cocoon's vsock
    /// connection goes. `exit_code` / `stdout` / `stderr` are then unused.
    #[serde(default)]
    pub run: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Settings {
    /// How long `vm run` / `vm clone` keep the VM in `creating` before it turns `running`.
    #[serde(default)]
    pub create_delay_ms: u64,
    /// Print the old text `No VMs found.` for an empty `vm list -o json` instead of `[]`.
    #[serde(default)]
    pub legacy_empty_list: bool,
    /// How often `vm status --event` re-reads the state.
    #[serde(default = "default_poll")]
    pub event_poll_ms: u64,
    /// Guest RAM file size of new snapshots (written with real pseudo-random bytes).
    #[serde(default = "default_memory")]
    pub snapshot_memory_bytes: u64,
    /// Share (percent) of the guest RAM file's 4 KiB pages that are all zero — pages the guest never
    /// touched. 0 with [`Self::snapshot_memory_text_pct`] 0 (the default) makes the whole file
    /// incompressible pseudo-random bytes; a realistic guest mix makes compression figures mean something.
    #[serde(default)]
    pub snapshot_memory_zero_pct: u8,
    /// Share (percent) of its pages holding text-like bytes (words and spaces: page cache of logs,
    /// configuration, source); the pages neither zero nor text are pseudo-random.
    #[serde(default)]
    pub snapshot_memory_text_pct: u8,
    /// Apparent size of the (sparse) COW disk of new snapshots.
    #[serde(default = "default_cow")]
    pub snapshot_cow_bytes: u64,
    /// Bytes of real data in the COW disk (two extents: at 0 and in the middle).
    #[serde(default = "default_cow_data")]
    pub snapshot_cow_data_bytes: u64,
    /// First two octets of the static NIC addresses (`<subnet>.x.y/16`). On loopback by default
    /// (`127.88`): a daemon's real TCP and ICMP probes reach "the guest" and never leave the
    /// machine. Anything else only when a test or a user sets it.
    #[serde(default = "default_subnet")]
    pub static_subnet: String,
    /// Memory each running VM's VMM process touches (its real RSS grows by it).
    #[serde(default)]
    pub vm_rss_bytes: u64,
    /// Bytes of data written at the start of a new VM's COW disk (its allocated size).
    #[serde(default = "default_vm_cow_data")]
    pub vm_cow_data_bytes: u64,
    /// Bytes of frames a VMM sends on its TAP at start (root only: the TAP lives in a network
    /// namespace of the VMM's own).
    #[serde(default)]
    pub vm_net_tx_bytes: u64,
    /// TCP ports each running VM with a static IP serves on that IP, as a guest's web server
    /// would: `GET` answers who it is, `POST` echoes its body (for port-forward).
    #[serde(default)]
    pub guest_http_ports: Vec<u16>,
    /// A Windows guest's serial console accepts connections but never answers (a hung guest):
    /// the Special Administration Console cannot be reached.
    #[serde(default)]
    pub console_silent: bool,
    /// cocoon-macos: the virtual size (bytes) of an image `image pull` stores; `vm run --storage`
    /// below it is refused as the real CLI refuses a shrink.
    #[serde(default = "default_macos_virtual_size")]
    pub macos_image_virtual_size: u64,
    /// cocoon-macos: whether a running guest's sshd answers on `<guest ip>:22` with an `SSH-` banner
    /// (off: the port is closed, as while macOS is still booting).
    #[serde(default = "default_true")]
    pub macos_sshd: bool,
    /// cocoon-macos: `vm inspect` shows no `mac` / `tap` yet (a record inspected before its NIC
    /// was attached), until cleared.
    #[serde(default)]
    pub macos_mac_pending: bool,
    /// What `cocoon version` reports as `Version:` (cocoon's `git describe --tags` of the build,
    /// `unknown` for a build without ldflags). Set an old one to play a cocoon that predates
    /// the verbs and flags the daemon uses.
    #[serde(default = "default_version")]
    pub version: String,
}

fn default_macos_virtual_size() -> u64 {
    100 << 30
}

fn default_true() -> bool {
    true
}

/// A cocoon release with every verb and flag the simulator answers.
pub const SIM_VERSION: &str = "v0.6.2";

fn default_version() -> String {
    SIM_VERSION.into()
}

fn default_vm_cow_data() -> u64 {
    64 * 1024
}

fn default_poll() -> u64 {
    100
}
fn default_memory() -> u64 {
    256 * 1024
}
fn default_cow() -> u64 {
    64 << 20
}
fn default_cow_data() -> u64 {
    128 * 1024
}
fn default_subnet() -> String {
    "127.88".into()
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            create_delay_ms: 0,
            legacy_empty_list: false,
            event_poll_ms: default_poll(),
            snapshot_memory_bytes: default_memory(),
            snapshot_memory_zero_pct: 0,
            snapshot_memory_text_pct: 0,
            snapshot_cow_bytes: default_cow(),
            snapshot_cow_data_bytes: default_cow_data(),
            static_subnet: default_subnet(),
            vm_rss_bytes: 0,
            vm_cow_data_bytes: default_vm_cow_data(),
            vm_net_tx_bytes: 0,
            guest_http_ports: Vec::new(),
            console_silent: false,
            macos_image_virtual_size: default_macos_virtual_size(),
            macos_sshd: true,
            macos_mac_pending: false,
            version: default_version(),
        }
    }
}

impl Control {
    fn path(store: &Store) -> std::path::PathBuf {
        store.path("control.json")
    }

    pub(crate) fn load_unlocked(store: &Store) -> std::io::Result<Control> {
        match std::fs::read(Self::path(store)) {
            Ok(b) if b.is_empty() => Ok(Control::default()),
            Ok(b) => serde_json::from_slice(&b).map_err(|e| std::io::Error::other(format!("control.json: {e}"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Control::default()),
            Err(e) => Err(e),
        }
    }

    pub fn load(store: &Store) -> std::io::Result<Control> {
        let _g = store.lock()?;
        Self::load_unlocked(store)
    }

    /// Read-modify-write of the control file under the state lock.
    pub fn update<R>(store: &Store, f: impl FnOnce(&mut Control) -> R) -> std::io::Result<R> {
        let _g = store.lock()?;
        let mut c = Self::load_unlocked(store)?;
        let r = f(&mut c);
        write_atomic(
            &Self::path(store),
            &serde_json::to_vec_pretty(&c).map_err(std::io::Error::other)?,
        )?;
        Ok(r)
    }

    /// Finds the first fault rule for this invocation and consumes one use of it.
    pub fn take_fault(store: &Store, verb: &str, argv: &[String]) -> std::io::Result<Option<FaultAction>> {
        if !Self::path(store).exists() {
            return Ok(None);
        }
        Self::update(store, |c| {
            let idx = c.faults.iter().position(|f| {
                f.verb == verb && f.times != Some(0) && f.match_arg.as_ref().is_none_or(|a| argv.iter().any(|x| x == a))
            })?;
            let fault = &mut c.faults[idx];
            let action = fault.action.clone();
            if let Some(t) = fault.times.as_mut() {
                *t -= 1;
                if *t == 0 {
                    c.faults.remove(idx);
                }
            }
            Some(action)
        })
    }

    /// Counts this invocation against a staged crash and says what it does; `None` when no crash
    /// is staged.
    pub fn crash_step(store: &Store) -> std::io::Result<Option<CrashStep>> {
        if !Self::path(store).exists() {
            return Ok(None);
        }
        Self::update(store, |c| {
            let crash = c.crash.as_mut()?;
            crash.seen += 1;
            let n = crash.seen;
            Some(match (n.cmp(&crash.after), crash.inside) {
                (std::cmp::Ordering::Less, _) | (std::cmp::Ordering::Equal, false) => CrashStep::Run(n),
                (std::cmp::Ordering::Equal, true) => CrashStep::RunThenPark(n),
                (std::cmp::Ordering::Greater, _) => CrashStep::Park(n),
            })
        })
    }

    /// Whether a crash is still staged (a parked invocation polls it).
    pub fn crash_staged(store: &Store) -> bool {
        Self::load(store).map(|c| c.crash.is_some()).unwrap_or(false)
    }

    /// Finds the exec rule for a command on a VM and consumes one use of it.
    pub fn take_exec(store: &Store, vm_id: &str, vm_name: &str, argv: &[String]) -> std::io::Result<Option<ExecRule>> {
        if !Self::path(store).exists() {
            return Ok(None);
        }
        Self::update(store, |c| {
            let idx = c.exec.iter().position(|r| {
                r.times != Some(0)
                    && r.vm.as_ref().is_none_or(|v| v == vm_id || v == vm_name)
                    && argv.len() >= r.argv_prefix.len()
                    && argv.iter().zip(&r.argv_prefix).all(|(a, b)| a == b)
            })?;
            let rule = c.exec[idx].clone();
            if let Some(t) = c.exec[idx].times.as_mut() {
                *t -= 1;
                if *t == 0 {
                    c.exec.remove(idx);
                }
            }
            Some(rule)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(after: u64, inside: bool, calls: usize) -> Vec<CrashStep> {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        Control::update(&store, |c| c.crash = Some(Crash { after, inside, seen: 0 })).unwrap();
        (0..calls)
            .map(|_| Control::crash_step(&store).unwrap().unwrap())
            .collect()
    }

    #[test]
    fn a_staged_crash_runs_the_first_calls_then_parks_the_rest() {
        use CrashStep::*;
        assert_eq!(steps(2, false, 4), vec![Run(1), Run(2), Park(3), Park(4)]);
        assert_eq!(steps(2, true, 4), vec![Run(1), RunThenPark(2), Park(3), Park(4)]);
        assert_eq!(steps(0, false, 2), vec![Park(1), Park(2)]);
    }

    #[test]
    fn without_a_staged_crash_nothing_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        assert_eq!(Control::crash_step(&store).unwrap(), None);
        Control::update(&store, |c| c.settings.event_poll_ms = 50).unwrap();
        assert_eq!(Control::crash_step(&store).unwrap(), None);
    }
}
