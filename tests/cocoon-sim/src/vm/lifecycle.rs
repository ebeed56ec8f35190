//! `vm inspect`, `vm list` (and `vm status` without `--event`), `vm rm`, `vm start`, `vm stop`,
//! `vm reconcile-stale-create`.

use super::*;

pub(super) fn inspect(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    let r = one_positional(a)?;
    let vm = ctx
        .store
        .read(|s| resolve_vm(s, r).map(|id| s.vms[&id].reconciled()))?
        .map_err(|f| Fail::new(format!("inspect: {}", f.msg)))?;
    print_json(&vm)
}

pub(super) fn list(ctx: &Ctx, a: &crate::cli::Args) -> Res {
    list_out(ctx, a.get("format") == Some("json"))
}

pub(super) fn list_out(ctx: &Ctx, json: bool) -> Res {
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
pub(super) struct Succeeded {
    pub(super) succeeded: Vec<String>,
}

pub(super) fn refs(a: &crate::cli::Args) -> Result<&[String], Fail> {
    if a.positionals.is_empty() {
        return Err(Fail::new("requires at least 1 arg(s), only received 0"));
    }
    Ok(&a.positionals)
}

pub(super) fn rm(ctx: &Ctx, a: &crate::cli::Args) -> Res {
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

pub(super) fn start(ctx: &Ctx, a: &crate::cli::Args) -> Res {
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

pub(super) fn stop(ctx: &Ctx, a: &crate::cli::Args) -> Res {
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

pub(super) fn pid_alive(pid: u32) -> bool {
    pid != 0 && unsafe { libc::kill(pid as i32, 0) } == 0
}

pub(super) fn reconcile_stale_create(ctx: &Ctx, a: &crate::cli::Args) -> Res {
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
