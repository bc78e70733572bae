"""Config(timeline=PATH): one Chrome trace-event file (chrome://tracing,
Perfetto) for the whole job, written by the launcher when the job ends.

Each worker traces one training step in `timeline_every` with TensorFlow's
own step statistics (RunOptions FULL_TRACE: every op's start and end, on
every device the step ran on, the servers' included) and keeps the last
`timeline_steps` traced steps. An op becomes part of a phase by what it is,
not where it was written:

    step           the whole session.run of the step (Python's clock)
    forward, backward, update
                   the worker's own ops (the gradient ops TensorFlow names
                   gradients/, the optimizer's apply ops, everything else)
    all-reduce N   the N-th collective reduction of the step (a fusion
                   bucket, or a server-side sum) ; all-gather N likewise
    collective transfer   a collective's data arriving from a peer
    pull           tensors a worker receives from a server
    push           tensors a server receives from a worker (on its lane)
    server update  what the server runs for the step (accumulate, take, apply)
    barrier        the end-of-step token queues
    herring N      a herring fusion buffer's push, sum and pull
    micro-batch M, dropped K    DropCompute's runs and drops
    checkpoint save

Ops of one phase closer than MERGE_GAP_US are shown as one span. Every
process keeps its events in its own clock and publishes them, with the
offset of the coordinator's clock from its own (measured on its
heartbeats, round trip stated), to the job coordinator when it closes; the
launcher moves every event onto the coordinator's clock, gives each worker
and server its own lane (process), and writes the file. A lane's server
events come from the workers' traces, in the server's own clock (as
TensorFlow reports remote ops: a transfer's record on a server may start
when the server posted its side, before the worker's call): each server
publishes its own measured offset (``clock_part``) and its events are moved
by that one. The file is cut to MAX_BYTES by dropping the oldest steps.

A job no launcher started (TF_CONFIG, mpirun, srun) has no coordinator to
hand events to: each worker writes its part beside Config.timeline
(`PATH.worker-N.json`, no clock offset), and

    python -m autopar.runtime.timeline PATH PATH.worker-*.json

merges them into PATH.
"""
from __future__ import annotations

import json
import os
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autopar.common.roles import (SERVER_JOB, SERVER_ROLE, WORKER_JOB, WORKER_ROLE,
                                  process_name)
from autopar.transforms.methods.process_registry import process_kinds

MERGE_GAP_US = 200
MAX_BYTES = 32 << 20
STEPS = "AUTOPAR_TIMELINE_STEPS"   # steps kept, in the environment of a traced job's workers
EVERY = "AUTOPAR_TIMELINE_EVERY"   # one step traced in this many
_DEVICE = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")


@dataclass(frozen=True)
class TimelineOptions:
    path: str     # the merged file the launcher writes
    steps: int    # traced steps kept, the last ones (Config.timeline_steps)
    every: int    # one step in this many is traced (Config.timeline_every)

    def env(self) -> dict[str, str]:
        return {STEPS: str(self.steps), EVERY: str(self.every)}

    @classmethod
    def of(cls, config) -> "TimelineOptions | None":
        """An autopar.Config's (None: it asks for no timeline)."""
        if not config.timeline:
            return None
        return cls(os.path.abspath(config.timeline), config.timeline_steps, config.timeline_every)


def options_from_env(environ: Mapping[str, str] = os.environ) -> tuple[int, int] | None:
    """(steps, every) in a worker of a traced job, else None."""
    if STEPS not in environ:
        return None
    return max(1, int(environ[STEPS])), max(1, int(environ.get(EVERY, "1")))


def lane_of(device: str, default: str) -> str:
    """"worker 1" for /job:worker/.../task:1, "server 0" for /job:ps/.../task:0."""
    found = _DEVICE.search(device)
    if not found:
        return default
    job, task = found.groups()
    return process_name(SERVER_ROLE if job == SERVER_JOB else WORKER_ROLE, int(task))


