//! The names and ids a pod's annotations hand to cocoon. cocoon refuses a VM name outside its
//! rule, resolves a VM ref by exact id, then by name, then by a unique id prefix, and the daemon
//! joins a VM's id into paths (its run directory's console socket, its log file). So a name or
//! an id is checked when the pod is decoded, before anything runs: a name by cocoon's own rule,
//! an id by the same alphabet (it can never be a path, `.` or `..`, nor start with `-` and be
//! read as a flag).

/// The longest VM name cocoon accepts.
pub const MAX_VM_NAME: usize = 63;
/// The longest pre-assigned VM id accepted: cocoon's ids are 26 characters; an unmanaged VM's id
/// comes from another VM manager, so some room is left.
pub const MAX_VM_ID: usize = 128;

/// cocoon's VM name rule, in words (for messages).
pub const VM_NAME_RULE: &str = "a letter or digit followed by up to 62 letters, digits, '.', '_' or '-'";
/// The pre-assigned id rule, in words.
pub const VM_ID_RULE: &str = "a letter or digit followed by up to 127 letters, digits, '.', '_' or '-'";

/// `^[a-zA-Z0-9][a-zA-Z0-9._-]{0,max-1}$`: cocoon's name alphabet.
fn in_cocoon_alphabet(text: &str, max: usize) -> bool {
    let mut bytes = text.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphanumeric());
    first_ok && text.len() <= max && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A VM name cocoon accepts (`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`).
pub fn is_vm_name(name: &str) -> bool {
    in_cocoon_alphabet(name, MAX_VM_NAME)
}

/// A pre-assigned VM id: cocoon's name alphabet, at most [`MAX_VM_ID`] characters.
pub fn is_vm_id(id: &str) -> bool {
    in_cocoon_alphabet(id, MAX_VM_ID)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_names_follow_cocoons_rule() {
        for good in ["vk-ns-set-0", "a", "A1.b_c-d", &"x".repeat(63)] {
            assert!(is_vm_name(good), "{good:?}");
        }
        for bad in [
            "",
            "-flag",
            ".hidden",
            "..",
            "_x",
            "a/b",
            "../etc",
            "/tmp/x",
            "vk-$(touch x)",
            "a b",
            "a:b",
            "é",
            &"x".repeat(64),
        ] {
            assert!(!is_vm_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn an_id_is_never_a_path() {
        assert!(is_vm_id("K7Q2M4XZ3TBV6N5RWJ2HC4DLPA"));
        assert!(is_vm_id("qemu-vm-1"));
        assert!(is_vm_id(&"i".repeat(128)));
        for bad in ["", "/tmp/x", "..", ".", "a/../b", "-rf", "id\n", &"i".repeat(129)] {
            assert!(!is_vm_id(bad), "{bad:?}");
        }
    }
}
