"""A resource-translation policy: every VM gets cgroup v2's default CPU weight (100) and no CPU
quota; on the run path cocoon's own defaults size the guest. Replace the rule with yours (the
default policy converts the pod's requests and limits as the kubelet does); the case table
beside this file pins what it decides (vk-cocoon policy test .).

The host grants no WASI (build.sh builds with --stub-wasi): time.time() and os.urandom() trap
inside a decision, which fails it (the host then refuses the bring-up). Decide from the facts.
"""

from wit_world import exports
from wit_world.exports import resource_translation as rt


class ResourceTranslation(exports.ResourceTranslation):
    def decide(self, facts: rt.Facts) -> rt.Decision:
        guest = None
        if facts.path == rt.BootPath.RUN:
            guest = rt.GuestResources(vcpus=None, memory_bytes=None, storage_bytes=None)
        cpu = rt.CpuPolicy(cpu_weight=100, cpu_quota_us=None, cpu_period_us=None)
        return rt.Decision(
            outcome=rt.Outcome_Translated(rt.Translation(cpu=cpu, guest=guest)),
            reason="fixed-weight",
            message="cpu-weight 100, no quota",
        )
