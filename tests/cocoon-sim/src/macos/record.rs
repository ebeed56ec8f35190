//! The on-disk state of the cocoon-macos simulator: `vms/<name>/vm.json` (the record the real CLI
//! keeps, field names as in its `cmd/vm/handler.go`), `vms/<name>/sim-guest.json` (the guest's
//! address, simulator-only) and `images.json` (the image store's index).

use crate::store::{Store, write_atomic};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A randomized Mac identity (`--random-smbios`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Smbios {
    pub model: String,
    pub serial: String,
    pub mlb: String,
    pub uuid: String,
    pub rom: String,
}

/// `vm.json`. `storage` and `exit_on_reboot` are the newer CLI's (their key names are not
/// confirmed by the sources read).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vmid: String,
    pub image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_digest: String,
    pub cpus: i64,
    pub memory: String,
    /// VNC display; < 0 = off.
    pub vnc: i64,
    pub ssh_port: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub net_mode: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub storage: u64,
    #[serde(default, skip_serializing_if = "is_false")]
    pub exit_on_reboot: bool,
    pub disk: String,
    pub opencore: String,
    pub ovmf_code: String,
    pub ovmf_vars: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smbios: Option<Smbios>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tap: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub tap_owned: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bridge_dev: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub netns: String,
    pub pid: i64,
    pub created: String,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

/// Where the simulated guest is reachable (cocoon-net would lease it this address).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Guest {
    pub ip: String,
}

/// One stored image (`image inspect`): cocoon's image record plus the qcow2's virtual size.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Image {
    pub id: String,
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    pub virtual_size: u64,
    pub created_at: String,
}

pub fn vms_dir(store: &Store) -> PathBuf {
    store.path("vms")
}

pub fn vm_dir(store: &Store, name: &str) -> PathBuf {
    vms_dir(store).join(name)
}

/// The record, or the real CLI's error for a missing one.
pub fn load(store: &Store, name: &str) -> Result<Record, String> {
    let path = vm_dir(store, name).join("vm.json");
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| format!("read vm record: {e}")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "read vm record: open {}: no such file or directory",
            path.display()
        )),
        Err(e) => Err(format!("read vm record: open {}: {e}", path.display())),
    }
}

pub fn save(store: &Store, r: &Record) -> std::io::Result<()> {
    let dir = vm_dir(store, &r.name);
    std::fs::create_dir_all(&dir)?;
    write_atomic(
        &dir.join("vm.json"),
        &serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?,
    )
}

pub fn all(store: &Store) -> Vec<Record> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(vms_dir(store)) else {
        return out;
    };
    for e in entries.flatten() {
        if let Ok(r) = load(store, &e.file_name().to_string_lossy()) {
            out.push(r);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

pub fn guest(store: &Store, name: &str) -> Option<Guest> {
    let bytes = std::fs::read(vm_dir(store, name).join("sim-guest.json")).ok()?;
    serde_json::from_slice(&bytes).ok()
}

pub fn save_guest(store: &Store, name: &str, g: &Guest) -> std::io::Result<()> {
    write_atomic(
        &vm_dir(store, name).join("sim-guest.json"),
        &serde_json::to_vec(g).map_err(std::io::Error::other)?,
    )
}

pub fn images(store: &Store) -> BTreeMap<String, Image> {
    std::fs::read(store.path("images.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

pub fn save_images(store: &Store, images: &BTreeMap<String, Image>) -> std::io::Result<()> {
    write_atomic(
        &store.path("images.json"),
        &serde_json::to_vec_pretty(images).map_err(std::io::Error::other)?,
    )
}

/// Whether `pid` is the live "qemu" of the VM whose disk is `disk` (the real CLI's check: argv0
/// and the disk path in the command line; a zombie is dead).
pub fn running(pid: i64, disk: &str) -> bool {
    if pid <= 0 {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let ours = args.get(1) == Some(&&b"__qemu"[..]) && args.contains(&disk.as_bytes());
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().starts_with('Z')))
        .unwrap_or(true);
    ours && !zombie
}
