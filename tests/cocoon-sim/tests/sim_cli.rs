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
