//! The verbs of the cocoon-macos simulator: `vm create|run|start|stop|rm|inspect|list` and
//! `image pull|inspect|list|rm`.

use super::qemu;
use super::record::{self, Guest, Image, Record, Smbios};
use crate::cli::{Args, Fail, FlagSpec, Kind, Res, parse, print_json};
use crate::control::Settings;
use crate::store::Store;
use std::net::TcpListener;

pub struct Ctx {
    pub store: Store,
    pub settings: Settings,
}

const VM_FLAGS: FlagSpec = &[
    ("name", Some('n'), Kind::Value),
    ("cpus", None, Kind::Value),
    ("memory", None, Kind::Value),
    ("vnc", None, Kind::Value),
    ("vnc-password", None, Kind::Value),
    ("ssh-port", None, Kind::Value),
    ("opencore", None, Kind::Value),
    ("ovmf-code", None, Kind::Value),
    ("ovmf-vars", None, Kind::Value),
    ("state-dir", None, Kind::Value),
    ("storage", None, Kind::Value),
    ("exit-on-reboot", None, Kind::Bool),
    ("random-smbios", None, Kind::Bool),
    ("net", None, Kind::Value),
    ("tap", None, Kind::Value),
    ("bridge", None, Kind::Value),
    ("hugepages", None, Kind::Bool),
    ("data-disk", None, Kind::Repeat),
];
const START_FLAGS: FlagSpec = &[
    ("vnc", None, Kind::Value),
    ("vnc-password", None, Kind::Value),
    ("state-dir", None, Kind::Value),
];
const STOP_FLAGS: FlagSpec = &[("force", None, Kind::Bool), ("state-dir", None, Kind::Value)];
const STATE_ONLY: FlagSpec = &[("state-dir", None, Kind::Value)];
const LIST_FLAGS: FlagSpec = &[("output", Some('o'), Kind::Value), ("state-dir", None, Kind::Value)];
const PULL_FLAGS: FlagSpec = &[("force", None, Kind::Bool), ("state-dir", None, Kind::Value)];

pub const VNC_BASE_PORT: i64 = 5900;

pub fn dispatch(ctx: &Ctx, verb: &str, rest: &[String]) -> Res {
    match verb {
        "create" => create_verb(ctx, &parse(rest, VM_FLAGS)?, false),
        "run" => create_verb(ctx, &parse(rest, VM_FLAGS)?, true),
        "start" => start_verb(ctx, &parse(rest, START_FLAGS)?),
        "stop" => stop_verb(ctx, &parse(rest, STOP_FLAGS)?),
        "rm" => rm_verb(ctx, &parse(rest, STATE_ONLY)?),
        "inspect" => {
            let a = parse(rest, STATE_ONLY)?;
            let name = exactly_one(&a, "inspect")?;
            let _g = ctx.store.lock()?;
            let mut rec = record::load(&ctx.store, name).map_err(Fail::new)?;
            if ctx.settings.macos_mac_pending {
                rec.mac.clear();
                rec.tap.clear();
            }
            print_json(&rec)
        }
        "list" | "ls" => {
            let a = parse(rest, LIST_FLAGS)?;
            let recs = {
                let _g = ctx.store.lock()?;
                record::all(&ctx.store)
            };
            if a.get("output") == Some("json") {
                return print_json(&recs);
            }
            println!("NAME\tSTATE\tCPU\tMEM\tNET\tVNC\tIMAGE\tCREATED");
            for r in recs {
                let state = if record::running(r.pid, &r.disk) {
                    "running"
                } else {
                    "stopped"
                };
                let vnc = if r.vnc < 0 {
                    "-".to_string()
                } else {
                    (VNC_BASE_PORT + r.vnc).to_string()
                };
                let net = if r.net_mode.is_empty() { "user" } else { &r.net_mode };
                println!(
                    "{}\t{state}\t{}\t{}M\t{net}\t{vnc}\t{}\t{}",
                    r.name, r.cpus, r.memory, r.image, r.created
                );
            }
            Ok(())
        }
        other => Err(Fail::new(format!(
            "unknown command \"{other}\" for \"cocoon-macos vm\""
        ))),
    }
}

fn exactly_one<'a>(a: &'a Args, verb: &str) -> Result<&'a str, Fail> {
    match a.positionals.as_slice() {
        [one] => Ok(one),
        other => Err(Fail::new(format!(
            "accepts 1 arg(s), received {} (usage: cocoon-macos vm {verb} VM)",
            other.len()
        ))),
    }
}

fn at_least_one(a: &Args) -> Result<(), Fail> {
    if a.positionals.is_empty() {
        return Err(Fail::new("requires at least 1 arg(s), only received 0"));
    }
    Ok(())
}

