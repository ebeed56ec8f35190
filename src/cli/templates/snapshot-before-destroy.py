"""A snapshot-before-destroy policy: on DeletePod, snapshot every running managed VM to
<vm>:latest, skip the rest. Replace the rule with yours; the case table beside this file pins
what it decides (vk-cocoon policy test .).

The host grants no WASI (build.sh builds with --stub-wasi): time.time() and os.urandom() trap
inside a decision, which fails it (the host then skips the snapshot). Decide from the facts.
"""

from wit_world import exports
from wit_world.exports import snapshot_before_destroy as sbd


class SnapshotBeforeDestroy(exports.SnapshotBeforeDestroy):
    def decide(self, facts: sbd.Facts) -> sbd.Decision:
        vm = facts.spec.vm_name
        if not facts.spec.managed or not vm or not facts.pusher_configured or not facts.vm_running:
            return sbd.Decision(
                outcome=sbd.Outcome_Skip(),
                reason="nothing-to-save",
                message=f"vm {vm} is destroyed without a snapshot (unmanaged, unnamed, stopped or no registry)",
            )
        return sbd.Decision(
            outcome=sbd.Outcome_Snapshot(sbd.SnapshotTarget(repository=vm, tag="latest", base_image=facts.spec.image)),
            reason="snapshot",
            message=f"save vm {vm} and push it to {vm}:latest before destroying it",
        )
