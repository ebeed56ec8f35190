//! Every verb of the cocoon runtime client against the simulator.

use crate::runtime_support;

use cocoon_sim::{ExecRule, Flip};
use runtime_support::harness;
use std::io::Cursor;
use vk_cocoon::runtime::*;

const IMG: &str = "ghcr.io/cocoonstack/cocoon/ubuntu:24.04";

fn run_spec(name: &str) -> RunSpec {
    RunSpec {
        name: Some(name.into()),
        cpu: Some(2),
        cpu_policy: CpuPolicy {
            weight: 20,
            quota_us: 200_000,
            period_us: 100_000,
        },
        memory: Some("1Gi".into()),
        storage: Some("20Gi".into()),
        network: Some("cocoon".into()),
        image: IMG.into(),
        ..Default::default()
    }
}

fn last_argv(h: &runtime_support::Harness, verb: &str) -> Vec<String> {
    h.sim
        .calls()
        .unwrap()
        .into_iter()
        .rev()
        .find(|c| c.verb == verb)
        .expect(verb)
        .argv
}

#[tokio::test]
async fn run_inspect_list_start_remove() {
    let h = harness();
    let c = &h.client;
    assert!(c.list().await.unwrap().is_empty());
    assert!(matches!(
        c.image_inspect(IMG).await,
        Err(RuntimeError::ImageNotFound { .. })
    ));
    c.image_pull(IMG, false).await.unwrap();
    assert_eq!(c.image_inspect(IMG).await.unwrap().kind, "oci");

    let vm = c.run(&run_spec("vk-default-demo-0")).await.unwrap();
    assert_eq!(vm.name(), "vk-default-demo-0");
    assert_eq!(vm.state, VmState::Running);
    assert!(vm.pid > 0);
    assert_eq!(vm.config.memory, 1 << 30);
    assert!(vm.primary_ip().is_some() && vm.primary_mac().is_some());
    assert_eq!(
        last_argv(&h, "vm run").join(" "),
        format!(
            "vm run --output json --name vk-default-demo-0 --cpu 2 --cpu-weight 20 --cpu-quota-us 200000 --cpu-period-us 100000 --memory 1073741824 --storage 21474836480 --network cocoon {IMG}"
        )
    );

    let by_name = c.inspect("vk-default-demo-0").await.unwrap();
    assert_eq!(by_name.id, vm.id);
    assert_eq!(
        c.inspect(&vm.id[..5]).await.unwrap().id,
        vm.id,
        "unique ID prefix resolves"
    );
    let list = c.list().await.unwrap();
    assert_eq!(list.len(), 1);

    h.sim.flip_vm(&vm.id, Flip::Stopped).unwrap();
    assert_eq!(c.inspect(&vm.id).await.unwrap().state, VmState::Stopped);
    c.start(&vm.id).await.unwrap();
    assert_eq!(c.inspect(&vm.id).await.unwrap().state, VmState::Running);

    h.sim.flip_vm(&vm.id, Flip::Stale).unwrap();
    assert_eq!(c.inspect(&vm.id).await.unwrap().state, VmState::StoppedStale);

    c.remove(&vm.id).await.unwrap();
    assert!(c.inspect(&vm.id).await.unwrap_err().is_vm_not_found());
    c.remove(&vm.id).await.expect("removing an absent VM is success");
    assert_eq!(last_argv(&h, "vm rm"), vec!["vm", "rm", "--force", vm.id.as_str()]);
}

#[tokio::test]
async fn old_list_text_and_fc_windows_validation() {
    let h = harness();
    h.sim.set_settings(|s| s.legacy_empty_list = true).unwrap();
    assert!(
        h.client.list().await.unwrap().is_empty(),
        "`No VMs found.` means an empty list"
    );
    h.sim.add_image(IMG, "oci").unwrap();
    let mut spec = run_spec("fc-vm");
    spec.backend = Backend::Firecracker;
    let vm = h.client.run(&spec).await.unwrap();
    assert_eq!(vm.hypervisor, vk_cocoon::hypervisor::Hypervisor::Firecracker);
    spec.windows = true;
    spec.name = Some("bad".into());
    let e = h.client.run(&spec).await.unwrap_err();
    assert!(
        matches!(&e, RuntimeError::Command { stderr, .. } if stderr.contains("--fc and --windows")),
        "{e}"
    );
}

