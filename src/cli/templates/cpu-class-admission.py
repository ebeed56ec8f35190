"""A cpu-class-admission policy: a pod pinning a snapshot CPU class
(cocoonstack.io/snapshot-cpu-class in its node selector) runs only on a node of that class.
Replace the rule with yours; the case table beside this file pins what it decides
(vk-cocoon policy test .).

The host grants no WASI (build.sh builds with --stub-wasi): time.time() and os.urandom() trap
inside a decision, which fails it (the host then rejects the pod). Decide from the facts.
"""

from wit_world import exports
from wit_world.exports import cpu_class_admission as admission
from wit_world.imports import types

CPU_CLASS_SELECTOR = "cocoonstack.io/snapshot-cpu-class"


class CpuClassAdmission(exports.CpuClassAdmission):
    def decide(self, facts: admission.Facts) -> admission.Decision:
        pod = facts.pod
        pinned = next((kv.value for kv in pod.node_selector if kv.key == CPU_CLASS_SELECTOR), "")
        if not pinned or pinned == facts.node_class:
            return admission.Decision(
                verdict=admission.Verdict_Admit(),
                reason="admitted",
                message=f"pod {pod.namespace}/{pod.name} may run on node {facts.node_name}",
            )
        refusal = types.Refusal(kind=types.RefusalKind.PERMANENT, event=types.EventReason.SNAPSHOT_CPU_CLASS_MISMATCH)
        return admission.Decision(
            verdict=admission.Verdict_Reject(refusal),
            reason="class-mismatch",
            message=f'pod {pod.namespace}/{pod.name} requires CPU class "{pinned}" but node {facts.node_name} provides "{facts.node_class}"',
        )
