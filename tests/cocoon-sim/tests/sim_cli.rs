//! The simulator binary end to end: argv, JSON, error texts, exit codes, tar round trip, faults.

use cocoon_sim::{Flip, Sim};
use std::io::Write;
use std::process::{Command, Output, Stdio};

fn cocoon(sim: &Sim, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cocoon-sim"))
        .args(args)
        .env("COCOON_SIM_ROOT", sim.root())
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = stdin {
        let mut s = child.stdin.take().unwrap();
        s.write_all(input).unwrap();
    }
    child.wait_with_output().unwrap()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}, stderr {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn err(o: &Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(1),
        "stdout {}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8(o.stderr.clone()).unwrap()
}

#[test]
fn lifecycle_snapshot_round_trip_and_faults() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::new(dir.path()).unwrap();

    assert_eq!(ok(&cocoon(&sim, &["vm", "list", "-o", "json"], None)), "[]\n");
    assert_eq!(
        err(&cocoon(&sim, &["vm", "run", "--output", "json", "img"], None)),
        "Error: image \"img\" not resolved: not found in any backend\n"
    );
    ok(&cocoon(&sim, &["image", "pull", "img"], None));
    assert_eq!(
        err(&cocoon(&sim, &["vm", "clone", "--cpu", "2", "x"], None)),
        "Error: unknown flag: --cpu\n"
    );
    // cocoon's VM name rule, on every verb that names a VM.
    for verb in [&["vm", "run"][..], &["vm", "create"][..]] {
        let mut args = verb.to_vec();
        args.extend(["--name", "vk-$(touch x)", "img"]);
        assert_eq!(
            err(&cocoon(&sim, &args, None)),
            "Error: vm name \"vk-$(touch x)\" is invalid: must match ^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$ (max 63 chars)\n",
            "{args:?}"
        );
    }

    let out = ok(&cocoon(
        &sim,
        &[
            "vm",
            "run",
            "--output",
            "json",
            "--name",
            "a",
            "--memory=2147483648",
            "--cpu-weight",
            "79",
            "img",
        ],
        None,
    ));
    assert!(out.starts_with("{\n  \"id\": "), "2-space indented JSON: {out}");
    let vm: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(vm["state"], "running");
    assert_eq!(vm["config"]["name"], "a");
    assert_eq!(vm["config"]["memory"], 2147483648u64);
    assert_eq!(vm["config"]["cpu_weight"], 79);
    assert!(vm.get("name").is_none(), "no top-level name");
    assert!(vm["pid"].as_i64().unwrap() > 0);

    assert_eq!(
        err(&cocoon(&sim, &["vm", "inspect", "nope"], None)),
        "Error: inspect: vm nope: VM not found\n"
    );
    assert_eq!(
        err(&cocoon(&sim, &["vm", "rm", "nope"], None)),
        "Error: vm nope: VM not found\n"
    );

    sim.flip_vm("a", Flip::Stale).unwrap();
    let vm: serde_json::Value = serde_json::from_str(&ok(&cocoon(&sim, &["vm", "inspect", "a"], None))).unwrap();
    assert_eq!(vm["state"], "stopped (stale)");
    ok(&cocoon(&sim, &["vm", "start", "a"], None));

    assert_eq!(
        ok(&cocoon(&sim, &["snapshot", "list", "-o", "json"], None)),
        "No snapshots found.\n"
    );
    ok(&cocoon(&sim, &["snapshot", "save", "--name", "s1", "a"], None));
    let taken = err(&cocoon(&sim, &["snapshot", "save", "--name", "s1", "a"], None));
    assert!(
        taken.starts_with("Error: snapshot name \"s1\" already in use by "),
        "{taken}"
    );
    let rec: serde_json::Value =
        serde_json::from_str(&ok(&cocoon(&sim, &["snapshot", "inspect", "s1"], None))).unwrap();
    assert_eq!(rec["name"], "s1");
    assert_eq!(rec["hypervisor"], "cloud-hypervisor");

    let tar = cocoon(&sim, &["snapshot", "export", "s1", "-o", "-"], None);
    let tar = ok_bytes(&tar);
    assert!(tar.len() > 256 * 1024, "memory file is exported with real bytes");
    assert!(tar.len() < 8 << 20, "sparse COW disk is not expanded: {}", tar.len());
    ok(&cocoon(&sim, &["snapshot", "import", "--name", "s2"], Some(&tar)));
    let s1 = sim.snapshot_dir("s1").unwrap().unwrap();
    let s2 = sim.snapshot_dir("s2").unwrap().unwrap();
    for f in ["memory-ranges", "cow.raw", "config.json", "cocoon.json"] {
        assert_eq!(
            std::fs::read(s1.join(f)).unwrap(),
            std::fs::read(s2.join(f)).unwrap(),
            "{f}"
        );
    }
    assert!(
        !err(&cocoon(&sim, &["snapshot", "import"], Some(b"not a tar at all")))
            .trim_end()
            .is_empty()
    );

    assert_eq!(
        err(&cocoon(&sim, &["snapshot", "rm", "zzz"], None)),
        "Error: rm: resolve \"zzz\": snapshot not found\n"
    );
    assert_eq!(
        err(&cocoon(&sim, &["image", "inspect", "zzz"], None)),
        "Error: image \"zzz\": not found in any backend\n"
    );

    sim.inject_failure("vm list", 1, "Error: injected", 7).unwrap();
    let o = cocoon(&sim, &["vm", "list", "-o", "json"], None);
    assert_eq!(o.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&o.stderr), "Error: injected\n");
    ok(&cocoon(&sim, &["vm", "list", "-o", "json"], None));

    sim.on_exec(cocoon_sim::ExecRule {
        argv_prefix: vec!["false".into()],
        exit_code: 3,
        stderr: "nope\n".into(),
        ..Default::default()
    })
    .unwrap();
    let o = cocoon(&sim, &["vm", "exec", "-e", "A=1", "a", "--", "false", "x"], None);
    assert_eq!(o.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "nope\n",
        "no Error: line for a guest status"
    );
    let log = sim.exec_log().unwrap();
    assert_eq!(log.last().unwrap().argv, vec!["false", "x"]);
    assert_eq!(log.last().unwrap().env, vec!["A=1"]);

    // A command run for real never runs as root: the guest is this machine, and a guest's
    // post-clone fixups (/etc/hostname, systemd-networkd) must not reach the host.
    sim.on_exec(cocoon_sim::ExecRule {
        argv_prefix: vec!["id".into()],
        run: true,
        ..Default::default()
    })
    .unwrap();
    let uid = ok(&cocoon(&sim, &["vm", "exec", "a", "--", "id", "-u"], None));
    assert_ne!(uid.trim(), "0", "a guest command ran as root on the host");

    ok(&cocoon(&sim, &["vm", "rm", "--force", "a"], None));
    sim.set_settings(|s| s.legacy_empty_list = true).unwrap();
    assert_eq!(
        ok(&cocoon(&sim, &["vm", "list", "-o", "json"], None)),
        "No VMs found.\n"
    );
}

