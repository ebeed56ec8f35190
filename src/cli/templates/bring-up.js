// A bring-up policy: adopt a VM that already runs here, boot mode=run pods from their image,
// and refuse the rest for the operator to see. Replace the rules with yours (the default
// policy's source is in the vk-cocoon repository, policies/bring-up); the case table beside
// this file pins what it decides (vk-cocoon policy test .).
//
// The host grants no WASI (build.sh builds with --stub-wasi): Date.now() traps inside a
// decision, which fails it (the host then refuses the bring-up). Decide from the facts.
// Fields are camelCase, enums are their case names, variants { tag, val }, options null.

export const bringUp = {
  decide(facts) {
    const spec = facts.spec;
    const vm = spec.vmName;
    if (facts.vmExistsLocally) {
      return {
        outcome: { tag: "proceed", val: { tag: "adopt-existing", val: vm } },
        reason: "adopt-existing",
        message: `vm ${vm} already exists on this node: adopting it`,
      };
    }
    if (spec.managed && spec.mode === "run" && spec.image !== "") {
      const plan = {
        vmName: vm,
        image: spec.image,
        forcePull: spec.forcePull,
        network: spec.network,
        backend: spec.backend,
        windows: spec.os.tag === "windows",
        noDirectIo: spec.noDirectIo,
      };
      return {
        outcome: { tag: "proceed", val: { tag: "run", val: plan } },
        reason: "run",
        message: `booting vm ${vm} from image ${spec.image}`,
      };
    }
    // `kind` decides the retry: "permanent" = the pod must change; "needs-operator" = something
    // outside the pod (re-checked slowly); "retry-later" = it may clear by itself (backoff).
    return {
      outcome: { tag: "refuse", val: { kind: "permanent", event: "create-bring-up-failed" } },
      reason: "not-a-run-pod",
      message: `this policy only boots managed mode=run pods with an image; vm ${vm} is not one`,
    };
  },
};
