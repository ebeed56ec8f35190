//! Node-unique VNC ports for macOS guests (`DECISIONS.md` row 7): a port in the node's range
//! (5900–5999 by default) belongs to at most one VM name until that VM is deleted. The CLI binds
//! the port on all interfaces, so two VMs given one port would fail the second launch; handing them
//! out here makes that impossible rather than a retry loop.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::Mutex;

/// The holders of the node's VNC ports.
#[derive(Debug)]
pub struct VncPorts {
    range: RangeInclusive<u16>,
    held: Mutex<BTreeMap<u16, String>>,
}

/// Every port of the range is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exhausted {
    pub range: RangeInclusive<u16>,
}

impl std::fmt::Display for Exhausted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "every VNC port {}-{} of this node is held by a macOS guest: delete one, or widen VK_COCOON_MACOS_VNC_PORTS",
            self.range.start(),
            self.range.end()
        )
    }
}

impl VncPorts {
    pub fn new(range: RangeInclusive<u16>) -> Self {
        Self {
            range,
            held: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u16, String>> {
        self.held.lock().expect("vnc port table")
    }

    /// The port of `vm`: the one it holds, else `preferred` when that is in range and free
    /// (a record's own display, restarted), else the lowest free one.
    pub fn claim(&self, vm: &str, preferred: Option<u16>) -> Result<u16, Exhausted> {
        let mut held = self.lock();
        if let Some((port, _)) = held.iter().find(|(_, holder)| holder.as_str() == vm) {
            return Ok(*port);
        }
        let free = |p: &u16| !held.contains_key(p);
        let port = preferred
            .filter(|p| self.range.contains(p) && free(p))
            .or_else(|| self.range.clone().find(free))
            .ok_or_else(|| Exhausted {
                range: self.range.clone(),
            })?;
        held.insert(port, vm.to_string());
        Ok(port)
    }

    /// Records the port a running VM already serves (adopted at restart), whoever held it here.
    pub fn adopt(&self, vm: &str, port: u16) {
        let mut held = self.lock();
        held.retain(|_, holder| holder != vm);
        held.insert(port, vm.to_string());
    }

    /// Frees the port of `vm` (deleted, or its launch failed).
    pub fn release(&self, vm: &str) -> Option<u16> {
        let mut held = self.lock();
        let port = held.iter().find(|(_, h)| h.as_str() == vm).map(|(p, _)| *p)?;
        held.remove(&port);
        Some(port)
    }

    pub fn holder_of(&self, port: u16) -> Option<String> {
        self.lock().get(&port).cloned()
    }

    pub fn port_of(&self, vm: &str) -> Option<u16> {
        self.lock().iter().find(|(_, h)| h.as_str() == vm).map(|(p, _)| *p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_unique_reused_after_release_and_run_out() {
        let ports = VncPorts::new(5900..=5902);
        assert_eq!(ports.claim("a", None), Ok(5900));
        assert_eq!(ports.claim("b", None), Ok(5901));
        assert_eq!(ports.claim("a", None), Ok(5900), "a VM keeps its port across retries");
        assert_eq!(
            ports.claim("c", Some(5901)),
            Ok(5902),
            "a held preferred port is not shared"
        );
        let err = ports.claim("d", None).unwrap_err();
        assert!(err.to_string().contains("5900-5902"), "{err}");
        assert_eq!(ports.release("b"), Some(5901));
        assert_eq!(ports.claim("d", None), Ok(5901), "freed on delete, then reused");
        assert_eq!(ports.release("nobody"), None);
    }

    #[test]
    fn a_preferred_port_out_of_range_is_not_taken_and_adoption_moves_a_holder() {
        let ports = VncPorts::new(5910..=5911);
        assert_eq!(ports.claim("a", Some(5901)), Ok(5910));
        ports.adopt("a", 5911);
        assert_eq!(ports.port_of("a"), Some(5911));
        assert_eq!(ports.holder_of(5910), None);
    }
}
