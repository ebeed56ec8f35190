//! `vm …` verbs.

use crate::cli::{Ctx, Fail, FlagSpec, Kind, Res, log, parse, print_json};
use crate::control::Control;
use crate::model::{Nic, NicNetwork, StorageConfig, Vm, VmConfig, VmEntry};
use crate::store::{Resolved, State, resolve};
use crate::util::{now_rfc3339, ram_in_bytes, seed_of};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};

use Kind::*;

const RUN: FlagSpec = &[
    ("name", None, Value),
    ("cpu", None, Value),
    ("memory", None, Value),
    ("storage", None, Value),
    ("nics", None, Value),
    ("network", None, Value),
    ("bridge", None, Value),
    ("fc", None, Bool),
    ("windows", None, Bool),
    ("no-direct-io", None, Bool),
    ("queue-size", None, Value),
    ("disk-queue-size", None, Value),
    ("user", None, Value),
    ("password", None, Value),
    ("data-disk", None, Repeat),
    ("cpu-weight", None, Value),
    ("cpu-quota-us", None, Value),
    ("cpu-period-us", None, Value),
    ("cpu-burst-us", None, Value),
    ("cpuset-cpus", None, Value),
    ("shared-memory", None, Bool),
    ("hugepages", None, Bool),
    ("mergeable", None, Bool),
    ("no-watchdog", None, Bool),
    ("output", Some('o'), Value),
];
const CLONE: FlagSpec = &[
    ("name", None, Value),
    ("nics", None, Value),
    ("network", None, Value),
    ("bridge", None, Value),
    ("no-direct-io", None, Bool),
    ("queue-size", None, Value),
    ("disk-queue-size", None, Value),
    ("pull", None, Bool),
    ("restore-mode", None, Value),
    ("data-disk", None, Repeat),
    ("cpu-weight", None, Value),
    ("cpu-quota-us", None, Value),
    ("cpu-period-us", None, Value),
    ("cpu-burst-us", None, Value),
    ("cpuset-cpus", None, Value),
    ("from-dir", None, Value),
    ("output", Some('o'), Value),
];
const NONE: FlagSpec = &[];
const LIST: FlagSpec = &[("format", Some('o'), Value)];
const RM: FlagSpec = &[("force", None, Bool), ("output", Some('o'), Value)];
const START: FlagSpec = &[("output", Some('o'), Value)];
const STOP: FlagSpec = &[
    ("force", None, Bool),
    ("timeout", None, Value),
    ("output", Some('o'), Value),
];
const NET: FlagSpec = &[("nics", None, Value), ("output", Some('o'), Value)];
const EXEC: FlagSpec = &[("interactive", Some('i'), Bool), ("env", Some('e'), Repeat)];
const LOGS: FlagSpec = &[("tail", None, Value), ("follow", Some('f'), Bool)];
const STATUS: FlagSpec = &[
    ("event", None, Bool),
    ("watch", Some('w'), Bool),
    ("format", None, Value),
    ("interval", Some('n'), Value),
];

/// What a cocoon older than v0.5.8 lacks (the simulator's model of an old build: the verbs and
/// flags vk-cocoon sends arrived by then). Such a build answers them as cobra does.
const NEWER_VERBS: &[&str] = &["reconcile-stale-create", "exec", "net"];
const NEWER_FLAGS: &[&str] = &[
    "restore-mode",
    "from-dir",
    "cpu-weight",
    "cpu-quota-us",
    "cpu-period-us",
];

/// Whether `version` (`v0.5.7`, `v0.5.7-3-gabc`) is a release before v0.5.8; `unknown` is not.
fn predates_floor(version: &str) -> bool {
    let base = version
        .trim()
        .trim_start_matches('v')
        .split(['-', '+'])
        .next()
        .unwrap_or("");
    let parts: Vec<u64> = base.split('.').map_while(|p| p.parse().ok()).collect();
    matches!(parts.as_slice(), [major, minor, patch] if (*major, *minor, *patch) < (0, 5, 8))
}