#[tokio::test]
async fn clone_from_snapshot_and_from_dir() {
    let h = harness();
    let c = &h.client;
    c.image_pull(IMG, false).await.unwrap();
    let src = c.run(&run_spec("src")).await.unwrap();
    c.snapshot_save("src", &src.id).await.unwrap();
    assert_eq!(
        last_argv(&h, "snapshot save"),
        vec!["snapshot", "save", "--name", "src", src.id.as_str()]
    );

    let spec = CloneSpec {
        name: Some("clone-1".into()),
        network: None,
        no_direct_io: false,
        pull: true,
        restore_mode: Some(RestoreMode::Mmap),
        nics: Some(2),
        cpu_policy: CpuPolicy {
            weight: 39,
            ..Default::default()
        },
        backend: Backend::CloudHypervisor,
        source: CloneSource::Snapshot("src".into()),
    };
    let vm = c.clone_vm(&spec).await.unwrap();
    assert_eq!(vm.state, VmState::Running);
    assert_eq!(vm.network_configs.len(), 2);
    assert_eq!(vm.config.memory, 1 << 30, "topology comes from the snapshot");
    assert_eq!(
        last_argv(&h, "vm clone").join(" "),
        "vm clone --output json --name clone-1 --pull --restore-mode mmap --nics 2 --cpu-weight 39 src"
    );

    let missing = CloneSpec {
        name: Some("x".into()),
        source: CloneSource::Snapshot("nope".into()),
        ..spec.clone()
    };
    assert!(c.clone_vm(&missing).await.unwrap_err().is_snapshot_not_found());

    let stage = h.dir.path().join("stage");
    c.snapshot_export_to_dir("src", &stage).await.unwrap();
    assert!(stage.join("snapshot.json").exists() && stage.join("cow.raw").exists());
    let from_dir = CloneSpec {
        name: Some("clone-2".into()),
        pull: false,
        source: CloneSource::Dir(stage.display().to_string()),
        ..spec
    };
    let vm2 = c.clone_vm(&from_dir).await.unwrap();
    assert_eq!(vm2.name(), "clone-2");
    assert!(
        last_argv(&h, "vm clone").contains(&"--pull".to_string()),
        "--pull is forced for --from-dir"
    );
    let again = c.snapshot_export_to_dir("src", &stage).await.unwrap_err();
    assert!(again.stderr().unwrap().contains("is not empty"), "{again}");
}

#[tokio::test]
async fn snapshot_save_replaces_a_held_name() {
    let h = harness();
    let c = &h.client;
    c.image_pull(IMG, false).await.unwrap();
    let vm = c.run(&run_spec("a")).await.unwrap();
    c.snapshot_save("a", &vm.id).await.unwrap();
    let first = c.snapshot_inspect("a").await.unwrap();
    c.snapshot_save("a", &vm.id).await.unwrap();
    let second = c.snapshot_inspect("a").await.unwrap();
    assert_ne!(
        first.id, second.id,
        "the holder was removed and the snapshot saved again"
    );
    let rms: Vec<_> = h
        .sim
        .calls()
        .unwrap()
        .into_iter()
        .filter(|c| c.verb == "snapshot rm")
        .collect();
    assert_eq!(
        rms.last().unwrap().argv,
        vec!["snapshot", "rm", first.id.as_str()],
        "rm targets the holder ID"
    );
    assert_eq!(c.snapshot_list(None).await.unwrap().len(), 1);
    assert_eq!(c.snapshot_list(Some("a")).await.unwrap().len(), 1);
    c.snapshot_remove_if_exists("a").await.unwrap();
    c.snapshot_remove_if_exists("a").await.expect("absent is success");
    assert!(c.snapshot_list(None).await.unwrap().is_empty());
    assert!(c.snapshot_inspect("a").await.unwrap_err().is_snapshot_not_found());
}

#[tokio::test]
async fn snapshot_rm_waits_for_an_active_export() {
    let h = harness();
    let c = &h.client;
    h.sim.set_settings(|s| s.snapshot_memory_bytes = 8 << 20).unwrap();
    c.image_pull(IMG, false).await.unwrap();
    let vm = c.run(&run_spec("a")).await.unwrap();
    c.snapshot_save("a", &vm.id).await.unwrap();
    // An export that nobody reads blocks on its pipe while holding the lease.
    let export = c.snapshot_export("a").await.unwrap();
    runtime_support::eventually(10, "the export holds the lease", || h.sim.snapshot_leased("a").unwrap()).await;
    let removals = || {
        h.sim
            .calls()
            .unwrap()
            .iter()
            .filter(|c| c.verb == "snapshot rm")
            .count()
    };
    let before = removals();
    let c2 = c.clone();
    let id = vm.id.clone();
    let save = tokio::spawn(async move { c2.snapshot_save("a", &id).await });
    // The save found the name taken and tried to remove the holder, which the lease refused.
    runtime_support::eventually(20, "the save tried to remove the leased holder", || removals() > before).await;
    assert!(!save.is_finished(), "save must wait while the holder is leased");
    drop(export); // kills the export, releasing the lease
    save.await.unwrap().expect("save succeeds once the lease is gone");

    // With a short budget the in-use error surfaces.
    let short = runtime_support::harness_with(|cfg| {
        cfg.busy_retry = BusyRetry {
            interval: std::time::Duration::from_millis(50),
            budget: std::time::Duration::from_millis(200),
        }
    });
    let short_client = CocoonCli::new(CocoonCliConfig {
        env: vec![h.sim.env()],
        ..short.client.config().clone()
    });
    let export = c.snapshot_export("a").await.unwrap();
    runtime_support::eventually(10, "the export holds the lease", || h.sim.snapshot_leased("a").unwrap()).await;
    let e = short_client.snapshot_remove_if_exists("a").await.unwrap_err();
    assert!(matches!(e, RuntimeError::SnapshotInUse { .. }), "{e}");
    drop(export);
}

