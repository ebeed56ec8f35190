//! The pod's IP annotation kept on its VM's address: the status reconciler, the lease wait and
//! a probe's readiness flip all repair it here.

use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use crate::runtime::VmRecord;

/// The IP annotation follows the VM's resolved IP (cocoon-net may rebind a MAC) — only while
/// the VM is the pod's live guest. A hibernate clears the annotation before it removes the
/// VM; writing the address back then would leave a hibernated pod naming a lease cocoon-net
/// may hand to another guest. The table's copy of the pod is checked as well as the one read:
/// it sees the hibernate request before the hibernate starts, a read may predate it.
pub(super) async fn reconcile_endpoint(p: &CocoonProvider, pod: &Pod, key: &str, vm: &VmRecord) {
    let hibernating = |pod: &Pod| crate::model::vm_spec::of_pod(pod).hibernate;
    let live = p
        .state
        .tracked(key)
        .is_some_and(|t| !hibernating(&t.pod) && t.vm.as_ref().is_some_and(|v| v.id == vm.id));
    if hibernating(pod) || !live {
        return;
    }
    let ip = p.resolve_ip(vm);
    let annotated = crate::model::RuntimeAnnotations::of_pod(pod).ip;
    let annotated = annotated.as_str();
    if !ip.is_empty() && ip != annotated && crate::model::vm_spec::of_pod(pod).managed {
        tracing::info!(pod = %key, vm = %vm.id, from = annotated, to = %ip, "vm ip changed; updating the ip annotation");
        super::publish::write_runtime(p, pod, key, "", &ip).await;
    }
}
