//! Every post-clone scenario (which guests need a fixup, and its commands) through `decide`, on the
//! guest's own generated types.

use super::*;
use alloc::string::ToString;
use alloc::vec;
use alloc::vec::Vec;
use cocoonstack::vk_policy::types::{BootMode, PodFacts, PodPhase, ReadinessProbe, SnapshotPolicy, VmSpec};

/// The host decodes the annotations; these tests speak its lower-case values.
fn os_of(text: &str) -> GuestOs {
    match text {
        "" | "linux" => GuestOs::Linux,
        "windows" => GuestOs::Windows,
        other => GuestOs::Unknown(other.into()),
    }
}

fn backend_of(text: &str) -> Backend {
    match text {
        "" => Backend::Unspecified,
        "cloud-hypervisor" => Backend::CloudHypervisor,
        "firecracker" => Backend::Firecracker,
        other => Backend::Unknown(other.into()),
    }
}

fn facts(os: &str, backend: &str, nics: Vec<Nic>) -> Facts {
    Facts {
        pod: PodFacts {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u".into(),
            phase: PodPhase::Running,
            annotations: vec![],
            labels: vec![],
            node_selector: vec![],
            owner_references: vec![],
        },
        spec: VmSpec {
            vm_name: "vm1".into(),
            image: "snap:v1".into(),
            mode: BootMode::Clone,
            os: os_of(os),
            storage: String::new(),
            network: String::new(),
            snapshot_policy: SnapshotPolicy::Always,
            fork_from: String::new(),
            clone_from_dir: String::new(),
            managed: true,
            force_pull: false,
            no_direct_io: false,
            conn_type: String::new(),
            backend: backend_of(backend),
            probe: ReadinessProbe::Icmp,
            restore_from_hibernate: false,
            hibernate: false,
            keep_snapshot_on_delete: false,
        },
        vm_id: "id-1".into(),
        hypervisor: backend_of(backend),
        nics,
        origin: BootOrigin::Clone,
        source_image: "snap:v1".into(),
        cloudimg_overlay: false,
    }
}

fn dhcp(mac: &str) -> Nic {
    Nic {
        mac: mac.into(),
        ip: String::new(),
        gateway: String::new(),
        prefix: 0,
    }
}

fn fixed(mac: &str, ip: &str) -> Nic {
    Nic {
        mac: mac.into(),
        ip: ip.into(),
        gateway: "10.0.0.1".into(),
        prefix: 24,
    }
}

fn fixup(d: &Decision) -> &Fixup {
    match &d.outcome {
        Outcome::Run(f) => f,
        other => panic!("expected a fixup, got {other:?} ({})", d.reason),
    }
}

#[test]
fn needed_and_kind_follow_the_spec_precedence() {
    let mac = "52:54:00:00:00:01";
    let rows = [
        ("", "cloud-hypervisor", vec![dhcp(mac)], "not-needed", None),
        ("linux", "", vec![], "not-needed", None),
        (
            "",
            "cloud-hypervisor",
            vec![fixed(mac, "10.0.0.2")],
            "linux-static",
            Some("linux_static"),
        ),
        ("", "firecracker", vec![dhcp(mac)], "linux-fc", Some("linux_fc")),
        ("", "firecracker", vec![], "linux-fc", Some("linux_fc")),
        (
            "windows",
            "firecracker",
            vec![fixed(mac, "10.0.0.2")],
            "windows",
            Some("windows"),
        ),
        ("windows", "", vec![], "windows", Some("windows")),
    ];
    for (os, backend, nics, reason, kind) in rows {
        let d = decide(&facts(os, backend, nics));
        assert_eq!(d.reason, reason, "os {os:?} backend {backend:?}");
        let got = match &d.outcome {
            Outcome::Run(f) => Some(
                Kind::ALL
                    .into_iter()
                    .find(|k| k.wit() == f.kind)
                    .map(Kind::label)
                    .unwrap_or("other"),
            ),
            _ => None,
        };
        assert_eq!(got, kind, "os {os:?} backend {backend:?}");
    }
}

