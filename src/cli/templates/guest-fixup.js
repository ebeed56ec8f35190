// A guest-fixup policy: nothing runs in a cloned guest, it goes straight to waiting for its
// lease. Replace the rule with yours ({ tag: "run", val: fixup } with an argv for cocoon vm
// exec; the default policy's source is in the vk-cocoon repository, policies/guest-fixup); the
// case table beside this file pins what it decides (vk-cocoon policy test .).
//
// The host grants no WASI (build.sh builds with --stub-wasi): Date.now() traps inside a
// decision, which fails it (the host then runs nothing and fails the pod's lifecycle). Decide
// from the facts. Fields are camelCase, enums are their case names, variants { tag, val }.

export const guestFixup = {
  decide(facts) {
    return {
      outcome: { tag: "none" },
      reason: "not-needed",
      message: `vm ${facts.spec.vmName} needs no guest fixup`,
    };
  },
};