pub fn dispatch(ctx: &Ctx, verb: &str, rest: &[String]) -> Res {
    if predates_floor(&ctx.control.settings.version) {
        if NEWER_VERBS.contains(&verb) {
            return Err(Fail::new(format!("unknown command \"{verb}\" for \"cocoon vm\"")));
        }
        if let Some(flag) = rest.iter().find_map(|t| {
            let name = t.strip_prefix("--")?.split('=').next()?;
            NEWER_FLAGS.contains(&name).then_some(name)
        }) {
            return Err(Fail::new(format!("unknown flag: --{flag}")));
        }
    }
    match verb {
        "run" | "create" => run(ctx, verb, &parse(rest, RUN)?),
        "clone" => clone(ctx, &parse(rest, CLONE)?),
        "inspect" => inspect(ctx, &parse(rest, NONE)?),
        "list" | "ls" => list(ctx, &parse(rest, LIST)?),
        "rm" => rm(ctx, &parse(rest, RM)?),
        "start" => start(ctx, &parse(rest, START)?),
        "stop" => stop(ctx, &parse(rest, STOP)?),
        "reconcile-stale-create" => reconcile_stale_create(ctx, &parse(rest, START)?),
        "net" => net(ctx, &parse(rest, NET)?),
        "exec" => exec(ctx, &parse(rest, EXEC)?),
        "logs" => logs(ctx, &parse(rest, LOGS)?),
        "status" => {
            let a = parse(rest, STATUS)?;
            if a.has("event") && a.has("watch") {
                return Err(Fail::new("--watch and --event are mutually exclusive"));
            }
            if a.has("event") {
                crate::events::run(ctx, &a.positionals)
            } else {
                list_out(ctx, a.get("format") == Some("json"))
            }
        }
        other => Err(Fail::new(format!("unknown command \"{other}\" for \"cocoon vm\""))),
    }
}

pub fn resolve_vm(state: &State, reference: &str) -> Result<String, Fail> {
    match resolve(
        reference,
        state.vms.iter().map(|(id, e)| (id, e.vm.config.name.as_str())),
    ) {
        Resolved::Found(id) => Ok(id),
        Resolved::NotFound => Err(Fail::new(format!("vm {reference}: VM not found"))),
        Resolved::Ambiguous => Err(Fail::new(format!("ambiguous ref \"{reference}\": multiple matches"))),
    }
}

pub fn sorted_vms(state: &State) -> Vec<&VmEntry> {
    let mut v: Vec<&VmEntry> = state.vms.values().collect();
    v.sort_by(|a, b| (a.vm.created_at.as_str(), a.seq).cmp(&(b.vm.created_at.as_str(), b.seq)));
    v
}

fn one_positional(a: &crate::cli::Args) -> Result<&str, Fail> {
    if a.positionals.len() != 1 {
        return Err(Fail::new(format!("accepts 1 arg(s), received {}", a.positionals.len())));
    }
    Ok(&a.positionals[0])
}

#[derive(Default, Clone, Copy)]
struct CpuPolicy {
    weight: i64,
    quota: i64,
    period: i64,
}

fn cpu_policy(a: &crate::cli::Args) -> Result<CpuPolicy, Fail> {
    let weight = a.int("cpu-weight")?.unwrap_or(0);
    let quota = a.int("cpu-quota-us")?.unwrap_or(0);
    let period = a.int("cpu-period-us")?.unwrap_or(0);
    if weight != 0 && !(1..=10000).contains(&weight) {
        return Err(Fail::new(format!("--cpu-weight must be 1..10000, got {weight}")));
    }
    if period != 0 && !(1000..=1_000_000).contains(&period) {
        return Err(Fail::new(format!(
            "--cpu-period-us must be 1000..1000000, got {period}"
        )));
    }
    if quota != 0 && quota < 1000 {
        return Err(Fail::new(format!("--cpu-quota-us must be at least 1000, got {quota}")));
    }
    Ok(CpuPolicy { weight, quota, period })
}

fn size_flag(a: &crate::cli::Args, name: &str, default: u64, min: u64, min_text: &str) -> Result<u64, Fail> {
    let v = match a.get(name) {
        None => default,
        Some(s) => ram_in_bytes(s).ok_or_else(|| Fail::new(format!("invalid --{name} {s:?}: invalid size")))?,
    };
    if v < min {
        return Err(Fail::new(format!("--{name} must be at least {min_text}, got {v}")));
    }
    Ok(v)
}

