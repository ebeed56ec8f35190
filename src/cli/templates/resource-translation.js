// A resource-translation policy: every VM gets cgroup v2's default CPU weight (100) and no CPU
// quota; on the run path cocoon's own defaults size the guest. Replace the rule with yours (the
// default policy converts the pod's requests and limits as the kubelet does); the case table
// beside this file pins what it decides (vk-cocoon policy test .).
//
// The host grants no WASI (build.sh builds with --stub-wasi): Date.now() traps inside a
// decision, which fails it (the host then refuses the bring-up). Decide from the facts.
// Fields are camelCase, enums are their case names, variants { tag, val }, options null;
// u64 is a Number (exact up to 2^53).

export const resourceTranslation = {
  decide(facts) {
    const guest = facts.path === "run" ? { vcpus: null, memoryBytes: null, storageBytes: null } : null;
    return {
      outcome: {
        tag: "translated",
        val: { cpu: { cpuWeight: 100, cpuQuotaUs: null, cpuPeriodUs: null }, guest },
      },
      reason: "fixed-weight",
      message: "cpu-weight 100, no quota",
    };
  },
};
