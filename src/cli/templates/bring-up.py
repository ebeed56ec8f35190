"""A bring-up policy: adopt a VM that already runs here, boot mode=run pods from their image,
and refuse the rest for the operator to see. Replace the rules with yours (the default policy's
source is in the vk-cocoon repository, policies/bring-up); the case table beside this file pins
what it decides (vk-cocoon policy test .).

The host grants no WASI (build.sh builds with --stub-wasi): time.time() and os.urandom() trap
inside a decision, which fails it (the host then refuses the bring-up). Decide from the facts.
"""

from wit_world import exports
from wit_world.exports import bring_up
from wit_world.imports import types


class BringUp(exports.BringUp):
    def decide(self, facts: bring_up.Facts) -> bring_up.Decision:
        spec = facts.spec
        vm = spec.vm_name
        if facts.vm_exists_locally:
            return bring_up.Decision(
                outcome=bring_up.Outcome_Proceed(bring_up.Plan_AdoptExisting(vm)),
                reason="adopt-existing",
                message=f"vm {vm} already exists on this node: adopting it",
            )
        if spec.managed and spec.mode == types.BootMode.RUN and spec.image:
            plan = bring_up.RunPlan(
                vm_name=vm,
                image=spec.image,
                force_pull=spec.force_pull,
                network=spec.network,
                backend=spec.backend,
                windows=isinstance(spec.os, types.GuestOs_Windows),
                no_direct_io=spec.no_direct_io,
            )
            return bring_up.Decision(
                outcome=bring_up.Outcome_Proceed(bring_up.Plan_Run(plan)),
                reason="run",
                message=f"booting vm {vm} from image {spec.image}",
            )
        # `kind` decides the retry: PERMANENT = the pod must change; NEEDS_OPERATOR = something
        # outside the pod (re-checked slowly); RETRY_LATER = it may clear by itself (backoff).
        refusal = types.Refusal(kind=types.RefusalKind.PERMANENT, event=types.EventReason.CREATE_BRING_UP_FAILED)
        return bring_up.Decision(
            outcome=bring_up.Outcome_Refuse(refusal),
            reason="not-a-run-pod",
            message=f"this policy only boots managed mode=run pods with an image; vm {vm} is not one",
        )