fn make_nics(state: &mut State, id: &str, count: i64, network: &str, mac_seed: u64, subnet: &str) -> Vec<Nic> {
    (0..count.max(0))
        .map(|i| {
            let m = mac_seed.wrapping_add(i as u64).to_be_bytes();
            let net = if network.contains("dhcp") {
                None
            } else {
                state.next_ip += 1;
                let n = state.next_ip + 1;
                Some(NicNetwork {
                    ip: format!("{subnet}.{}.{}", n / 250, n % 250 + 2),
                    gateway: format!("{subnet}.0.1"),
                    prefix: 16,
                })
            };
            Nic {
                tap: format!("tap{}-{i}", &id[..8]),
                mac: format!("02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[3], m[4], m[5], m[6], m[7]),
                num_queues: 2,
                queue_size: 512,
                backend: "cni".into(),
                netns_path: format!("/var/run/netns/cocoon-{id}"),
                network: net,
            }
        })
        .collect()
}

struct NewVm {
    name: String,
    hypervisor: String,
    config: VmConfig,
    nics: i64,
    reason: &'static str,
}

/// Writes the `creating` record, lets it turn `running` after `create_delay_ms`, prints the result.
fn create_and_boot(ctx: &Ctx, new: NewVm, start: bool, json: bool) -> Res {
    let now = now_rfc3339();
    let id = ctx.store.update(|state| -> Result<String, Fail> {
        if let Some(holder) = state.vms.values().find(|e| e.vm.config.name == new.name) {
            return Err(Fail::new(format!(
                "vm name \"{}\" already exists (held by {})",
                new.name, holder.vm.id
            )));
        }
        let id = crate::util::new_id();
        let seq = state.next_seq();
        let nics = make_nics(
            state,
            &id,
            new.nics,
            &new.config.network,
            seed_of(&id),
            &ctx.control.settings.static_subnet,
        );
        let backend_dir = if new.hypervisor == "firecracker" {
            "firecracker"
        } else {
            "cloudhypervisor"
        };
        let vm = Vm {
            id: id.clone(),
            hypervisor: new.hypervisor.clone(),
            state: "creating".into(),
            config: VmConfig {
                name: new.name.clone(),
                ..new.config.clone()
            },
            pid: 0,
            net_backend: if nics.is_empty() { String::new() } else { "cni".into() },
            netns_path: if nics.is_empty() {
                String::new()
            } else {
                format!("/var/run/netns/cocoon-{id}")
            },
            network_configs: nics,
            storage_configs: vec![
                StorageConfig {
                    path: format!("/var/lib/cocoon/oci/blobs/{}.erofs", &id[..8]),
                    ro: true,
                    serial: "cocoon-layer0".into(),
                    role: "layer".into(),
                },
                StorageConfig {
                    path: format!("/var/lib/cocoon/run/{backend_dir}/{id}/cow.raw"),
                    ro: false,
                    serial: "cocoon-cow".into(),
                    role: "cow".into(),
                },
            ],
            transition_generation: 1,
            last_transition_reason: "create".into(),
            last_transition_at: now.clone(),
            created_at: now.clone(),
            updated_at: now.clone(),
            ..Vm::default()
        };
        state.vms.insert(
            id.clone(),
            VmEntry {
                vm,
                stale: false,
                creator_pid: std::process::id(),
                seq,
                files: None,
            },
        );
        Ok(id)
    })?;
    ctx.die_here();
    if ctx.control.settings.create_delay_ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ctx.control.settings.create_delay_ms));
    }
    let vm = ctx.store.update(|state| -> Result<Vm, Fail> {
        let e = state
            .vms
            .get_mut(&id)
            .ok_or_else(|| Fail::new(format!("vm {id}: VM not found (removed while creating)")))?;
        let now = now_rfc3339();
        e.creator_pid = 0;
        if start {
            boot(&ctx.store.root, &ctx.control.settings, e, &now, new.reason)?;
        } else {
            e.vm.state = "created".into();
            e.vm.updated_at = now;
        }
        Ok(e.reconciled())
    })?;
    if json {
        print_json(&vm)
    } else {
        println!("{}", vm.id);
        Ok(())
    }
}