fn int_flag(a: &Args, name: &str, default: i64) -> Result<i64, Fail> {
    Ok(a.int(name)?.unwrap_or(default))
}

/// The real CLI's checks of a VNC password (QEMU's 8-character limit; a newline would inject a
/// second monitor command).
pub fn validate_vnc_password(pw: &str) -> Result<(), Fail> {
    if pw.len() > 8 {
        return Err(Fail::new(format!(
            "--vnc-password must be at most 8 characters, got {}",
            pw.len()
        )));
    }
    if pw.chars().any(char::is_control) {
        return Err(Fail::new("--vnc-password must not contain control characters"));
    }
    Ok(())
}

fn require_cni_vnc_password(cni: bool, display: i64, pw: &str) -> Result<(), Fail> {
    if cni && display >= 0 && pw.is_empty() {
        return Err(Fail::new(
            "--vnc with --net cni serves VNC on a host port reachable off-box; --vnc-password is required",
        ));
    }
    validate_vnc_password(pw)
}

/// `20G`, `20Gi`, `20GiB`, plain bytes (Docker's RAMInBytes spellings).
fn parse_size(raw: &str) -> Result<u64, Fail> {
    let t = raw.trim();
    let bad = || Fail::new(format!("invalid --storage {raw:?}: invalid size: '{t}'"));
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit.trim_end_matches('b').trim_end_matches('i');
    let mult: u64 = match unit {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => return Err(bad()),
    };
    let bytes = (n * mult as f64) as u64;
    if bytes == 0 {
        return Err(Fail::new(format!("invalid --storage {raw:?}: size must be positive")));
    }
    Ok(bytes)
}

fn hex_of(seed: u64, len: usize) -> String {
    // Mixed first: seeds that differ in a few low bits give unrelated strings.
    let mut x = crate::util::xorshift(crate::util::xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1));
    let mut out = String::new();
    while out.len() < len {
        x = crate::util::xorshift(x);
        out.push_str(&format!("{:016X}", x));
    }
    out.truncate(len);
    out
}

fn mac_of(seed: u64) -> String {
    let h = hex_of(seed, 6).to_ascii_lowercase();
    format!("52:54:00:{}:{}:{}", &h[0..2], &h[2..4], &h[4..6])
}