fn ok_bytes(o: &Output) -> Vec<u8> {
    assert!(o.status.success(), "stderr {}", String::from_utf8_lossy(&o.stderr));
    o.stdout.clone()
}

#[test]
fn concurrent_invocations_do_not_lose_updates() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::new(dir.path()).unwrap();
    sim.add_image("img", "oci").unwrap();
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let sim = sim.clone();
            std::thread::spawn(move || ok(&cocoon(&sim, &["vm", "run", "--name", &format!("v{i}"), "img"], None)))
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(sim.vm_count().unwrap(), 8);
}

// ---- cocoon-macos-sim ------------------------------------------------------------------------

fn macos(mac: &Sim, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cocoon-macos-sim"))
        .args(args)
        .env("COCOON_MACOS_HOME", mac.root())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn macos_run_inspect_start_and_rm_with_the_real_texts() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::new(dir.path()).unwrap();
    let mac = sim.macos().unwrap();
    let img = "ghcr.io/cocoonstack/cocoon-macos/tahoe:26";

    assert!(err(&macos(&mac, &["vm", "inspect", "m1"])).contains("read vm record: open"));
    assert!(err(&macos(&mac, &["vm", "inspect", "m1"])).contains("no such file or directory"));
    assert_eq!(
        err(&macos(&mac, &["image", "inspect", img])).trim(),
        format!("Error: image not found: {img}")
    );
    let run = [
        "vm", "run", "--name", "m1", "--cpus", "4", "--memory", "8192", "--vnc", "3",
    ];
    let cni = [&run[..], &["--net", "cni", img]].concat();
    assert!(
        err(&macos(&mac, &["vm", "run", "--name", "m1", img])).contains("not in the store"),
        "no image yet"
    );
    ok(&macos(&mac, &["image", "pull", img]));
    let inspected: serde_json::Value = serde_json::from_str(&ok(&macos(&mac, &["image", "inspect", img]))).unwrap();
    assert_eq!(inspected["type"], "cloudimg");
    let virtual_size = inspected["virtual_size"].as_u64().unwrap();

    assert!(err(&macos(&mac, &cni)).contains("--vnc-password is required"));
    let long = [&run[..], &["--net", "cni", "--vnc-password", "123456789", img]].concat();
    assert!(err(&macos(&mac, &long)).contains("at most 8 characters, got 9"));
    let small = [
        &run[..],
        &["--net", "cni", "--vnc-password", "pw", "--storage", "10Gi", img],
    ]
    .concat();
    assert!(err(&macos(&mac, &small)).contains(&format!("smaller than image virtual size {virtual_size} bytes")));
    assert!(mac.macos_vm("m1").unwrap().is_none(), "a refused run leaves nothing");

    let good = [
        &run[..],
        &[
            "--net",
            "cni",
            "--vnc-password",
            "pw",
            "--exit-on-reboot",
            "--random-smbios",
            img,
        ],
    ]
    .concat();
    let out = ok(&macos(&mac, &good));
    assert!(out.starts_with("m1 (pid "), "{out}");
    assert!(mac.macos_running("m1").unwrap());
    assert!(err(&macos(&mac, &good)).contains("vm \"m1\" already exists; rm it first"));
    let rec: serde_json::Value = serde_json::from_str(&ok(&macos(&mac, &["vm", "inspect", "m1"]))).unwrap();
    assert_eq!((rec["vnc"].as_i64(), rec["net_mode"].as_str()), (Some(3), Some("cni")));
    assert_eq!(rec["exit_on_reboot"], true);
    assert!(rec["mac"].as_str().unwrap().starts_with("52:54:00:"));
    assert!(rec["smbios"]["serial"].is_string());
    assert!(rec.get("vnc_password").is_none(), "the password is never persisted");

    // A second VM on the same display: the port is taken, the run fails and leaves nothing.
    let clash = [
        "vm",
        "run",
        "--name",
        "m2",
        "--vnc",
        "3",
        "--vnc-password",
        "pw",
        "--net",
        "cni",
        img,
    ];
    assert!(err(&macos(&mac, &clash)).contains("bind vnc port: listen tcp 0.0.0.0:5903: bind: address already in use"));
    assert!(mac.macos_vm("m2").unwrap().is_none());

    // The guest's sshd greets on its address; the display on the host address.
    let (_, ip) = mac.macos_guest("m1").unwrap().unwrap();
    let mut banner = [0u8; 8];
    std::io::Read::read_exact(
        &mut std::net::TcpStream::connect((ip.as_str(), 22)).unwrap(),
        &mut banner,
    )
    .unwrap();
    assert_eq!(&banner, b"SSH-2.0-");

    mac.macos_crash("m1").unwrap();
    assert!(!mac.macos_running("m1").unwrap(), "dead, record kept");
    let out = ok(&macos(
        &mac,
        &["vm", "start", "--vnc", "3", "--vnc-password", "pw", "m1"],
    ));
    assert!(out.starts_with("m1 (pid "), "{out}");
    assert!(mac.macos_running("m1").unwrap());

    assert_eq!(
        ok(&macos(&mac, &["vm", "rm", "m1", "never-was"])),
        "m1\nnever-was\n",
        "absent is not an error"
    );
    assert!(mac.macos_vm("m1").unwrap().is_none());

    // Faults use the cocoon simulator's rules.
    mac.inject_failure("vm inspect", 1, "Error: boom", 1).unwrap();
    assert_eq!(err(&macos(&mac, &["vm", "inspect", "m1"])).trim(), "Error: boom");
    assert!(mac.calls().unwrap().iter().any(|c| c.verb == "vm run"));
}

