"""Config(timeline=...): a 3-worker, 2-server hybrid job writes one merged
Chrome trace: valid trace-event JSON, one lane per process, every kept
step's phases for each worker, the all-reduce buckets and the server events
inside the step that caused them, the clock offsets stated, the size
bounded by timeline_steps. The job still equals one device."""
from __future__ import annotations

import json

from tests.integration.cluster import (assert_same_parameters, load_worker, run_single_device,
                                       run_training)

MODEL, STEPS, KEPT, EVERY = "lm_adam_clip", 12, 3, 2


def test_a_hybrid_job_writes_one_merged_timeline(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("hosts:\n  - address: 127.0.0.1\n    workers: 3\n    servers: 2\n")
    path = tmp_path / "job.trace.json"
    log = run_training(MODEL, tmp_path / "job", "--steps", str(STEPS), "--batch", "12",
                       "--spec", str(spec), "--run-option", "hybrid", "--timeline", str(path),
                       "--timeline-steps", str(KEPT), "--timeline-every", str(EVERY))
    assert f"timeline: {KEPT} traced steps of 3 workers written to {path}" in log, log[-3000:]
    trace = json.loads(path.read_text())
    lanes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(lanes.values()) == ["server 0", "server 1", "worker 0", "worker 1", "worker 2"]
    spans = [dict(e, lane=lanes[e["pid"]]) for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] > 0 for e in spans)
    other = trace["otherData"]
    # The last KEPT traced steps: one in EVERY, up to the last.
    assert other["steps"] == list(range(STEPS - EVERY * (KEPT - 1), STEPS + 1, EVERY))
    # The servers' too: their ops' timings in the workers' traces are theirs.
    assert sorted(other["clock_offsets_s"]) == ["server 0", "server 1",
                                                "worker 0", "worker 1", "worker 2"]
    assert all(abs(o) < 1.0 and 0 < other["clock_rtts_s"][w] < 1.0
               for w, o in other["clock_offsets_s"].items())   # one machine: one clock
    for w in range(3):
        worker = f"worker {w}"
        steps = sorted((e for e in spans if e["name"] == "step" and e["args"]["by"] == worker),
                       key=lambda e: e["ts"])
        assert [e["args"]["step"] for e in steps] == other["steps"]
        # half the shortest time between two of this worker's traced steps:
        # a server's event of one step starts nearer to it than to another
        lead = min(b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(steps, steps[1:])) / 2
        for step in other["steps"]:
            mine = [e for e in spans if e["args"]["step"] == step and e["args"]["by"] == worker]
            (whole,) = [e for e in mine if e["name"] == "step"]
            assert whole["lane"] == worker
            phases = {e["name"].rsplit(" ", 1)[0] if e["name"][-1].isdigit() else e["name"]
                      for e in mine if e["lane"] == worker}
            assert {"forward", "backward", "update", "all-reduce", "pull"} <= phases, phases
            # What the step ran on the worker happened within its session.run
            # (1 ms for the clocks read on either side of the call); what it
            # caused on a server, as TensorFlow reports it (a transfer's
            # record starts when the server posted its side), overlaps it or
            # starts a little before it besides the clocks' error: under a
            # full test run's load a server's push record began 7.4 ms, on a
            # slower machine 17.7 ms, before its step. Traced steps are EVERY
            # steps apart, so an event that starts less than half the way back
            # to the previous traced step is still this step's.
            start, end = whole["ts"], whole["ts"] + whole["dur"]
            caused = [e for e in mine if e is not whole]
            assert any(e["lane"].startswith("server") for e in caused)
            for e in caused:
                if e["lane"] == worker:
                    assert start - 1000 <= e["ts"] and e["ts"] + e["dur"] <= end + 1000, (e, whole)
                else:
                    # Each clock offset is known to half its sample's round trip.
                    slack = 1e6 * (other["clock_rtts_s"][e["lane"]]
                                   + other["clock_rtts_s"][worker]) / 2
                    assert e["ts"] < end + slack and e["ts"] + e["dur"] > start - lead - slack, \
                        (e, whole, slack, lead)
    assert path.stat().st_size < 2 << 20
    run_single_device(MODEL, tmp_path / "one", "--steps", str(STEPS), "--batch", "12")
    assert_same_parameters(load_worker(tmp_path / "one", 0), load_worker(tmp_path / "job", 0),
                           what="worker 0 with the timeline on")