#[test]
fn unmanaged_pods_get_no_guest_work_even_when_one_would_be_needed() {
    let mut f = facts("windows", "firecracker", vec![fixed("aa:bb", "10.0.0.2")]);
    f.spec.managed = false;
    let d = decide(&f);
    assert!(matches!(d.outcome, Outcome::None), "{:?}", d.outcome);
    assert_eq!(d.reason, "unmanaged");
}

#[test]
fn a_static_nic_on_an_oci_guest_gets_a_networkd_file_and_the_script_is_the_hint() {
    let d = decide(&facts(
        "",
        "cloud-hypervisor",
        vec![fixed("52:54:00:00:00:01", "10.0.0.2")],
    ));
    let f = fixup(&d);
    assert_eq!(f.argv[..2], ["sh", "-c"]);
    assert_eq!(f.argv.len(), 3);
    assert_eq!(f.argv[2], f.hint, "the hint is the script itself");
    assert!(
        f.hint.contains(r"Address=10.0.0.2/24\nGateway=10.0.0.1\n"),
        "{}",
        f.hint
    );
    assert!(
        f.hint.contains("> /etc/systemd/network/10-525400000001.network"),
        "{}",
        f.hint
    );
    assert!(!f.hint.contains("ip link"), "only firecracker re-applies MACs");
    assert_eq!(
        d.message,
        "vm vm1 needs a linux_static fixup after the clone: 1 static NIC, systemd-networkd config rewritten"
    );
}

#[test]
fn firecracker_re_applies_every_mac_in_order() {
    let nics = vec![fixed("aa:00:00:00:00:01", "10.0.0.2"), dhcp("aa:00:00:00:00:02")];
    let d = decide(&facts("", "firecracker", nics));
    let script = &fixup(&d).argv[2];
    let eth0 = script
        .find("ip link set dev eth0 address aa:00:00:00:00:01")
        .expect("eth0");
    let eth1 = script
        .find("ip link set dev eth1 address aa:00:00:00:00:02")
        .expect("eth1");
    assert!(eth0 < eth1);
    assert!(
        script.contains(r"DHCP=ipv4\n\n[DHCPv4]\nClientIdentifier=mac\n"),
        "the DHCP NIC keeps DHCP: {script}"
    );
    assert!(
        d.message.contains("firecracker guest with 2 NICs (1 static)"),
        "{}",
        d.message
    );
}

#[test]
fn cloud_images_re_run_cloud_init_by_source_url_or_by_overlay() {
    let mut by_url = facts("", "cloud-hypervisor", vec![fixed("aa:bb", "10.0.0.2")]);
    by_url.source_image = "https://cloud-images.example/noble.qcow2".into();
    let mut by_overlay = facts("", "cloud-hypervisor", vec![fixed("aa:bb", "10.0.0.2")]);
    by_overlay.origin = BootOrigin::Wake;
    by_overlay.source_image = String::new();
    by_overlay.cloudimg_overlay = true;
    for f in [by_url, by_overlay] {
        let d = decide(&f);
        let script = &fixup(&d).argv[2];
        assert!(
            script.contains("cloud-init clean --logs --seed --configs network"),
            "{script}"
        );
        assert!(!script.contains("printf"), "{script}");
        assert!(d.message.ends_with("cloud-init re-run"), "{}", d.message);
    }
    let mut plain = facts("", "cloud-hypervisor", vec![fixed("aa:bb", "10.0.0.2")]);
    plain.source_image = "httpd:latest".into();
    assert!(
        !fixup(&decide(&plain)).hint.contains("cloud-init"),
        "only http:// and https:// mark a cloud image"
    );
}