#[tokio::test]
async fn export_import_round_trip_streams_real_bytes() {
    let h = harness();
    let c = &h.client;
    h.sim
        .set_settings(|s| {
            s.snapshot_memory_bytes = 3 << 20;
            s.snapshot_cow_bytes = 256 << 20;
        })
        .unwrap();
    c.image_pull(IMG, false).await.unwrap();
    let vm = c.run(&run_spec("a")).await.unwrap();
    c.snapshot_save("a", &vm.id).await.unwrap();

    let mut tar = Vec::new();
    let n = copy_export(c.snapshot_export("a").await.unwrap(), &mut tar)
        .await
        .unwrap();
    assert_eq!(n as usize, tar.len());
    assert!(
        tar.len() > 3 << 20 && tar.len() < 8 << 20,
        "memory dense, COW sparse: {}",
        tar.len()
    );
    assert_eq!(&tar[..13], b"snapshot.json", "envelope first");

    c.snapshot_import("copy", &mut Cursor::new(tar.clone())).await.unwrap();
    let rec = c.snapshot_inspect("copy").await.unwrap();
    let orig = c.snapshot_inspect("a").await.unwrap();
    assert_ne!(rec.id, orig.id, "import always generates a new ID");
    assert_eq!(rec.image, orig.image);
    let (d1, d2) = (
        h.sim.snapshot_dir("a").unwrap().unwrap(),
        h.sim.snapshot_dir("copy").unwrap().unwrap(),
    );
    for f in ["memory-ranges", "cow.raw", "state.json"] {
        assert_eq!(
            std::fs::read(d1.join(f)).unwrap(),
            std::fs::read(d2.join(f)).unwrap(),
            "{f}"
        );
    }
    // Importing over an existing name replaces it.
    c.snapshot_import("copy", &mut Cursor::new(tar)).await.unwrap();
    assert_ne!(c.snapshot_inspect("copy").await.unwrap().id, rec.id);
    assert_eq!(c.snapshot_list(None).await.unwrap().len(), 2);
}

#[tokio::test]
async fn export_failures_are_typed_and_never_a_clean_eof() {
    let h = harness();
    let c = &h.client;
    h.sim.set_settings(|s| s.snapshot_memory_bytes = 2 << 20).unwrap();
    c.image_pull(IMG, false).await.unwrap();
    let vm = c.run(&run_spec("a")).await.unwrap();
    c.snapshot_save("a", &vm.id).await.unwrap();

    let mut sink = Vec::new();
    let e = copy_export(c.snapshot_export("missing").await.unwrap(), &mut sink)
        .await
        .unwrap_err();
    assert!(e.is_snapshot_not_found(), "{e}");

    h.sim.die_next("snapshot export", 100_000).unwrap();
    let mut sink = Vec::new();
    let e = copy_export(c.snapshot_export("a").await.unwrap(), &mut sink)
        .await
        .unwrap_err();
    assert!(
        matches!(e, RuntimeError::Command { code: None, .. }),
        "killed mid-stream: {e}"
    );
    assert!(sink.len() <= 100_000);
}

#[tokio::test]
async fn import_failures() {
    let h = harness();
    let c = &h.client;
    let e = c
        .snapshot_import("x", &mut Cursor::new(b"definitely not a tar archive".repeat(100)))
        .await
        .unwrap_err();
    assert!(matches!(&e, RuntimeError::Command { .. }), "{e}");
    assert!(c.snapshot_inspect("x").await.unwrap_err().is_snapshot_not_found());

    struct Broken(usize);
    impl tokio::io::AsyncRead for Broken {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            if self.0 == 0 {
                return std::task::Poll::Ready(Err(std::io::Error::other("registry connection reset")));
            }
            self.0 -= 1;
            buf.put_slice(&[0u8; 512]);
            std::task::Poll::Ready(Ok(()))
        }
    }
    let e = c.snapshot_import("y", &mut Broken(0)).await.unwrap_err();
    assert!(
        matches!(&e, RuntimeError::Io { .. }) && e.to_string().contains("registry connection reset"),
        "{e}"
    );
    assert!(
        c.snapshot_list(None).await.unwrap().is_empty(),
        "nothing registered from a broken stream"
    );
}

