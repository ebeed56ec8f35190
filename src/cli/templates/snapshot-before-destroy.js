// A snapshot-before-destroy policy: on DeletePod, snapshot every running managed VM to
// <vm>:latest, skip the rest. Replace the rule with yours; the case table beside this file pins
// what it decides (vk-cocoon policy test .).
//
// The host grants no WASI (build.sh builds with --stub-wasi): Date.now() traps inside a
// decision, which fails it (the host then skips the snapshot). Decide from the facts.
// Fields are camelCase, enums are their case names, variants { tag, val }, options null.

export const snapshotBeforeDestroy = {
  decide(facts) {
    const vm = facts.spec.vmName;
    if (!facts.spec.managed || vm === "" || !facts.pusherConfigured || !facts.vmRunning) {
      return {
        outcome: { tag: "skip" },
        reason: "nothing-to-save",
        message: `vm ${vm} is destroyed without a snapshot (unmanaged, unnamed, stopped or no registry)`,
      };
    }
    return {
      outcome: { tag: "snapshot", val: { repository: vm, tag: "latest", baseImage: facts.spec.image } },
      reason: "snapshot",
      message: `save vm ${vm} and push it to ${vm}:latest before destroying it`,
    };
  },
};