#[test]
fn windows_runs_the_fixed_powershell_reset() {
    let d = decide(&facts(
        "windows",
        "cloud-hypervisor",
        vec![fixed("aa' ; reboot", "10.0.0.2")],
    ));
    let f = fixup(&d);
    assert_eq!(f.argv, ["powershell", "-nop", "-c", WINDOWS_PS]);
    assert!(
        f.hint
            .starts_with(&("powershell -nop -c '".to_string() + WINDOWS_PS + "'"))
    );
    assert!(
        !f.argv.concat().contains("reboot"),
        "nothing from the NIC record reaches the command"
    );
    // The static NIC's address is set through the console after the reset.
    assert_eq!(
        f.console_addresses,
        [ConsoleAddress {
            nic: 0,
            ip: "10.0.0.2".into(),
            prefix: 24,
            gateway: "10.0.0.1".into()
        }]
    );
    assert!(
        f.hint.ends_with("i <net of NIC 0> 10.0.0.2 255.255.255.0 10.0.0.1"),
        "{}",
        f.hint
    );
}

#[test]
fn a_windows_guest_gets_its_static_addresses_through_the_console_after_a_run_but_not_after_a_wake() {
    let mut run = facts(
        "windows",
        "cloud-hypervisor",
        vec![dhcp("52:54:00:00:00:01"), fixed("52:54:00:00:00:02", "10.0.0.3")],
    );
    run.origin = BootOrigin::Run;
    run.nics[1].prefix = 0;
    let d = decide(&run);
    let f = fixup(&d);
    assert!(f.argv.is_empty(), "nothing to exec after a run");
    assert_eq!(f.console_addresses.len(), 1);
    assert_eq!(
        (f.console_addresses[0].nic, f.console_addresses[0].prefix),
        (1, 24),
        "a prefix of 0 is a /24"
    );
    // A Linux run, or a Windows run with DHCP only: nothing.
    let mut linux = run.clone();
    linux.spec.os = GuestOs::Linux;
    assert_eq!(decide(&linux).outcome, Outcome::None);
    let mut dhcp_only = run.clone();
    dhcp_only.nics.truncate(1);
    assert_eq!(decide(&dhcp_only).outcome, Outcome::None);
    // A wake keeps the guest's own configuration: the reset only.
    let mut wake = run.clone();
    wake.origin = BootOrigin::Wake;
    assert!(fixup(&decide(&wake)).console_addresses.is_empty());
    // An address that is not IPv4 text is never typed at the console.
    let mut hostile = run.clone();
    hostile.nics[1].ip = "10.0.0.3\ni 1 6.6.6.6".into();
    assert_eq!(decide(&hostile).reason, "unsafe-nic");
}

#[test]
fn hostile_nic_records_and_vm_names_are_refused_not_spliced() {
    let hostile = [
        (
            vec![fixed("aa:bb'; reboot; echo '", "10.0.0.2")],
            "unsafe-nic",
            "NIC 0 (eth0)",
        ),
        (
            vec![dhcp("aa:01"), fixed("aa:02", "10.0.0.2\nreboot")],
            "unsafe-nic",
            "NIC 1 (eth1)",
        ),
        (
            vec![Nic {
                gateway: "$(reboot)".into(),
                ..fixed("aa:01", "10.0.0.2")
            }],
            "unsafe-nic",
            "gateway",
        ),
        (vec![dhcp("")], "unsafe-nic", "mac \"\""),
    ];
    for (nics, reason, named) in hostile {
        let d = decide(&facts("", "firecracker", nics));
        assert!(matches!(d.outcome, Outcome::Refuse(_)), "{:?}", d.outcome);
        assert_eq!(d.reason, reason, "{}", d.message);
        assert!(d.message.contains(named), "{}", d.message);
    }
    let mut f = facts("", "firecracker", vec![]);
    f.spec.vm_name = "vm1 > /etc/passwd; reboot".into();
    let d = decide(&f);
    assert!(matches!(d.outcome, Outcome::Refuse(_)), "{:?}", d.outcome);
    assert_eq!(d.reason, "unsafe-vm-name");
    assert!(d.message.contains("\"vm1 > /etc/passwd; reboot\""), "{}", d.message);
}

#[test]
fn a_guest_that_heals_itself_needs_no_name_check() {
    // The name reaches no script, so an odd one does not fail a pod that needs nothing.
    let mut f = facts("", "cloud-hypervisor", vec![dhcp("aa:bb")]);
    f.spec.vm_name = "odd name".into();
    assert_eq!(decide(&f).reason, "not-needed");
}
