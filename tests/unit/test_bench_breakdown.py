"""bench/breakdown.py: the phases of the chief's traced steps from a merged
job timeline, when each starts and ends and how long it is busy."""
from __future__ import annotations

import json

from autopar.runtime.timeline import merge
from bench import breakdown


def _event(name, cat, lane, ts_ms, dur_ms, step, by="worker 0"):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts_ms * 1e3, "dur": dur_ms * 1e3,
            "pid": lane, "tid": cat, "args": {"step": step, "by": by}}


def test_phases_are_placed_in_their_step_and_busy_time_is_the_union():
    events = []
    for step, t0 in ((10, 1000.0), (20, 5000.0)):
        events += [_event("step", "step", "worker 0", t0, 100, step),
                   _event("forward", "forward", "worker 0", t0 + 2, 10, step),
                   _event("backward", "backward", "worker 0", t0 + 12, 30, step),
                   # two all-reduce buckets overlapping each other and the backward pass
                   _event("all-reduce 0", "all-reduce", "worker 0", t0 + 30, 40, step),
                   _event("all-reduce 1", "all-reduce", "worker 0", t0 + 50, 40, step),
                   # the servers' lanes: not the chief's own phases
                   _event("push from worker 0", "push", "server 0", t0 + 40, 5, step),
                   _event("push from worker 0", "push", "server 1", t0 + 60, 5, step),
                   # another worker's events are not the chief's
                   _event("backward", "backward", "worker 1", t0, 99, step, by="worker 1")]
    part = {"lane": "worker 0", "clock_offset_s": None, "clock_rtt_s": None, "steps": events}
    steps = breakdown.step_phases(merge({"w0": json.dumps(part).encode()}, {}, {}, ""))
    assert sorted(steps) == [10, 20]
    row = breakdown.summarise(steps)
    assert row["traced_steps"] == [10, 20] and row["step_ms"] == 100
    assert row["backward"] == (12.0, 42.0, 30.0)
    assert row["all-reduce"] == (30.0, 90.0, 60.0)      # 30-70 and 50-90: 60 ms busy
    assert row["push at servers"] == (40.0, 65.0, 10.0)
    assert "pull" not in row
    table = breakdown.markdown([{"workload": "dense", "N": 8, "system": "autopar-herring",
                                 "untraced_ms": 95.0, **row}])
    assert "| dense | 8 | autopar-herring | 95 | 100 |" in table
    assert "30–90 (60)" in table