#[tokio::test]
async fn image_import_streams_stdin() {
    let h = harness();
    let mut qcow = b"QFI\xfb".to_vec();
    qcow.extend(std::iter::repeat_n(7u8, 3 << 20));
    h.client
        .image_import("win11", &mut Cursor::new(qcow.clone()))
        .await
        .unwrap();
    let rec = h.client.image_inspect("win11").await.unwrap();
    assert_eq!(rec.kind, "cloudimg");
    assert_eq!(rec.size, qcow.len() as u64);
    let e = h
        .client
        .image_import("junk", &mut Cursor::new(vec![1u8; 1000]))
        .await
        .unwrap_err();
    assert!(e.stderr().unwrap().contains("unrecognized image format"), "{e}");
}

#[tokio::test]
async fn exec_logs_net_and_stale_create() {
    let h = harness();
    let c = &h.client;
    c.image_pull(IMG, false).await.unwrap();
    let vm = c.run(&run_spec("a")).await.unwrap();

    let mut spec = ExecSpec {
        argv: vec!["cat".into()],
        ..Default::default()
    };
    spec.env.insert("Z".into(), "1".into());
    spec.env.insert("A".into(), "2".into());
    let out = c.exec_capture("a", &spec, Some(b"hello")).await.unwrap();
    assert_eq!((out.code, out.stdout.as_slice()), (0, &b"hello"[..]));
    let rec = h.sim.exec_log().unwrap().pop().unwrap();
    assert_eq!(
        (rec.argv, rec.env, rec.interactive, rec.stdin.as_str()),
        (
            vec!["cat".to_string()],
            vec!["A=2".to_string(), "Z=1".to_string()],
            true,
            "hello"
        )
    );

    h.sim
        .on_exec(ExecRule {
            argv_prefix: vec!["sh".into()],
            exit_code: 3,
            stdout: "partial".into(),
            stderr: "bad\n".into(),
            times: Some(1),
            ..Default::default()
        })
        .unwrap();
    let sh = ExecSpec {
        argv: vec!["sh".into(), "-c".into(), "exit 3".into()],
        ..Default::default()
    };
    let out = c.exec_capture("a", &sh, None).await.unwrap();
    assert_eq!(
        (out.code, out.stdout.as_slice(), out.stderr.as_slice()),
        (3, &b"partial"[..], &b"bad\n"[..])
    );
    assert!(
        !h.sim.exec_log().unwrap().pop().unwrap().interactive,
        "-i only with stdin"
    );
    let mut o = Vec::new();
    let mut e = Vec::new();
    h.sim
        .on_exec(ExecRule {
            exit_code: 5,
            times: Some(1),
            ..Default::default()
        })
        .unwrap();
    let err = c
        .exec(
            "a",
            &sh,
            ExecIo {
                stdin: None,
                stdout: &mut o,
                stderr: &mut e,
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RuntimeError::ExecExit { code: 5 }), "{err}");
    assert!(c.exec_capture("nope", &sh, None).await.unwrap_err().is_vm_not_found());
    h.sim.flip_vm("a", Flip::Stopped).unwrap();
    let err = c.exec_capture("a", &sh, None).await.unwrap_err();
    assert!(
        matches!(&err, RuntimeError::Command { stderr, .. } if stderr.contains("VM not running")),
        "transport failure, not an exit code: {err}"
    );
    c.start("a").await.unwrap();

    let logs = c.logs("a", Some(1)).await.unwrap();
    assert_eq!(logs.lines().count(), 1);
    assert!(logs.contains("running"), "{logs}");
    assert!(c.logs("a", None).await.unwrap().lines().count() >= 3);

    c.net_resize("a", 0).await.unwrap();
    assert!(c.inspect("a").await.unwrap().network_configs.is_empty());
    c.net_resize("a", 2).await.unwrap();
    assert_eq!(c.inspect("a").await.unwrap().network_configs.len(), 2);

    assert_eq!(
        c.reconcile_stale_create(&vm.id).await.unwrap(),
        StaleCreateOutcome::NotCreating
    );
    h.sim.die_next("vm run", 0).unwrap();
    let e = c.run(&run_spec("dies")).await.unwrap_err();
    assert!(e.is_inconclusive(), "{e}");
    assert_eq!(h.sim.vm_state("dies").unwrap().as_deref(), Some("creating"));
    assert!(matches!(c.inspect("dies").await.unwrap().state, VmState::Creating));
    assert_eq!(
        c.reconcile_stale_create("dies").await.unwrap(),
        StaleCreateOutcome::Collected
    );
    assert_eq!(
        c.reconcile_stale_create("dies").await.unwrap(),
        StaleCreateOutcome::NotFound
    );
}