def phase_of(node: str, op_type: str, on_server: bool) -> str:
    """The phase an op of a traced step belongs to (module docstring)."""
    # TensorFlow names the transfers it records after what they are.
    if node == "RecvBuf" or op_type == "RecvBuf":
        return "collective transfer"
    if node == "RecvTensor" or op_type in ("RecvTensor", "_Recv", "_HostRecv"):
        return "push" if on_server else "pull"
    if op_type.startswith("Queue") or node.startswith("autopar/token"):
        return "barrier"
    if node.startswith("autopar/herring"):
        return "herring"
    if op_type.startswith("CollectiveReduce"):
        return "all-reduce"
    if op_type.startswith("CollectiveGather"):
        return "all-gather"
    if on_server:
        return "server update"
    if node.startswith("gradients/") or "/gradients/" in node:
        return "backward"
    if op_type.startswith(("Apply", "ResourceApply", "SparseApply", "ResourceSparseApply")) \
            or "/update_" in node:
        return "update"
    return "forward"


def _op_type(label: str) -> str:
    """The op type in a NodeExecStats timeline label ("name = Type(args)")."""
    _, eq, rest = label.partition(" = ")
    return rest.split("(", 1)[0].strip() if eq else ""


class Recorder:
    """One worker's events of its last `steps` traced steps. A step's op
    statistics are kept as TensorFlow gave them and turned into events only
    when the worker closes: between two steps the worker has nothing more
    to do than with the timeline off (on shared cores, converting every
    worker's trace at once had cost the next step ~5 % at N = 8)."""

    def __init__(self, lane: str, steps: int, every: int):
        self.lane = lane
        self.every = every
        # [step span, RunMetadata or None, other events]
        self._steps: deque[list] = deque(maxlen=steps)
        # phase -> {collective op: its number among the step's collectives}
        self._numbers: dict[str, dict[str, int]] = {}

    def traced(self, step: int) -> bool:
        """Whether global step `step` (the one about to run) is traced."""
        return step % self.every == 0

    def record_step(self, step: int, start_s: float, end_s: float, run_metadata=None,
                    extra: Sequence[dict] = ()) -> None:
        whole = self._span("step", "step", start_s * 1e6, end_s * 1e6, step)
        self._steps.append([whole, run_metadata,
                            [dict(e, args={**e.get("args", {}), "step": step}) for e in extra]])

    def span(self, name: str, category: str, start_s: float, end_s: float) -> dict:
        """An event of this worker's own (a micro-batch, a checkpoint save)
        to pass to record_step or add."""
        return self._span(name, category, start_s * 1e6, end_s * 1e6, -1)

    def add(self, step: int, event: dict) -> None:
        """`event` (span) of step `step`, kept if that step is traced."""
        if self._steps and self._steps[-1][0]["args"]["step"] == step:
            self._steps[-1][2].append(dict(event, args={**event["args"], "step": step}))

    def payload(self, clock_offset_s: float | None, clock_rtt_s: float | None) -> bytes:
        events = []
        for first, run_metadata, extra in self._steps:
            events.append(first)
            if run_metadata is not None:
                events += self._ops(first["args"]["step"], run_metadata)
            events += extra
        return json.dumps({"lane": self.lane, "clock_offset_s": clock_offset_s,
                           "clock_rtt_s": clock_rtt_s, "steps": events}).encode()

    def _span(self, name: str, category: str, start_us: float, end_us: float, step: int,
              lane: str | None = None) -> dict:
        return {"name": name, "cat": category, "ph": "X", "ts": round(start_us, 1),
                "dur": round(max(end_us - start_us, 0.0), 1), "pid": lane or self.lane,
                "tid": category, "args": {"step": step, "by": self.lane}}

    def _ops(self, step: int, run_metadata) -> list[dict]:
        # (lane, phase name) -> [[start, end], ...] merged when closer than MERGE_GAP_US
        spans: dict[tuple[str, str, str], list[list[float]]] = {}
        for dev in run_metadata.step_stats.dev_stats:
            lane = lane_of(dev.device, self.lane)
            on_server = lane.startswith(SERVER_ROLE)
            for ns in dev.node_stats:
                if ns.node_name in ("_SOURCE", "_SINK"):
                    continue
                op_type = _op_type(ns.timeline_label)
                phase = phase_of(ns.node_name, op_type, on_server)
                name = phase
                if phase in ("all-reduce", "all-gather"):
                    numbers = self._numbers.setdefault(phase, {})
                    name = f"{phase} {numbers.setdefault(ns.node_name, len(numbers))}"
                elif phase == "push":
                    name = f"push from {self.lane}"
                start = float(ns.all_start_micros)
                end = start + float(ns.all_end_rel_micros)
                merged = spans.setdefault((lane, phase, name), [])
                merged.append([start, end])
        events = []
        for (lane, phase, name), intervals in spans.items():
            intervals.sort()
            current = intervals[0]
            for start, end in intervals[1:]:
                if start - current[1] <= MERGE_GAP_US and phase not in ("all-reduce",
                                                                         "all-gather"):
                    current[1] = max(current[1], end)
                    continue
                events.append(self._span(name, phase, current[0], current[1], step, lane))
                current = [start, end]
            events.append(self._span(name, phase, current[0], current[1], step, lane))
        return events


