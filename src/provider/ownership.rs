//! A pod reaches only what is its own. Every VM name is held by one pod (`table::Holders`): the
//! pod that created the VM of that name or first adopted it. From that follow the host's rules,
//! which no policy can change:
//!
//! - a VM name another pod that exists now holds is never this pod's: CreatePod refuses it
//!   (`VMOwnedByAnotherPod`) before anything is looked up or booted, and an unmanaged pod may
//!   not pre-assign such a VM's id, name, id prefix or guest address;
//! - a bring-up takes its VM name only when its plan proceeds, atomically (of two pods racing
//!   for one name, one gets it);
//! - DeletePod, the kubelet API and the stats reach only a VM whose name the pod holds.
//!
//! Everything else that crosses pods — a VM or saved state whose holder is gone, a fork of
//! another pod's VM, a clone of its snapshot — is the bring-up policy's to decide, with the
//! holders as facts ([`BringUpHolders`]).

use std::net::IpAddr;

use super::CocoonProvider;
use super::failure::Failure;
use super::plan;
use super::table::{Holder, NameClaim};
use crate::kubelet::EventReason;
use crate::model::VmSpec;
use crate::policy::contract::types::{self as contract, BootMode, RefusalKind};

fn refusal(message: String) -> Failure {
    // The other pod may go (then the name is free): re-checked at the operator's pace.
    Failure {
        reason: EventReason::VmOwnedByAnotherPod,
        message,
        kind: RefusalKind::NeedsOperator,
    }
}

fn key_of(h: &Holder) -> String {
    format!("{}/{}", h.namespace, h.pod)
}

/// The holder as the contract states it.
fn fact(holder: Holder, live: bool) -> contract::Holder {
    contract::Holder {
        namespace: holder.namespace,
        pod: holder.pod,
        uid: holder.uid,
        live,
    }
}

/// Refuses a VM name another pod that exists now holds.
pub(super) fn refuse_held_name(p: &CocoonProvider, key: &str, vm_name: &str) -> Result<(), Failure> {
    match p.state.name_claim(vm_name, key) {
        NameClaim::Other { holder, live: true } => Err(refusal(format!(
            "vm {vm_name} belongs to pod {}: a pod may only run a VM of its own; give this pod another vm.cocoonstack.io/name",
            key_of(&holder)
        ))),
        _ => Ok(()),
    }
}

/// The pod takes its VM name now that its plan proceeds (unless another live pod got it
/// meanwhile).
pub(super) fn take_name(p: &CocoonProvider, key: &str, uid: &str, vm_name: &str) -> Result<(), Failure> {
    p.state.take_name(vm_name, key, uid).map_err(|holder| {
        refusal(format!(
            "vm {vm_name} was taken by pod {} while this pod was being brought up; give this pod another vm.cocoonstack.io/name",
            key_of(&holder)
        ))
    })
}

/// The VM of another pod an unmanaged pod's pre-assigned id (as a cocoon ref) or guest
/// address reaches on this node: its name.
fn preassigned_vm(p: &CocoonProvider, key: &str, vm_id: &str, ip: &str) -> Option<String> {
    if let Some(name) = p.state.foreign_vm_of_ref(vm_id, key) {
        return Some(name);
    }
    let ip: IpAddr = ip.trim().parse().ok()?;
    let mut hit = None;
    p.state.for_each_foreign_vm(key, |name, vm| {
        if hit.is_none() && p.resolve_ip(vm).parse::<IpAddr>().ok() == Some(ip) {
            hit = Some(name.to_string());
        }
    });
    hit
}

/// Refuses an unmanaged pod whose pre-assigned id or address is another live pod's VM.
pub(super) fn refuse_held_preassigned(
    p: &CocoonProvider,
    key: &str,
    spec: &VmSpec,
    vm_id: &str,
    ip: &str,
) -> Result<(), Failure> {
    if spec.managed {
        return Ok(());
    }
    let Some(name) = preassigned_vm(p, key, vm_id, ip) else {
        return Ok(());
    };
    match p.state.holder_of(&name) {
        Some((holder, true)) if holder.key() != key => Err(refusal(format!(
            "the pre-assigned vm.cocoonstack.io/id {vm_id:?} / ip {ip:?} of unmanaged vm {} reach vm {name} of pod {}: a pod may only run a VM of its own",
            spec.vm_name,
            key_of(&holder)
        ))),
        _ => Ok(()),
    }
}

/// The holders the bring-up policy is told about.
pub(super) struct BringUpHolders {
    pub previous: Option<contract::Holder>,
    pub fork_source: Option<contract::Holder>,
    pub image: Option<contract::Holder>,
    pub preassigned: Option<contract::Holder>,
}

/// The VM name a local snapshot belongs to: `<vm>` (its hibernated or kept state),
/// `fork-<vm>` (its fork baseline), `<vm>-hibernate-import` (a wake's import), when such a
/// VM name is held.
fn snapshot_lineage(p: &CocoonProvider, snapshot: &str) -> Option<(Holder, bool)> {
    let candidates = [
        Some(snapshot),
        snapshot.strip_prefix("fork-"),
        snapshot.strip_suffix("-hibernate-import"),
    ];
    candidates
        .into_iter()
        .flatten()
        .find_map(|name| p.state.holder_of(name))
}

pub(super) fn bring_up_holders(p: &CocoonProvider, key: &str, spec: &VmSpec, vm_id: &str, ip: &str) -> BringUpHolders {
    let other = |found: Option<(Holder, bool)>| found.filter(|(h, _)| h.key() != key).map(|(h, live)| fact(h, live));
    let image = (spec.managed && spec.mode == BootMode::Clone && !spec.image.is_empty())
        .then(|| {
            let (repo, tag) = plan::parse_ref(&spec.image);
            snapshot_lineage(p, &plan::local_snapshot_name(repo, tag))
        })
        .flatten();
    BringUpHolders {
        previous: other(p.state.holder_of(&spec.vm_name)),
        fork_source: (!spec.fork_from.is_empty())
            .then(|| p.state.holder_of(&spec.fork_from))
            .flatten()
            .map(|(h, live)| fact(h, live)),
        image: other(image),
        preassigned: if spec.managed {
            None
        } else {
            other(preassigned_vm(p, key, vm_id, ip).and_then(|name| p.state.holder_of(&name)))
        },
    }
}