/// Starts the VM's VMM (a real process) and records it `running`.
pub fn boot(
    sim_root: &std::path::Path,
    settings: &crate::control::Settings,
    e: &mut VmEntry,
    now: &str,
    reason: &str,
) -> Result<(), Fail> {
    // A VMM left over from an earlier boot (a flip) goes first.
    crate::vmm::stop(sim_root, &e.vm.id, e.vm.pid, e.files.as_ref(), false);
    let tap = e.vm.network_configs.first().map(|n| n.tap.clone()).unwrap_or_default();
    let layout = crate::vmm::Layout::from_env(sim_root);
    let (pid, files) = crate::vmm::start(
        &crate::vmm::Boot {
            sim_root,
            id: &e.vm.id,
            name: &e.vm.config.name,
            hypervisor: &e.vm.hypervisor,
            cloudimg: e.vm.config.image_type == "cloudimg",
            storage: e.vm.config.storage,
            tap: &tap,
            rss_bytes: settings.vm_rss_bytes,
            cow_data_bytes: settings.vm_cow_data_bytes,
            net_tx_bytes: settings.vm_net_tx_bytes,
            ip: e
                .vm
                .network_configs
                .first()
                .and_then(|n| n.network.as_ref())
                .map(|n| n.ip.as_str()),
            guest_ports: &settings.guest_http_ports,
        },
        &layout,
    )
    .map_err(|err| Fail::new(format!("start VM {}: launch hypervisor: {err}", e.vm.id)))?;
    let backend_dir = if e.vm.hypervisor == "firecracker" {
        "firecracker"
    } else {
        "cloudhypervisor"
    };
    e.vm.state = "running".into();
    e.vm.pid = pid;
    e.vm.socket_path = files.run_dir.join("api.sock").display().to_string();
    for sc in &mut e.vm.storage_configs {
        if sc.role == "cow" {
            let cow = if e.vm.config.image_type == "cloudimg" && backend_dir != "firecracker" {
                "overlay.qcow2"
            } else {
                "cow.raw"
            };
            sc.path = files.run_dir.join(cow).display().to_string();
        }
    }
    e.files = Some(files);
    e.vm.first_booted = true;
    e.vm.started_at = Some(now.to_string());
    e.vm.stopped_at = None;
    e.vm.updated_at = now.to_string();
    e.vm.transition_generation += 1;
    e.vm.last_transition_reason = reason.into();
    e.vm.last_transition_at = now.to_string();
    e.stale = false;
    Ok(())
}

fn run(ctx: &Ctx, verb: &str, a: &crate::cli::Args) -> Res {
    let image = one_positional(a)?.to_string();
    let cpu = a.int("cpu")?.unwrap_or(2);
    if cpu < 1 {
        return Err(Fail::new(format!("--cpu must be at least 1, got {cpu}")));
    }
    let memory = size_flag(a, "memory", 1 << 30, 512 << 20, "512M")?;
    let storage = size_flag(a, "storage", 10 << 30, 10 << 30, "10G")?;
    let policy = cpu_policy(a)?;
    let fc = a.has("fc");
    let windows = a.has("windows");
    if fc && windows {
        return Err(Fail::new("--fc and --windows cannot be combined"));
    }
    let nics = a.int("nics")?.unwrap_or(1);
    let img = ctx
        .store
        .read(|s| s.images.get(&image).cloned())?
        .ok_or_else(|| Fail::new(format!("image \"{image}\" not resolved: not found in any backend")))?;
    if fc && img.kind != "oci" {
        return Err(Fail::new("--fc only supports OCI images"));
    }
    if windows && img.kind != "cloudimg" {
        return Err(Fail::new("--windows requires a cloudimg image"));
    }
    let default_name = {
        let base = image.rsplit('/').next().unwrap_or(&image).replace(':', "-");
        let mut n = format!("cocoon-{base}");
        n.truncate(63);
        n
    };
    let new = NewVm {
        name: a.get("name").map(str::to_string).unwrap_or(default_name),
        hypervisor: if fc { "firecracker" } else { "cloud-hypervisor" }.into(),
        config: VmConfig {
            cpu,
            memory,
            storage,
            image: image.clone(),
            image_digest: format!("sha256:{}", img.id),
            image_type: img.kind.clone(),
            network: a.get("network").unwrap_or("").into(),
            no_direct_io: a.has("no-direct-io"),
            windows,
            cpu_weight: policy.weight,
            cpu_quota_us: policy.quota,
            cpu_period_us: policy.period,
            name: String::new(),
        },
        nics,
        reason: "boot",
    };
    create_and_boot(ctx, new, verb == "run", a.get("output") == Some("json"))
}

