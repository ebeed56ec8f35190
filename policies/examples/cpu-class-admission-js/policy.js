// cpu-class-admission in JavaScript: the same table as the Rust default
// (policies/cpu-class-admission), first matching row wins.
//
// Built with componentize-qjs (QuickJS) from wit/vk-policy.wit, world cpu-class-admission-policy,
// with --sync (the host does not enable the component-model async ABI) and --stub-wasi (the
// host grants no WASI: every WASI call traps). What a decision sees of time and randomness is
// pinned by tests/integration/policy/languages.rs: a policy decides from its facts alone.

const CPU_CLASS_SELECTOR = "cocoonstack.io/snapshot-cpu-class";
const REFUSAL_EVENT = "snapshot-cpu-class-mismatch";

function admit(reason, message) {
  return { verdict: { tag: "admit" }, reason, message };
}

function reject(kind, reason, message) {
  return { verdict: { tag: "reject", val: { kind, event: REFUSAL_EVENT } }, reason, message };
}

export const cpuClassAdmission = {
  decide(facts) {
    const pod = facts.pod;
    if (pod.phase === "succeeded" || pod.phase === "failed") {
      const phase = pod.phase === "succeeded" ? "Succeeded" : "Failed";
      return admit("terminal-pod", `pod ${pod.namespace}/${pod.name} is ${phase}: no VM to resume`);
    }
    const entry = pod.nodeSelector.find((kv) => kv.key === CPU_CLASS_SELECTOR);
    const required = entry ? entry.value : "";
    if (required === "") {
      return admit("unclassified-pod", `pod ${pod.namespace}/${pod.name} pins no snapshot CPU class`);
    }
    const who = `pod ${pod.namespace}/${pod.name} requires snapshot compatibility class "${required}"`;
    if (facts.nodeClass === "") {
      // The node can be classified (VK_SNAPSHOT_CPU_CLASS): the pod waits for the operator.
      return reject(
        "needs-operator",
        "node-unclassified",
        `${who} but node ${facts.nodeName} is unclassified; set VK_SNAPSHOT_CPU_CLASS on the node if it provides that class`,
      );
    }
    if (facts.nodeClass !== required) {
      return reject("permanent", "class-mismatch", `${who} but node ${facts.nodeName} provides "${facts.nodeClass}"`);
    }
    return admit("class-match", `${who} and node ${facts.nodeName} provides it`);
  },
};
