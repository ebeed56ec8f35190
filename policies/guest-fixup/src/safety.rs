//! What may be spliced into the guest's shell script. Every value that reaches the script comes
//! from a pod annotation or a cocoon record, so each is checked against a character set that
//! cannot break out of the script's quoting (no quotes, spaces, newlines or metacharacters).

use alloc::format;
use alloc::string::String;

use crate::Nic;

/// cocoon's VM-name rule: `^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`.
pub fn is_valid_vm_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    let Some(first) = bytes.next() else { return false };
    name.len() <= 63
        && first.is_ascii_alphanumeric()
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A MAC address written as hex digits and colons (non-empty: it names a networkd file).
fn is_safe_mac(mac: &str) -> bool {
    !mac.is_empty() && mac.bytes().all(|b| b.is_ascii_hexdigit() || b == b':')
}

/// IPv4 text: digits and dots only ("" is allowed: DHCP, or no gateway).
pub(crate) fn is_safe_ipv4_text(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// The first NIC with a field that must not reach the script: (index, field, value).
pub fn first_unsafe_nic(nics: &[Nic]) -> Option<(usize, &'static str, &str)> {
    nics.iter().enumerate().find_map(|(i, nic)| {
        if !is_safe_mac(&nic.mac) {
            Some((i, "mac", nic.mac.as_str()))
        } else if !is_safe_ipv4_text(&nic.ip) {
            Some((i, "ip", nic.ip.as_str()))
        } else if !is_safe_ipv4_text(&nic.gateway) {
            Some((i, "gateway", nic.gateway.as_str()))
        } else {
            None
        }
    })
}

/// Longest piece of an untrusted value quoted in a message (the host caps messages at 4 KiB).
const MAX_SHOWN: usize = 64;

/// `value` cut to [`MAX_SHOWN`] bytes (on a character boundary), `…` marking a cut.
pub fn shown(value: &str) -> String {
    let (head, more) = cut(value);
    format!("{head}{more}")
}

/// `value` quoted and escaped for a message, cut like [`shown`].
pub fn quoted(value: &str) -> String {
    let (head, more) = cut(value);
    format!("{head:?}{more}")
}

fn cut(value: &str) -> (&str, &'static str) {
    let mut end = value.len().min(MAX_SHOWN);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    (&value[..end], if end < value.len() { "…" } else { "" })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic(mac: &str, ip: &str, gateway: &str) -> Nic {
        Nic {
            mac: mac.into(),
            ip: ip.into(),
            gateway: gateway.into(),
            prefix: 24,
        }
    }

    #[test]
    fn vm_names_follow_cocoons_rule() {
        let longest = "a".repeat(63);
        for good in ["vm1", "vk-ns-demo-0-505043", "A.b_c-d", "0", longest.as_str()] {
            assert!(is_valid_vm_name(good), "{good:?}");
        }
        let too_long = "a".repeat(64);
        for bad in [
            "",
            "-vm",
            ".vm",
            "vm 1",
            "vm;reboot",
            "vm'x",
            "vm\nx",
            "vm/x",
            "vmé",
            too_long.as_str(),
        ] {
            assert!(!is_valid_vm_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_first_unsafe_nic_field_is_named() {
        let good = nic("52:54:00:ab:CD:ef", "10.0.0.2", "10.0.0.1");
        assert_eq!(first_unsafe_nic(&[good.clone(), nic("", "", "")]), Some((1, "mac", "")));
        assert_eq!(
            first_unsafe_nic(&[nic("52:54:00:00:00:01", "", "")]),
            None,
            "DHCP NICs have no ip or gateway"
        );
        assert_eq!(
            first_unsafe_nic(&[good.clone(), nic("aa' ; reboot ; '", "", "")]),
            Some((1, "mac", "aa' ; reboot ; '"))
        );
        assert_eq!(
            first_unsafe_nic(&[nic("aa:bb", "10.0.0.2\nreboot", "")]),
            Some((0, "ip", "10.0.0.2\nreboot"))
        );
        assert_eq!(
            first_unsafe_nic(&[nic("aa:bb", "10.0.0.2", "$(reboot)")]),
            Some((0, "gateway", "$(reboot)"))
        );
        assert_eq!(
            first_unsafe_nic(&[nic("aa:bb", "fe80::1", "")]),
            Some((0, "ip", "fe80::1")),
            "IPv4 only"
        );
    }

    #[test]
    fn quoted_values_are_escaped_and_cut() {
        assert_eq!(quoted("a'b\nc"), "\"a'b\\nc\"");
        let long = "é".repeat(100);
        let cut_long = quoted(&long);
        assert!(cut_long.ends_with('…') && cut_long.len() < 80, "{cut_long}");
        assert_eq!(quoted("ok"), "\"ok\"");
        assert_eq!(shown("vm1"), "vm1");
        assert_eq!(shown(&"a".repeat(70)), format!("{}…", "a".repeat(64)));
    }
}