#[test]
fn version_reports_the_build_and_an_old_one_answers_like_one() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::new(dir.path()).unwrap();
    let out = ok(&cocoon(&sim, &["version"], None));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    assert_eq!(lines[0], "Version:        v0.6.2");
    for (line, key) in lines
        .iter()
        .zip(["Version:", "Git hash:", "Built:", "Golang version:", "OS/Arch:"])
    {
        assert!(line.starts_with(key), "{out}");
    }
    let known = ok(&cocoon(
        &sim,
        &["vm", "reconcile-stale-create", "x", "-o", "json"],
        None,
    ));
    assert!(
        known.contains("\"outcome\": \"not-found\""),
        "a current build knows the verb: {known}"
    );

    // An old build: the version it says, and cobra's answers to what it does not have.
    sim.set_settings(|s| s.version = "v0.5.7".into()).unwrap();
    assert!(ok(&cocoon(&sim, &["version"], None)).starts_with("Version:        v0.5.7\n"));
    assert_eq!(
        err(&cocoon(
            &sim,
            &["vm", "reconcile-stale-create", "x", "-o", "json"],
            None
        )),
        "Error: unknown command \"reconcile-stale-create\" for \"cocoon vm\"\n"
    );
    assert_eq!(
        err(&cocoon(&sim, &["vm", "clone", "--restore-mode", "mmap", "snap"], None)),
        "Error: unknown flag: --restore-mode\n"
    );
    assert_eq!(
        err(&cocoon(&sim, &["vm", "clone", "--pull", "--from-dir=/tmp/x"], None)),
        "Error: unknown flag: --from-dir\n"
    );
    // What it has still works; an unnumbered build (no ldflags) is not old.
    assert_eq!(ok(&cocoon(&sim, &["vm", "list", "-o", "json"], None)), "[]\n");
    sim.set_settings(|s| s.version = "unknown".into()).unwrap();
    assert!(ok(&cocoon(&sim, &["version"], None)).starts_with("Version:        unknown\n"));
    let exec = cocoon(&sim, &["vm", "exec", "x", "--", "true"], None);
    let stderr = String::from_utf8_lossy(&exec.stderr);
    assert!(!stderr.contains("unknown command") && !stderr.is_empty(), "{stderr}");
}

