// Test guest: what JavaScript's (QuickJS) clock and random do inside a decision (no WASI is
// granted; the component is built with --stub-wasi). The pod annotation `probe` names what to
// call; the answer's message carries what it returned. See tests/integration/policy/languages.rs.

function probe(name) {
  switch (name) {
    case "date":
      return String(Date.now());
    case "random":
      return String(Math.random());
    case "performance":
      return typeof performance === "undefined" ? "no performance" : String(performance.now());
    case "catch-oom":
      try {
        const hoard = [];
        for (;;) hoard.push(new Uint8Array(4 << 20));
      } catch (e) {
        return "caught " + e;
      }
    default:
      return "unknown probe " + name;
  }
}

export const cpuClassAdmission = {
  decide(facts) {
    const entry = facts.pod.annotations.find((kv) => kv.key === "probe");
    return { verdict: { tag: "admit" }, reason: "probe", message: probe(entry ? entry.value : "") };
  },
};