/// `vm create` / `vm run`: validate, scaffold the record, and (run) boot it; a failed boot
/// removes everything the run made.
fn create_verb(ctx: &Ctx, a: &Args, boot: bool) -> Res {
    let image = exactly_one(a, if boot { "run" } else { "create" })?.to_string();
    let name = match a.get("name") {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => format!("macos-{}", crate::util::new_id()),
    };
    let cpus = int_flag(a, "cpus", 4)?;
    let memory = a.get("memory").unwrap_or("8192").to_string();
    let display = int_flag(a, "vnc", -1)?;
    let password = a.get("vnc-password").unwrap_or("").to_string();
    let ssh_port = int_flag(a, "ssh-port", 0)?;
    let net = a.get("net").unwrap_or("user").to_string();
    if !matches!(net.as_str(), "user" | "tap" | "bridge" | "cni") {
        return Err(Fail::new(format!(
            "invalid --net {net:?}: must be one of user, tap, bridge, cni"
        )));
    }
    require_cni_vnc_password(net == "cni", display, &password)?;
    let storage = match a.get("storage") {
        Some(raw) if !raw.trim().is_empty() => parse_size(raw)?,
        _ => 0,
    };
    let _g = ctx.store.lock()?;
    let dir = record::vm_dir(&ctx.store, &name);
    if dir.join("vm.json").exists() {
        return Err(Fail::new(format!(
            "vm {name:?} already exists; rm it first or pick another --name"
        )));
    }
    let images = record::images(&ctx.store);
    let Some(img) = images.get(&image) else {
        return Err(Fail::new(format!(
            "resolve image {image:?} (not a file, not in the store): image not found: {image}"
        )));
    };
    if storage != 0 && storage < img.virtual_size {
        return Err(Fail::new(format!(
            "--storage {storage} bytes is smaller than image virtual size {} bytes; shrinking is not supported",
            img.virtual_size
        )));
    }
    let seed = crate::util::seed_of(&format!("{name}/{}", crate::util::new_id()));
    let smbios = a.has("random-smbios").then(|| Smbios {
        model: "iMac19,1".into(),
        serial: hex_of(seed, 12),
        mlb: hex_of(seed ^ 0x5a5a, 17),
        uuid: hex_of(seed ^ 0xa5a5, 32),
        rom: hex_of(seed ^ 0x3c3c, 12),
    });
    let mac = mac_of(seed);
    let (tap, netns) = match net.as_str() {
        "user" => (String::new(), String::new()),
        "cni" => (
            format!("tap{}", &hex_of(seed, 8).to_ascii_lowercase()),
            format!("/var/run/netns/cocoon-macos-{name}"),
        ),
        _ => (
            a.get("tap")
                .map(str::to_string)
                .unwrap_or_else(|| format!("tap{}", &hex_of(seed, 8).to_ascii_lowercase())),
            String::new(),
        ),
    };
    std::fs::create_dir_all(&dir)?;
    let disk = dir.join("disk.qcow2").display().to_string();
    std::fs::write(&disk, b"QFI\xfb")?;
    let mut r = Record {
        name: name.clone(),
        vmid: hex_of(seed ^ 0x77, 16).to_ascii_lowercase(),
        image: image.clone(),
        image_digest: format!("sha256:{}", img.id),
        cpus,
        memory,
        vnc: display,
        ssh_port,
        net_mode: net.clone(),
        storage: if storage == 0 { img.virtual_size } else { storage },
        exit_on_reboot: a.has("exit-on-reboot"),
        disk,
        opencore: dir.join("OpenCore.qcow2").display().to_string(),
        ovmf_code: ctx.store.path("firmware/OVMF_CODE.fd").display().to_string(),
        ovmf_vars: dir.join("OVMF_VARS.fd").display().to_string(),
        mac,
        smbios,
        tap_owned: !tap.is_empty() && a.get("tap").is_none(),
        tap,
        bridge_dev: a.get("bridge").unwrap_or("").to_string(),
        netns,
        pid: 0,
        created: crate::util::now_rfc3339(),
    };
    let guest = Guest {
        ip: next_guest_ip(ctx)?,
    };
    record::save(&ctx.store, &r)?;
    record::save_guest(&ctx.store, &name, &guest)?;
    if !boot {
        println!("{name}");
        return Ok(());
    }
    if let Err(e) = launch(ctx, &mut r, &password) {
        // `run` is atomic: a failed boot leaves no half-made VM behind.
        let _ = std::fs::remove_dir_all(&dir);
        return Err(e);
    }
    println!("{name} (pid {})", r.pid);
    Ok(())
}

/// `<subnet>.250.N`: the guests of this root (the cocoon simulator's own guests start at `.0.2`).
fn next_guest_ip(ctx: &Ctx) -> Result<String, Fail> {
    let used: Vec<String> = record::all(&ctx.store)
        .iter()
        .filter_map(|r| record::guest(&ctx.store, &r.name))
        .map(|g| g.ip)
        .collect();
    (2..=254)
        .map(|n| format!("{}.250.{n}", ctx.settings.static_subnet))
        .find(|ip| !used.contains(ip))
        .ok_or_else(|| Fail::new("simulator: no guest address left in <subnet>.250.0/24"))
}

/// The root's "host" address: where the VNC displays listen.
pub fn host_addr(settings: &Settings) -> String {
    format!("{}.0.1", settings.static_subnet)
}

