//! The guest commands the Go daemon ran after a clone: the Windows network-device reset, and the
//! Linux script that refreshes the page cache, the hostname, (on firecracker) the NIC MACs, and the
//! network configuration. Inputs must already have passed [`crate::safety`].

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use crate::Nic;

/// Disables and re-enables every present network device, so Windows re-detects the NICs of
/// the clone.
pub const WINDOWS_PS: &str =
    "$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false";

/// `powershell -nop -c <ps>`.
pub fn windows_argv() -> Vec<String> {
    vec!["powershell".into(), "-nop".into(), "-c".into(), WINDOWS_PS.into()]
}

/// The same command for an operator's shell.
pub fn windows_hint() -> String {
    format!("powershell -nop -c '{WINDOWS_PS}'")
}

/// What an operator types at the serial console's `SAC>` prompt (`kubectl attach`) to set the
/// static addresses by hand: `i` lists the interfaces with their net numbers.
pub fn sac_hint(addresses: &[crate::ConsoleAddress]) -> String {
    let mut hint = String::from("# at the SAC> prompt of the VM's serial console; `i` lists the interfaces (Net: <n>)");
    for a in addresses {
        hint.push_str(&format!(
            "\ni <net of NIC {}> {} {} {}",
            a.nic,
            a.ip,
            dotted_mask(a.prefix),
            a.gateway
        ));
    }
    hint
}

/// The dotted IPv4 mask of a prefix length (1..=32).
pub fn dotted_mask(prefix: u32) -> String {
    let bits: u32 = if prefix >= 32 { u32::MAX } else { !(u32::MAX >> prefix) };
    let [a, b, c, d] = bits.to_be_bytes();
    format!("{a}.{b}.{c}.{d}")
}

/// How the guest gets its network configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkConfig {
    /// A cloud image: cloud-init regenerates it.
    CloudInit,
    /// An OCI image: one systemd-networkd file per NIC, written here.
    Networkd,
}

/// The Linux fixup script, one command per line.
pub fn linux_script(vm_name: &str, nics: &[Nic], firecracker: bool, network: NetworkConfig) -> String {
    let mut lines: Vec<String> = vec![
        "echo 3 > /proc/sys/vm/drop_caches".into(),
        format!("echo {vm_name} > /etc/hostname"),
    ];
    if firecracker {
        // Firecracker restores the snapshot's MACs; the clone's own come from its record.
        for (i, nic) in nics.iter().enumerate() {
            let mac = &nic.mac;
            lines.push(format!(
                "ip link set dev eth{i} down && ip link set dev eth{i} address {mac} && ip link set dev eth{i} up"
            ));
        }
    }
    lines.push("rm -f /etc/systemd/network/10-*.network".into());
    match network {
        NetworkConfig::CloudInit => {
            lines.push(
                "cloud-init clean --logs --seed --configs network && cloud-init init --local && cloud-init init".into(),
            );
            lines.push("cloud-init modules --mode=config && systemctl restart systemd-networkd".into());
        }
        NetworkConfig::Networkd => {
            for nic in nics {
                let file = nic.mac.replace(':', "");
                lines.push(format!(
                    "printf '{}' > /etc/systemd/network/10-{file}.network",
                    networkd_config(nic)
                ));
            }
            lines.push("systemctl restart systemd-networkd".into());
        }
    }
    lines.join("\n")
}

/// A NIC's networkd file as a printf format: `\n` stays a literal backslash-n for the guest's
/// printf to expand.
fn networkd_config(nic: &Nic) -> String {
    let Nic {
        mac,
        ip,
        gateway,
        prefix,
    } = nic;
    if ip.is_empty() {
        format!("[Match]\\nMACAddress={mac}\\n\\n[Network]\\nDHCP=ipv4\\n\\n[DHCPv4]\\nClientIdentifier=mac\\n")
    } else {
        format!("[Match]\\nMACAddress={mac}\\n\\n[Network]\\nAddress={ip}/{prefix}\\nGateway={gateway}\\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic(mac: &str, ip: &str) -> Nic {
        let gateway = if ip.is_empty() { "" } else { "10.0.0.1" };
        Nic {
            mac: mac.into(),
            ip: ip.into(),
            gateway: gateway.into(),
            prefix: 24,
        }
    }

    #[test]
    fn oci_script_writes_one_networkd_file_per_nic_then_restarts_once() {
        let script = linux_script(
            "vm1",
            &[nic("52:54:00:00:00:01", "10.0.0.2"), nic("52:54:00:00:00:02", "")],
            false,
            NetworkConfig::Networkd,
        );
        let expected = [
            "echo 3 > /proc/sys/vm/drop_caches",
            "echo vm1 > /etc/hostname",
            "rm -f /etc/systemd/network/10-*.network",
            r"printf '[Match]\nMACAddress=52:54:00:00:00:01\n\n[Network]\nAddress=10.0.0.2/24\nGateway=10.0.0.1\n' > /etc/systemd/network/10-525400000001.network",
            r"printf '[Match]\nMACAddress=52:54:00:00:00:02\n\n[Network]\nDHCP=ipv4\n\n[DHCPv4]\nClientIdentifier=mac\n' > /etc/systemd/network/10-525400000002.network",
            "systemctl restart systemd-networkd",
        ];
        assert_eq!(script, expected.join("\n"));
    }

    #[test]
    fn firecracker_resets_each_mac_in_nic_order_before_the_network_config() {
        let script = linux_script(
            "vm1",
            &[nic("aa:00:00:00:00:01", ""), nic("aa:00:00:00:00:02", "")],
            true,
            NetworkConfig::CloudInit,
        );
        let lines: Vec<&str> = script.lines().collect();
        assert_eq!(
            lines[2],
            "ip link set dev eth0 down && ip link set dev eth0 address aa:00:00:00:00:01 && ip link set dev eth0 up"
        );
        assert_eq!(
            lines[3],
            "ip link set dev eth1 down && ip link set dev eth1 address aa:00:00:00:00:02 && ip link set dev eth1 up"
        );
        assert_eq!(lines[4], "rm -f /etc/systemd/network/10-*.network");
        assert_eq!(
            &lines[5..],
            [
                "cloud-init clean --logs --seed --configs network && cloud-init init --local && cloud-init init",
                "cloud-init modules --mode=config && systemctl restart systemd-networkd",
            ]
        );
        assert!(
            !script.contains("printf"),
            "cloud-init writes the network config itself"
        );
    }

    #[test]
    fn without_nics_only_the_fixed_lines_remain() {
        let script = linux_script("vm1", &[], true, NetworkConfig::Networkd);
        assert_eq!(
            script,
            "echo 3 > /proc/sys/vm/drop_caches\necho vm1 > /etc/hostname\nrm -f /etc/systemd/network/10-*.network\nsystemctl restart systemd-networkd"
        );
    }

    #[test]
    fn the_windows_hint_is_the_argv_for_a_shell() {
        assert_eq!(windows_argv()[..3], ["powershell", "-nop", "-c"]);
        assert_eq!(windows_hint(), format!("powershell -nop -c '{}'", windows_argv()[3]));
        assert!(
            !WINDOWS_PS.contains('\''),
            "the hint's single quotes hold the script whole"
        );
    }
}