fn clone(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let from_dir = a.get("from-dir");
    let snap = match (from_dir, a.positionals.as_slice()) {
        (Some(_), [_, ..]) => return Err(Fail::new("cannot use both a SNAPSHOT argument and --from-dir")),
        (Some(dir), []) => {
            let dir = std::path::Path::new(dir);
            let bytes = std::fs::read(dir.join("snapshot.json")).map_err(|e| {
                Fail::new(format!(
                    "clone --from-dir: read {}: {e}",
                    dir.join("snapshot.json").display()
                ))
            })?;
            let env: crate::model::Envelope = serde_json::from_slice(&bytes)
                .map_err(|e| Fail::new(format!("clone --from-dir: decode snapshot.json: {e}")))?;
            if env.version != 1 {
                return Err(Fail::new(format!(
                    "unsupported snapshot archive version {}",
                    env.version
                )));
            }
            if !dir.join("cow.raw").exists() && !dir.join("overlay.qcow2").exists() {
                return Err(Fail::new(format!(
                    "clone --from-dir: COW file missing in {}",
                    dir.display()
                )));
            }
            env.config
        }
        (None, [r]) => ctx.store.read(|s| {
            let live = s.snapshots.iter().filter(|(_, e)| !e.pending);
            match resolve(r, live.clone().map(|(id, e)| (id, e.record.config.name.as_str()))) {
                Resolved::Found(id) => Ok(s.snapshots[&id].record.config.clone()),
                Resolved::NotFound => Err(Fail::new(format!("resolve snapshot \"{r}\": snapshot not found"))),
                Resolved::Ambiguous => Err(Fail::new(format!("ambiguous ref \"{r}\": multiple matches"))),
            }
        })??,
        (None, p) => return Err(Fail::new(format!("accepts 1 arg(s), received {}", p.len()))),
    };
    let policy = cpu_policy(a)?;
    let fc = snap.hypervisor == "firecracker";
    if let Some(mode) = a.get("restore-mode") {
        if !["copy", "ondemand", "mmap"].contains(&mode) {
            return Err(Fail::new(format!(
                "invalid --restore-mode {mode:?}: must be copy, ondemand or mmap"
            )));
        }
        if fc {
            return Err(Fail::new("--restore-mode is only supported by cloud-hypervisor"));
        }
    }
    let nics = a.int("nics")?;
    if fc && nics.is_some_and(|n| n != snap.nics) {
        return Err(Fail::new("firecracker restore cannot change the NIC count"));
    }
    if !snap.image.is_empty() {
        let have = ctx.store.read(|s| s.images.contains_key(&snap.image))?;
        if !have {
            if a.has("pull") {
                let (image, kind) = (snap.image.clone(), snap.image_type.clone());
                ctx.store.update(|s| -> Result<(), Fail> {
                    crate::image::add_image(s, &image, if kind.is_empty() { "oci" } else { &kind }, 4096);
                    Ok(())
                })?;
            } else {
                return Err(Fail::new(format!(
                    "image \"{}\" not resolved: not found in any backend",
                    snap.image
                )));
            }
        }
    }
    let new = NewVm {
        name: a
            .get("name")
            .map(str::to_string)
            .unwrap_or_else(|| format!("cocoon-clone-{}", &crate::util::new_id()[..8])),
        hypervisor: if snap.hypervisor.is_empty() {
            "cloud-hypervisor".into()
        } else {
            snap.hypervisor.clone()
        },
        config: VmConfig {
            cpu: snap.cpu,
            memory: snap.memory,
            storage: snap.storage,
            image: snap.image.clone(),
            image_digest: snap.image_digest.clone(),
            image_type: snap.image_type.clone(),
            network: a.get("network").map(str::to_string).unwrap_or(snap.network.clone()),
            no_direct_io: a.has("no-direct-io") || snap.no_direct_io,
            windows: snap.windows,
            cpu_weight: policy.weight,
            cpu_quota_us: policy.quota,
            cpu_period_us: policy.period,
            name: String::new(),
        },
        nics: nics.unwrap_or(if snap.nics == 0 { 1 } else { snap.nics }),
        reason: "clone",
    };
    create_and_boot(ctx, new, true, a.get("output") == Some("json"))
}

