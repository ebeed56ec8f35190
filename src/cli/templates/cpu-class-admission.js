// A cpu-class-admission policy: a pod pinning a snapshot CPU class
// (cocoonstack.io/snapshot-cpu-class in its node selector) runs only on a node of that class.
// Replace the rule with yours; the case table beside this file pins what it decides
// (vk-cocoon policy test .).
//
// The host grants no WASI (build.sh builds with --stub-wasi): Date.now() traps inside a
// decision, which fails it (the host then rejects the pod). Decide from the facts.
// Fields are camelCase, enums are their case names, variants { tag, val }, options null.

const CPU_CLASS_SELECTOR = "cocoonstack.io/snapshot-cpu-class";

export const cpuClassAdmission = {
  decide(facts) {
    const pod = facts.pod;
    const entry = pod.nodeSelector.find((kv) => kv.key === CPU_CLASS_SELECTOR);
    const pinned = entry ? entry.value : "";
    if (pinned === "" || pinned === facts.nodeClass) {
      return {
        verdict: { tag: "admit" },
        reason: "admitted",
        message: `pod ${pod.namespace}/${pod.name} may run on node ${facts.nodeName}`,
      };
    }
    return {
      verdict: { tag: "reject", val: { kind: "permanent", event: "snapshot-cpu-class-mismatch" } },
      reason: "class-mismatch",
      message: `pod ${pod.namespace}/${pod.name} requires CPU class "${pinned}" but node ${facts.nodeName} provides "${facts.nodeClass}"`,
    };
  },
};
