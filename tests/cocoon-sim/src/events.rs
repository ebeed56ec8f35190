//! `vm status --event --format json`: ADDED for every VM, then ADDED/MODIFIED/DELETED as the state changes.
//! Every emitted event is also appended to `events.log` (tests wait on it: once the stream has
//! reported a VM, a later change of it is seen on the next poll).

use crate::cli::{Ctx, Res};
use crate::model::Vm;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

#[derive(Serialize)]
struct Event<'a> {
    event: &'a str,
    vm: &'a Vm,
}

/// What cocoon compares to decide that a VM changed (id, name, state, cpu, memory, IPs, image): a
/// new id is ADDED, a changed tuple MODIFIED; other fields (the pid) raise no event.
fn key(vm: &Vm) -> (String, String, String, i64, u64, String, String) {
    let ips = vm
        .network_configs
        .iter()
        .filter_map(|n| n.network.as_ref().map(|x| x.ip.clone()))
        .collect::<Vec<_>>()
        .join(",");
    (
        vm.id.clone(),
        vm.config.name.clone(),
        vm.state.clone(),
        vm.config.cpu,
        vm.config.memory,
        ips,
        vm.config.image.clone(),
    )
}

fn matches(vm: &Vm, filters: &[String]) -> bool {
    filters.is_empty()
        || filters
            .iter()
            .any(|f| *f == vm.id || *f == vm.config.name || (f.len() >= 3 && vm.id.starts_with(f.as_str())))
}

/// One line of `events.log`: what a `vm status --event` process reported.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct EmittedEvent {
    /// The `vm status --event` process that printed it.
    pub pid: u32,
    pub event: String,
    pub vm_id: String,
    pub vm_name: String,
    pub state: String,
}

pub fn run(ctx: &Ctx, filters: &[String]) -> Res {
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    let poll = std::time::Duration::from_millis(ctx.control.settings.event_poll_ms.max(10));
    let mut seen: BTreeMap<String, Vm> = BTreeMap::new();
    while !STOP.load(Ordering::SeqCst) {
        let now: Vec<Vm> = ctx.store.read(|s| {
            crate::vm::sorted_vms(s)
                .into_iter()
                .map(|e| e.reconciled())
                .filter(|v| matches(v, filters))
                .collect()
        })?;
        let mut out = std::io::stdout().lock();
        let mut emitted = Vec::new();
        let mut emit = |event: &str, vm: &Vm| -> std::io::Result<()> {
            let mut line = serde_json::to_vec(&Event { event, vm }).map_err(std::io::Error::other)?;
            line.push(b'\n');
            out.write_all(&line)?;
            emitted.push(EmittedEvent {
                pid: std::process::id(),
                event: event.to_string(),
                vm_id: vm.id.clone(),
                vm_name: vm.config.name.clone(),
                state: vm.state.clone(),
            });
            Ok(())
        };
        let mut next = BTreeMap::new();
        for vm in &now {
            match seen.get(&vm.id) {
                None => emit("ADDED", vm)?,
                Some(old) if key(old) != key(vm) => emit("MODIFIED", vm)?,
                Some(_) => {}
            }
            next.insert(vm.id.clone(), vm.clone());
        }
        for (id, old) in &seen {
            if !next.contains_key(id) {
                emit("DELETED", old)?;
            }
        }
        // Keep the last-seen record per id only when its tuple changed, like cocoon.
        for (id, vm) in next {
            match seen.get(&id) {
                Some(old) if key(old) == key(&vm) => {}
                _ => {
                    seen.insert(id, vm);
                }
            }
        }
        seen.retain(|id, _| now.iter().any(|v| &v.id == id));
        out.flush()?;
        drop(out);
        // Logged after the flush: a test that reads it knows the daemon can read the line too.
        for e in &emitted {
            ctx.store.append_jsonl("events.log", e)?;
        }
        std::thread::sleep(poll);
    }
    Ok(())
}