/// A `snapshot save` killed after writing its data leaves a pending record that still holds the
/// name (a new save under it is refused) and that `snapshot list` does not show; cocoon's
/// `snapshot rm` removes such a record by name, after which the name can be saved again.
#[test]
fn a_save_that_died_holds_its_name_until_its_pending_record_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::new(dir.path()).unwrap();
    ok(&cocoon(&sim, &["image", "pull", "img"], None));
    ok(&cocoon(&sim, &["vm", "run", "--name", "a", "img"], None));
    sim.add_fault(cocoon_sim::Fault {
        verb: "snapshot save".into(),
        match_arg: None,
        times: Some(1),
        action: cocoon_sim::FaultAction::Die { after_bytes: 0 },
    })
    .unwrap();
    let died = cocoon(&sim, &["snapshot", "save", "--name", "s1", "a"], None);
    assert!(!died.status.success(), "the save was killed");
    assert_eq!(
        ok(&cocoon(&sim, &["snapshot", "list", "-o", "json"], None)),
        "No snapshots found.\n",
        "a pending record is not listed"
    );
    let taken = err(&cocoon(&sim, &["snapshot", "save", "--name", "s1", "a"], None));
    assert!(taken.contains("already in use by"), "{taken}");
    ok(&cocoon(&sim, &["snapshot", "rm", "s1"], None));
    ok(&cocoon(&sim, &["snapshot", "save", "--name", "s1", "a"], None));
    let rec: serde_json::Value =
        serde_json::from_str(&ok(&cocoon(&sim, &["snapshot", "inspect", "s1"], None))).unwrap();
    assert_eq!(rec["name"], "s1");
}
