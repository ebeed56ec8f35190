"""Test guest: what Python's clock and random do inside a decision (no WASI is granted; the
component is built with --stub-wasi). The pod annotation `probe` names what to call; the
answer's message carries what it returned. See tests/integration/policy/languages.rs."""

import os
import random
import time

from wit_world import exports
from wit_world.exports import snapshot_before_destroy as sbd

# A 64 MiB allocation: past every memory limit the test sets.
HUGE = 64 << 20


def probe(name: str) -> str:
    if name == "time":
        return repr(time.time())
    if name == "monotonic":
        return repr(time.monotonic())
    if name == "urandom":
        return os.urandom(8).hex()
    if name == "random":
        return repr(random.random())
    if name == "catch-oom":
        try:
            return str(len(bytearray(HUGE)))
        except MemoryError:
            return "caught MemoryError"
    return "unknown probe " + name


class SnapshotBeforeDestroy(exports.SnapshotBeforeDestroy):
    def decide(self, facts: sbd.Facts) -> sbd.Decision:
        name = next((kv.value for kv in facts.pod.annotations if kv.key == "probe"), "")
        return sbd.Decision(outcome=sbd.Outcome_Skip(), reason="probe", message=probe(name))