fn inspect(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let r = one_positional(a)?;
    let vm = ctx
        .store
        .read(|s| resolve_vm(s, r).map(|id| s.vms[&id].reconciled()))?
        .map_err(|f| Fail::new(format!("inspect: {}", f.msg)))?;
    print_json(&vm)
}

fn list(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    list_out(ctx, a.get("format") == Some("json"))
}

fn list_out(ctx: &Ctx, json: bool) -> Res {
    let vms: Vec<Vm> = ctx
        .store
        .read(|s| sorted_vms(s).into_iter().map(VmEntry::reconciled).collect())?;
    if vms.is_empty() && (!json || ctx.control.settings.legacy_empty_list) {
        println!("No VMs found.");
        return Ok(());
    }
    if json {
        return print_json(&vms);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "ID\tNAME\tSTATE\tCPU\tMEMORY\tSTORAGE\tIP\tIMAGE\tCREATED")?;
    for v in vms {
        let ip = v
            .network_configs
            .iter()
            .filter_map(|n| n.network.as_ref().map(|x| x.ip.clone()))
            .collect::<Vec<_>>()
            .join(",");
        writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            v.id,
            v.config.name,
            v.state,
            v.config.cpu,
            v.config.memory,
            v.config.storage,
            ip,
            v.config.image,
            v.created_at
        )?;
    }
    Ok(())
}

#[derive(Serialize)]
struct Succeeded {
    succeeded: Vec<String>,
}

fn refs(a: &crate::cli::Args) -> Result<&[String], Fail> {
    if a.positionals.is_empty() {
        return Err(Fail::new("requires at least 1 arg(s), only received 0"));
    }
    Ok(&a.positionals)
}

fn rm(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let refs = refs(a)?;
    let force = a.has("force");
    let ids = ctx.store.update(|s| -> Result<Vec<String>, Fail> {
        let ids = refs.iter().map(|r| resolve_vm(s, r)).collect::<Result<Vec<_>, _>>()?;
        for id in &ids {
            let e = &s.vms[id];
            if e.vm.state == "running" && !e.stale && !force {
                return Err(Fail::new(format!(
                    "vm {id}: VM is running, stop it first or use --force"
                )));
            }
        }
        for id in &ids {
            if let Some(e) = s.vms.remove(id) {
                crate::vmm::stop(&ctx.store.root, id, e.vm.pid, e.files.as_ref(), true);
            }
        }
        Ok(ids)
    })?;
    for id in &ids {
        log(&format!("deleted: {id}"));
    }
    if a.get("output") == Some("json") {
        print_json(&Succeeded { succeeded: ids })?;
    }
    Ok(())
}

fn start(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let refs = refs(a)?;
    let ids = ctx.store.update(|s| -> Result<Vec<String>, Fail> {
        let ids = refs.iter().map(|r| resolve_vm(s, r)).collect::<Result<Vec<_>, _>>()?;
        for id in &ids {
            let e = s.vms.get_mut(id).expect("resolved");
            if e.vm.state == "creating" {
                return Err(Fail::new(format!("vm {id}: VM is still being created")));
            }
            if e.reconciled().state != "running" {
                boot(&ctx.store.root, &ctx.control.settings, e, &now_rfc3339(), "restart")?;
            }
        }
        Ok(ids)
    })?;
    if a.get("output") == Some("json") {
        print_json(&Succeeded { succeeded: ids })?;
    }
    Ok(())
}

fn stop(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let refs = refs(a)?;
    let ids = ctx.store.update(|s| -> Result<Vec<String>, Fail> {
        let ids = refs.iter().map(|r| resolve_vm(s, r)).collect::<Result<Vec<_>, _>>()?;
        for id in &ids {
            let e = s.vms.get_mut(id).expect("resolved");
            mark_stopped(&ctx.store.root, e, "stop-user");
        }
        Ok(ids)
    })?;
    if a.get("output") == Some("json") {
        print_json(&Succeeded { succeeded: ids })?;
    }
    Ok(())
}