/// Go's spelling of a socket error (`address already in use`).
fn go_errno(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => "address already in use".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// Boots the record's "qemu" (listeners bound here, so a taken port fails the launch).
fn launch(ctx: &Ctx, r: &mut Record, password: &str) -> Res {
    if r.net_mode == "cni" && r.vnc >= 0 && password.is_empty() {
        return Err(Fail::new(
            "--vnc with --net cni serves VNC on a host port reachable off-box; --vnc-password is required",
        ));
    }
    validate_vnc_password(password)?;
    let vnc = if r.vnc >= 0 {
        let port = VNC_BASE_PORT + r.vnc;
        let host = host_addr(&ctx.settings);
        let bind_addr = if r.net_mode == "cni" { "0.0.0.0" } else { "127.0.0.1" };
        Some(TcpListener::bind((host.as_str(), port as u16)).map_err(|e| {
            Fail::new(format!(
                "bind vnc port: listen tcp {bind_addr}:{port}: bind: {}",
                go_errno(&e)
            ))
        })?)
    } else {
        None
    };
    let guest = record::guest(&ctx.store, &r.name).unwrap_or_default();
    let ssh = if ctx.settings.macos_sshd && !guest.ip.is_empty() {
        Some(
            TcpListener::bind((guest.ip.as_str(), 22))
                .map_err(|e| Fail::new(format!("qemu launch: simulator: guest sshd on {}:22: {e}", guest.ip)))?,
        )
    } else {
        None
    };
    let pidfile = record::vm_dir(&ctx.store, &r.name).join("qemu.pid");
    let pid = qemu::start(qemu::Launch {
        name: &r.name,
        disk: &r.disk,
        pidfile: &pidfile,
        vnc,
        ssh,
        guest_ip: &guest.ip,
        guest_ports: &ctx.settings.guest_http_ports,
    })
    .map_err(|e| Fail::new(format!("qemu launch: {e}")))?;
    r.pid = pid;
    record::save(&ctx.store, r)?;
    Ok(())
}

fn start_verb(ctx: &Ctx, a: &Args) -> Res {
    at_least_one(a)?;
    let password = a.get("vnc-password").unwrap_or("").to_string();
    let display = a.int("vnc")?;
    let _g = ctx.store.lock()?;
    for name in &a.positionals {
        let mut r = record::load(&ctx.store, name).map_err(Fail::new)?;
        if record::running(r.pid, &r.disk) {
            return Err(Fail::new(format!("vm {name:?} is already running (pid {})", r.pid)));
        }
        if let Some(d) = display {
            r.vnc = d;
        }
        launch(ctx, &mut r, &password)?;
        println!("{name} (pid {})", r.pid);
    }
    Ok(())
}

fn stop_verb(ctx: &Ctx, a: &Args) -> Res {
    at_least_one(a)?;
    let _g = ctx.store.lock()?;
    for name in &a.positionals {
        let mut r = record::load(&ctx.store, name).map_err(Fail::new)?;
        qemu::stop(r.pid, &r.disk, &record::vm_dir(&ctx.store, name).join("qemu.pid"));
        r.pid = 0;
        record::save(&ctx.store, &r)?;
        println!("{name}");
    }
    Ok(())
}

fn rm_verb(ctx: &Ctx, a: &Args) -> Res {
    at_least_one(a)?;
    let _g = ctx.store.lock()?;
    for name in &a.positionals {
        let dir = record::vm_dir(&ctx.store, name);
        if let Ok(r) = record::load(&ctx.store, name) {
            qemu::stop(r.pid, &r.disk, &dir.join("qemu.pid"));
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Fail::new(format!("remove vm dir: {e}"))),
        }
        println!("{name}");
    }
    Ok(())
}

/// `image …`.
pub fn image(ctx: &Ctx, verb: &str, rest: &[String]) -> Res {
    match verb {
        "pull" => {
            let a = parse(rest, PULL_FLAGS)?;
            let reference = exactly_one(&a, "pull")?;
            if reference.contains(' ') || reference.starts_with('-') {
                return Err(Fail::new(format!("invalid reference format: {reference}")));
            }
            let _g = ctx.store.lock()?;
            let mut images = record::images(&ctx.store);
            if !images.contains_key(reference) || a.has("force") {
                add_image(&mut images, reference, ctx.settings.macos_image_virtual_size);
                record::save_images(&ctx.store, &images)?;
            }
            Ok(())
        }
        "inspect" => {
            let a = parse(rest, STATE_ONLY)?;
            let reference = exactly_one(&a, "inspect")?;
            let _g = ctx.store.lock()?;
            match record::images(&ctx.store).get(reference) {
                Some(img) => print_json(img),
                None => Err(Fail::new(format!("image not found: {reference}"))),
            }
        }
        "list" | "ls" => {
            let _a = parse(rest, LIST_FLAGS)?;
            let _g = ctx.store.lock()?;
            let images: Vec<Image> = record::images(&ctx.store).into_values().collect();
            if images.is_empty() {
                println!("[]");
                return Ok(());
            }
            print_json(&images)
        }
        "rm" => {
            let a = parse(rest, STATE_ONLY)?;
            at_least_one(&a)?;
            let _g = ctx.store.lock()?;
            let mut images = record::images(&ctx.store);
            for r in &a.positionals {
                if images.remove(r).is_some() {
                    println!("{r}");
                }
            }
            record::save_images(&ctx.store, &images)?;
            Ok(())
        }
        other => Err(Fail::new(format!(
            "unknown command \"{other}\" for \"cocoon-macos image\""
        ))),
    }
}

/// Stores `reference` as if pulled (a qcow2 whose virtual size is `virtual_size`).
pub fn add_image(images: &mut std::collections::BTreeMap<String, Image>, reference: &str, virtual_size: u64) {
    use sha2::{Digest, Sha256};
    let id: String = Sha256::digest(reference.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    images.insert(
        reference.to_string(),
        Image {
            id,
            name: reference.to_string(),
            kind: "cloudimg".into(),
            size: virtual_size / 4,
            virtual_size,
            created_at: crate::util::now_rfc3339(),
        },
    );
}