def clock_part(lane: str, clock_offset_s: float, clock_rtt_s: float) -> bytes:
    """A server's part: no events of its own (the workers' traces hold them),
    the offset of the coordinator's clock from its own."""
    return json.dumps({"lane": lane, "clock_offset_s": clock_offset_s,
                       "clock_rtt_s": clock_rtt_s, "steps": []}).encode()


def _lanes(cluster: Mapping[str, Sequence[str]], helpers: Mapping[str, int]) -> list[str]:
    return ([process_name(WORKER_ROLE, i) for i in range(len(cluster.get(WORKER_JOB, [])))]
            + [process_name(SERVER_ROLE, i) for i in range(len(cluster.get(SERVER_JOB, [])))]
            + [process_name(kind.role, i) for kind in process_kinds(helpers)
               if kind.timeline_lane for i in range(helpers[kind.role])])


def merge(parts: Mapping[str, bytes], cluster: Mapping[str, Sequence[str]],
          helpers: Mapping[str, int], job: str, max_bytes: int = MAX_BYTES) -> dict:
    """The job's trace from every worker's published part (module docstring).
    ``helpers``: how many processes of each helper kind the job ran, by role
    (transforms/methods/process_registry.py; those with a timeline lane get one)."""
    lanes = _lanes(cluster, helpers)
    pids = {lane: i + 1 for i, lane in enumerate(lanes)}
    decoded = [json.loads(raw) for raw in parts.values()]
    offsets = {part["lane"]: part["clock_offset_s"] for part in decoded}
    rtts = {part["lane"]: part["clock_rtt_s"] for part in decoded}
    steps: dict[int, list[dict]] = {}
    for part in decoded:
        for event in part["steps"]:
            # In the clock of the process that ran it: a server's events in
            # a worker's trace move by the server's offset, where it sent one.
            own = offsets.get(event["pid"])
            shift = (own if own is not None else part["clock_offset_s"] or 0.0) * 1e6
            event = dict(event, ts=round(event["ts"] + shift, 1))
            lane = event["pid"]
            if lane not in pids:
                pids[lane] = len(pids) + 1
                lanes.append(lane)
            event["pid"] = pids[lane]
            steps.setdefault(event["args"]["step"], []).append(event)
    meta = []
    for lane in lanes:
        meta += [{"name": "process_name", "ph": "M", "pid": pids[lane], "args": {"name": lane}},
                 {"name": "process_sort_index", "ph": "M", "pid": pids[lane],
                  "args": {"sort_index": pids[lane]}}]
    kept = sorted(steps)
    trace = {}
    while True:
        trace = {"traceEvents": meta + [e for s in kept for e in steps[s]],
                 "displayTimeUnit": "ms",
                 "otherData": {"job": job, "steps": kept, "lanes": lanes,
                               "clock_offsets_s": offsets, "clock_rtts_s": rtts,
                               "clock": "the coordinator's (launcher's) time.time(); each "
                                        "process's events moved by its measured offset"}}
        if len(json.dumps(trace)) <= max_bytes or not kept:
            return trace
        kept = kept[1:]


def part_path(timeline: str, lane: str) -> str:
    """Where a worker of a job without a launcher writes its part."""
    return f"{timeline}.{lane.replace(' ', '-')}.json"


def write_part(timeline: str, recorder: Recorder) -> None:
    """A worker's part, in a job no launcher merges (no clock offset: its
    processes are on one clock or merged as they are)."""
    with open(part_path(timeline, recorder.lane), "wb") as f:
        f.write(recorder.payload(None, None))


def write(path: str, trace: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(trace, f)
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(description="merge a job's timeline parts into one trace")
    p.add_argument("out")
    p.add_argument("parts", nargs="+")
    args = p.parse_args(argv)
    parts = {}
    for path in args.parts:
        with open(path, "rb") as f:
            parts[path] = f.read()
    trace = merge(parts, {}, 0, "")
    write(args.out, trace)
    print(f"{args.out}: {len(trace['otherData']['steps'])} steps of {len(parts)} workers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