/// Stops the VM's VMM and records it `stopped`.
pub fn mark_stopped(sim_root: &std::path::Path, e: &mut VmEntry, reason: &str) {
    crate::vmm::stop(sim_root, &e.vm.id, e.vm.pid, e.files.as_ref(), false);
    let now = now_rfc3339();
    e.vm.state = "stopped".into();
    e.vm.pid = 0;
    e.vm.socket_path.clear();
    e.vm.stopped_at = Some(now.clone());
    e.vm.updated_at = now.clone();
    e.vm.transition_generation += 1;
    e.vm.last_transition_reason = reason.into();
    e.vm.last_transition_at = now.clone();
    e.stale = false;
}

#[derive(Serialize, Deserialize)]
struct Outcome {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    outcome: String,
}

fn pid_alive(pid: u32) -> bool {
    pid != 0 && unsafe { libc::kill(pid as i32, 0) } == 0
}

fn reconcile_stale_create(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let r = one_positional(a)?;
    let out = ctx.store.update(|s| -> Result<Outcome, Fail> {
        let id = match resolve_vm(s, r) {
            Ok(id) => id,
            Err(_) => {
                return Ok(Outcome {
                    id: None,
                    outcome: "not-found".into(),
                });
            }
        };
        let e = &s.vms[&id];
        let outcome = if e.vm.state != "creating" {
            "not-creating"
        } else if pid_alive(e.creator_pid) {
            "busy"
        } else {
            s.vms.remove(&id);
            "collected"
        };
        Ok(Outcome {
            id: Some(id),
            outcome: outcome.into(),
        })
    })?;
    if a.get("output") == Some("json") {
        print_json(&out)
    } else {
        println!("{}: {}", out.id.unwrap_or_default(), out.outcome);
        Ok(())
    }
}

fn net(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let r = one_positional(a)?;
    let n = a
        .int("nics")?
        .ok_or_else(|| Fail::new("required flag(s) \"nics\" not set"))?;
    if n < 0 {
        return Err(Fail::new(format!("--nics must be >= 0, got {n}")));
    }
    let id = ctx.store.update(|s| -> Result<String, Fail> {
        let id = resolve_vm(s, r)?;
        if s.vms[&id].vm.hypervisor == "firecracker" {
            return Err(Fail::new(format!(
                "vm {id}: NIC resize is not supported by firecracker"
            )));
        }
        let (network, have) = (
            s.vms[&id].vm.config.network.clone(),
            s.vms[&id].vm.network_configs.len() as i64,
        );
        let extra = if n > have {
            make_nics(s, &id, n, &network, seed_of(&id), &ctx.control.settings.static_subnet).split_off(have as usize)
        } else {
            Vec::new()
        };
        let e = s.vms.get_mut(&id).expect("resolved");
        e.vm.network_configs.truncate(n as usize);
        e.vm.network_configs.extend(extra);
        e.vm.updated_at = now_rfc3339();
        Ok(id)
    })?;
    if a.get("output") == Some("json") {
        print_json(&Succeeded { succeeded: vec![id] })?;
    }
    Ok(())
}

fn exec(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let r = a
        .positionals
        .first()
        .ok_or_else(|| Fail::new("exec: requires a VM argument"))?;
    let mut argv: Vec<String> = a.positionals[1..].to_vec();
    argv.extend(a.rest.iter().cloned());
    if argv.is_empty() {
        return Err(Fail::new("exec: no command given"));
    }
    let mut env = Vec::new();
    for kv in a.all("env") {
        if !kv.contains('=') || kv.starts_with('=') {
            return Err(Fail::new(format!("exec: --env {kv:?} must be KEY=VALUE")));
        }
        env.push(kv);
    }
    let (id, name, running) = ctx.store.read(|s| {
        resolve_vm(s, r).map(|id| {
            (
                id.clone(),
                s.vms[&id].vm.config.name.clone(),
                s.vms[&id].reconciled().state == "running",
            )
        })
    })??;
    if !running {
        return Err(Fail::new(format!("exec: vm {id}: VM not running")));
    }
    let rule = Control::take_exec(&ctx.store, &id, &name, &argv)?;
    if rule.as_ref().is_some_and(|r| r.run) {
        return run_for_real(ctx, id, name, argv, env, a.has("interactive"));
    }
    let mut stdin = Vec::new();
    if a.has("interactive") {
        std::io::stdin().read_to_end(&mut stdin)?;
    }
    let (code, out, err) = match &rule {
        Some(r) => (r.exit_code, r.stdout.as_bytes().to_vec(), r.stderr.clone()),
        None => (0, stdin.clone(), String::new()),
    };
    let record = crate::helper::ExecRecord {
        vm_id: id,
        vm_name: name,
        argv,
        env,
        interactive: a.has("interactive"),
        stdin: String::from_utf8_lossy(&stdin).into_owned(),
        exit_code: code,
        at: now_rfc3339(),
    };
    ctx.store.append_jsonl("exec.log", &record)?;
    std::io::stdout().write_all(&out)?;
    std::io::stdout().flush()?;
    eprint!("{err}");
    if code != 0 {
        return Err(Fail::silent(code));
    }
    Ok(())
}

