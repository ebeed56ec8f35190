//! `vm run`, `vm create` and `vm clone`: the record written `creating`, the boot, the result.

use super::*;

struct NewVm {
    name: String,
    hypervisor: String,
    config: VmConfig,
    nics: i64,
    reason: &'static str,
}

/// cocoon's VM name rule (`types/vm.go`: `VMConfig.Validate`), checked on run, create and clone.
const VM_NAME_RULE: &str = "^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$";

fn check_vm_name(name: &str) -> Result<(), Fail> {
    let b = name.as_bytes();
    if b.is_empty() {
        return Err(Fail::new("vm name cannot be empty"));
    }
    let valid = b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c));
    if valid {
        Ok(())
    } else {
        Err(Fail::new(format!(
            "vm name {name:?} is invalid: must match {VM_NAME_RULE} (max 63 chars)"
        )))
    }
}

/// Writes the `creating` record, lets it turn `running` after `create_delay_ms`, prints the result.
fn create_and_boot(ctx: &Ctx, new: NewVm, start: bool, json: bool) -> Res {
    check_vm_name(&new.name)?;
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
            windows: e.vm.config.windows,
            nics: e.vm.network_configs.len(),
            console_silent: settings.console_silent,
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

pub(super) fn run(ctx: &Ctx, verb: &str, a: &crate::cli::Args) -> Res {
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

pub(super) fn clone(ctx: &Ctx, a: &crate::cli::Args) -> Res {
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
