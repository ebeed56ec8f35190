"""snapshot-before-destroy in Python: the same table as the Rust default
(policies/snapshot-before-destroy), first matching row wins.

Built with componentize-py from wit/vk-policy.wit (world snapshot-before-destroy-policy) with
--stub-wasi: the host grants no WASI, so every WASI call traps. Inside a decision,
time.time() and os.urandom() trap (the decision fails and the host takes the slot's fail-safe);
the `random` module was seeded while the component was built, so it returns the same sequence
in every decision. A policy decides from its facts alone.
"""

import hashlib

from wit_world import exports
from wit_world.exports import snapshot_before_destroy as sbd
from wit_world.imports import types

DEFAULT_SNAPSHOT_TAG = "latest"


def hex_prefix(text: str, digits: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:digits]


def vm_name_for_deployment(namespace: str, cocoonset: str, slot: int) -> str:
    pod = f"{cocoonset}-{slot}"
    return f"vk-{namespace}-{pod.replace('.', '-')}-{hex_prefix(f'{namespace}/{pod}', 6)}"


def parse_slot(text: str):
    # ASCII digits only, and within u64 (the Rust helper's rule).
    if not text or any(c not in "0123456789" for c in text):
        return None
    slot = int(text)
    return slot if slot < 2**64 else None


def agent_slot(namespace: str, owner: str, vm_name: str):
    if not owner:
        return None
    hashed_prefix = f"vk-{namespace}-{owner.replace('.', '-')}-"
    if vm_name.startswith(hashed_prefix):
        segment = vm_name[len(hashed_prefix):].split("-")[0]
        slot = parse_slot(segment)
        if slot is not None and vm_name_for_deployment(namespace, owner, slot) == vm_name:
            return slot
    legacy_prefix = f"vk-{namespace}-{owner}-"
    if vm_name.startswith(legacy_prefix):
        return parse_slot(vm_name[len(legacy_prefix):])
    return None


def role(namespace: str, owner: str, vm_name: str) -> str:
    slot = agent_slot(namespace, owner, vm_name)
    if slot is None:
        return "toolbox"
    return "main" if slot == 0 else "sub-agent"


def cocoonset_owner(facts: sbd.Facts) -> str:
    for owner in facts.pod.owner_references:
        if owner.kind == "CocoonSet":
            return owner.name
    return ""


def skip(reason: str, message: str) -> sbd.Decision:
    return sbd.Decision(outcome=sbd.Outcome_Skip(), reason=reason, message=message)


class SnapshotBeforeDestroy(exports.SnapshotBeforeDestroy):
    def decide(self, facts: sbd.Facts) -> sbd.Decision:
        spec = facts.spec
        vm = spec.vm_name
        if not spec.managed:
            return skip("unmanaged", f"vm {vm} is not managed by vk-cocoon: its state is the operator's")
        if isinstance(spec.os, types.GuestOs_Macos):
            return skip("macos", f"vm {vm} is a macOS guest: it has no live snapshot")
        if not vm:
            return skip("no-vm-name", "the pod names no VM: nothing to snapshot")
        policy = spec.snapshot_policy
        if isinstance(policy, types.SnapshotPolicy_Never):
            return skip("policy-never", f"snapshot policy of vm {vm} is never")
        if isinstance(policy, types.SnapshotPolicy_MainOnly):
            found = role(facts.pod.namespace, cocoonset_owner(facts), vm)
            if found != "main":
                return skip("not-main-agent", f"snapshot policy of vm {vm} is main-only and its role is {found}")
        # An unknown policy preserves state, as `always` does (cocoon-common's rule).
        if not facts.pusher_configured:
            return skip("no-registry", f"no registry is configured: vm {vm} is destroyed without a snapshot")
        if not facts.vm_running:
            return skip("vm-not-running", f"vm {vm} is not running: there is no live state to save")
        return sbd.Decision(
            outcome=sbd.Outcome_Snapshot(
                sbd.SnapshotTarget(repository=vm, tag=DEFAULT_SNAPSHOT_TAG, base_image=spec.image)
            ),
            reason="snapshot",
            message=f"save vm {vm} and push it to {vm}:{DEFAULT_SNAPSHOT_TAG} before destroying it",
        )
