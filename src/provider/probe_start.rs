//! Starting a pod's probe agent: its target (the guest's address, when the guest networks admit
//! it; a macOS guest's once cocoon-macos shows its MAC) and its flip hooks (repair the IP
//! annotation, then republish the status). The boot finish, the macOS adoption and the startup
//! reconcile start probes here.

use std::sync::Arc;

use super::CocoonProvider;
use super::mac_guest;
use crate::kubelet_api::source::GuestAddress;

/// Starts the probe agent of the tracked incarnation (first probe before returning).
pub(super) async fn start_probe(p: &CocoonProvider, key: &str, uid: &str) {
    let Some(tracked) = p.state.tracked_as(key, uid) else {
        return;
    };
    if tracked.pod.metadata.deletion_timestamp.is_some() {
        return;
    }
    let me = p.me.clone();
    let (k, u) = (key.to_string(), uid.to_string());
    // When this pod's macOS guest was last inspected for its MAC (dies with the probe).
    let last_inspect = std::sync::Mutex::new(None);
    let target: super::probe::TargetFn = Arc::new(move || {
        let p = me.upgrade()?;
        let t = p.state.tracked_as(&k, &u)?;
        // Only an address the guest networks admit is probed (a refusal is the pod's Ready
        // message); a pending lease is "" to the targets, which say so.
        let ip = match t
            .vm
            .as_ref()
            .map(|vm| super::serving::guest_address(&p, &k, &t.pod, vm))
        {
            Some(GuestAddress::Ip(ip)) => ip.to_string(),
            Some(GuestAddress::Refused(why)) => {
                let ip = t.vm.as_ref().map(|vm| p.resolve_ip(vm)).unwrap_or_default();
                p.refused_targets.report(&ip, &why);
                return Some(super::probe::Target::Unready(format!("not probed: {why}")));
            }
            Some(GuestAddress::Pending(_)) | None => String::new(),
        };
        let probe = crate::model::vm_spec::of_pod(&t.pod).probe;
        if let Some(vm) = t.vm.as_ref().filter(|vm| mac_guest::is_macos_vm(vm)) {
            if vm.network_configs.is_empty() {
                mac_guest::reinspect_for_mac(&p, &k, &u, vm.name(), &last_inspect);
                return Some(super::probe::Target::Unready(
                    "waiting for the guest's network interface (no MAC in cocoon-macos vm inspect yet)".into(),
                ));
            }
            return Some(super::probe::macos_target(true, &ip, &probe));
        }
        Some(super::probe::target(t.vm.is_some(), &ip, &probe))
    });
    let (me, announcer) = (p.me.clone(), p.me.clone());
    let (k, u, announced) = (key.to_string(), uid.to_string(), key.to_string());
    let on_flip = super::probe::FlipHooks {
        prepare: Arc::new(move |_ready| {
            let (me, k, u) = (me.clone(), k.clone(), u.clone());
            Box::pin(async move {
                if let Some(p) = me.upgrade() {
                    repair_endpoint_on_flip(&p, &k, &u).await;
                }
            })
        }),
        announce: Arc::new(move |_ready| {
            if let Some(p) = announcer.upgrade() {
                p.notify(&announced);
            }
        }),
    };
    p.probes.start(key, uid, target, on_flip).await;
}

/// A probe agent saw readiness flip: repair the endpoint annotation (before the new
/// readiness is visible to the status, which is republished after).
async fn repair_endpoint_on_flip(p: &CocoonProvider, key: &str, uid: &str) {
    let Some(tracked) = p.state.tracked_as(key, uid) else {
        return;
    };
    if let Some(vm) = &tracked.vm {
        super::endpoint::reconcile_endpoint(p, &tracked.pod, key, vm).await;
    }
}