/// The uid and gid of `nobody`, which guest commands run as when the simulator is root.
const NOBODY: u32 = 65534;

/// `vm exec` of an [`ExecRule::run`] rule: the argv as a real child with this process's stdio
/// (stdin only with `-i`), which the kernel kills if this process dies (PR_SET_PDEATHSIG).
fn run_for_real(ctx: &Ctx, id: String, name: String, argv: Vec<String>, env: Vec<String>, interactive: bool) -> Res {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let parent = std::process::id() as i32;
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .envs(env.iter().filter_map(|kv| kv.split_once('=')))
        .stdin(if interactive {
            std::process::Stdio::inherit()
        } else {
            std::process::Stdio::null()
        })
        .current_dir("/");
    // The simulated guest is this machine: a command meant for a guest (the daemon's post-clone
    // fixups write /etc/hostname and restart systemd-networkd) must not change the host. Run as
    // root, the simulator runs it as `nobody`, so such a command fails instead.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.uid(NOBODY).gid(NOBODY); // std drops the supplementary groups too
    }
    // SAFETY: prctl and getppid are async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 || libc::getppid() != parent {
                // The parent is already gone: so is the session this command was for.
                libc::_exit(137);
            }
            Ok(())
        });
    }
    let status = cmd
        .status()
        .map_err(|e| Fail::new(format!("exec: start {:?} in VM {id}: {e}", argv[0])))?;
    let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    let record = crate::helper::ExecRecord {
        vm_id: id,
        vm_name: name,
        argv,
        env,
        interactive,
        stdin: String::new(),
        exit_code: code,
        at: now_rfc3339(),
    };
    ctx.store.append_jsonl("exec.log", &record)?;
    if code != 0 {
        return Err(Fail::silent(code));
    }
    Ok(())
}

fn logs(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let r = one_positional(a)?;
    let (id, hypervisor, files) = ctx.store.read(|s| {
        resolve_vm(s, r).map(|id| {
            let e = &s.vms[&id];
            (id.clone(), e.vm.hypervisor.clone(), e.files.clone())
        })
    })??;
    let path = files.map(|f| f.log_file).unwrap_or_else(|| {
        crate::vmm::Layout::from_env(&ctx.store.root)
            .files(&hypervisor, &id)
            .log_file
    });
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Fail::new(format!(
                "open log {}: VM may not have been started yet",
                path.display()
            )));
        }
        Err(e) => return Err(Fail::new(format!("open log: {e}"))),
    };
    let tail = a.int("tail")?.filter(|t| *t > 0).map(|t| t as usize);
    let start = match tail {
        Some(n) => tail_start(&text, n),
        None => 0,
    };
    let mut out = std::io::stdout().lock();
    out.write_all(&text[start..])?;
    out.flush()?;
    if a.has("follow") {
        let mut offset = text.len();
        loop {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let Ok(now) = std::fs::read(&path) else { return Ok(()) };
            if now.len() < offset {
                offset = 0;
            }
            out.write_all(&now[offset..])?;
            out.flush()?;
            offset = now.len();
        }
    }
    Ok(())
}

/// Where the last `n` lines start; a final `\n` does not count as a separator (cocoon's
/// `seekToLastNLines`).
fn tail_start(text: &[u8], n: usize) -> usize {
    let end = if text.ends_with(b"\n") {
        text.len() - 1
    } else {
        text.len()
    };
    let mut found = 0;
    for i in (0..end).rev() {
        if text[i] == b'\n' {
            found += 1;
            if found == n {
                return i + 1;
            }
        }
    }
    0
}
