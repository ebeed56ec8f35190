//! The test API of the cocoon-macos simulator: [`Sim::macos`] gives a handle on a state directory
//! beside a cocoon root (same guest subnet, so one test's guests never collide with another's),
//! and the `macos_*` methods drive it. The fault-injection and call-log methods of [`Sim`] work on
//! that handle unchanged (verbs `"vm run"`, `"image pull"`, …).

use super::record::{self, Record};
use crate::helper::Sim;
use crate::store::Store;

impl Sim {
    /// The cocoon-macos state directory `<root>/cocoon-macos` (created), with this root's
    /// loopback guest subnet. Point the client at `cocoon-macos-sim` with
    /// [`Sim::macos_env`].
    pub fn macos(&self) -> std::io::Result<Sim> {
        let mac = self.with_root(self.root.join("cocoon-macos"));
        Store::new(&mac.root).ensure_dirs()?;
        let subnet = self.subnet().to_string();
        mac.set_settings(|s| s.static_subnet = subnet)?;
        Ok(mac)
    }

    /// `("COCOON_MACOS_HOME", root)`: the environment a `cocoon-macos-sim` process needs.
    pub fn macos_env(&self) -> (String, String) {
        ("COCOON_MACOS_HOME".into(), self.root.display().to_string())
    }

    /// Stores an image as if `image pull` had fetched it (virtual size from the settings).
    pub fn macos_add_image(&self, reference: &str) -> std::io::Result<()> {
        let store = Store::new(&self.root);
        let virtual_size = self.settings()?.macos_image_virtual_size;
        let _g = store.lock()?;
        let mut images = record::images(&store);
        super::vm::add_image(&mut images, reference, virtual_size);
        record::save_images(&store, &images)
    }

    pub fn macos_images(&self) -> std::io::Result<Vec<String>> {
        let store = Store::new(&self.root);
        let _g = store.lock()?;
        Ok(record::images(&store).into_keys().collect())
    }

    /// The VM's record (`None`: no such VM).
    pub fn macos_vm(&self, name: &str) -> std::io::Result<Option<Record>> {
        let store = Store::new(&self.root);
        let _g = store.lock()?;
        Ok(record::load(&store, name).ok())
    }

    pub fn macos_vm_names(&self) -> std::io::Result<Vec<String>> {
        let store = Store::new(&self.root);
        let _g = store.lock()?;
        Ok(record::all(&store).into_iter().map(|r| r.name).collect())
    }

    /// Whether the VM's qemu is alive.
    pub fn macos_running(&self, name: &str) -> std::io::Result<bool> {
        Ok(self.macos_vm(name)?.is_some_and(|r| record::running(r.pid, &r.disk)))
    }

    /// `(mac, ip)`: the VM's MAC and the address cocoon-net's DHCP would lease it (a test writes
    /// the lease when it wants the guest to have one).
    pub fn macos_guest(&self, name: &str) -> std::io::Result<Option<(String, String)>> {
        let store = Store::new(&self.root);
        let _g = store.lock()?;
        let Ok(r) = record::load(&store, name) else {
            return Ok(None);
        };
        Ok(record::guest(&store, name).map(|g| (r.mac, g.ip)))
    }

    /// The root's host address, where VNC displays listen (`<subnet>.0.1`).
    pub fn macos_vnc_host(&self) -> std::io::Result<String> {
        Ok(super::vm::host_addr(&self.settings()?))
    }

    /// Kills the VM's qemu behind the client's back (a crash): the record stays, with its pid.
    /// Returns once the process is gone.
    pub fn macos_crash(&self, name: &str) -> std::io::Result<()> {
        let r = self
            .macos_vm(name)?
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("macos_crash: no vm {name:?}")))?;
        if r.pid > 0 {
            // SAFETY: kill has no memory preconditions; the pid is the simulator's own child.
            unsafe {
                libc::kill(r.pid as i32, libc::SIGKILL);
            }
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while record::running(r.pid, &r.disk) {
            if std::time::Instant::now() > deadline {
                return Err(std::io::Error::other(format!("qemu {} of {name} did not die", r.pid)));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(())
    }
}
