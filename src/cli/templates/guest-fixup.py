"""A guest-fixup policy: nothing runs in a cloned guest, it goes straight to waiting for its
lease. Replace the rule with yours (guest_fixup.Outcome_Run with an argv for cocoon vm exec; the
default policy's source is in the vk-cocoon repository, policies/guest-fixup); the case table
beside this file pins what it decides (vk-cocoon policy test .).

The host grants no WASI (build.sh builds with --stub-wasi): time.time() and os.urandom() trap
inside a decision, which fails it (the host then runs nothing and fails the pod's lifecycle).
Decide from the facts.
"""

from wit_world import exports
from wit_world.exports import guest_fixup


class GuestFixup(exports.GuestFixup):
    def decide(self, facts: guest_fixup.Facts) -> guest_fixup.Decision:
        return guest_fixup.Decision(
            outcome=guest_fixup.Outcome_None_(),
            reason="not-needed",
            message=f"vm {facts.spec.vm_name} needs no guest fixup",
        )
