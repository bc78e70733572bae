"""The end-of-step barrier of a step that touches servers (Edits.step_barriers,
built by methods whose variables live on servers): what it must wait for."""
from __future__ import annotations

from autopar.common.roles import SERVER_JOB


def cover_server_work(graph_def, barrier: str, step_ops, done=()) -> list[str]:
    """Make the step barrier wait for every op of a training step that
    touches a server; return the ops added as its control inputs.

    Why: TensorFlow gives all workers' runs of a graph with collectives the
    same step id (the collective executor's step-id sequence is shared by
    the group), and a server keeps one rendezvous per step id for every
    worker's partitions. When a worker's run ends, its master cleans that
    step id up on every task the run used, servers included, which aborts the
    rendezvous there ("Aborted: Cleanup <step id>") under any peer still
    moving a tensor to or from that server in the same step. A peer's run can
    only still be doing so if some of its server traffic is not ordered before
    its barrier contribution, e.g. a worker op after the update reading a
    server variable (an ExponentialMovingAverage of it) whose value is still
    in flight when the barrier completes.

    So, on the final GraphDef (devices settled, OPAU/OPSW moves and partition
    copies included), every op that may run in a step (the step ops and their
    ancestors) and either runs on a server or reads an output of a server op
    (data or control) becomes a control input of the barrier. Every transfer
    between a server and a worker ends at such an op (a server op receiving,
    or a worker op consuming), so when the barrier's all-reduce completes no
    worker has server traffic of that step left, and cleanup aborts nothing.
    The barrier is only ever fetched, never consumed, so no cycle can form.
    Like the update ops the barrier already waits for, these ops then run in
    every training step."""
    nodes = {n.name: n for n in graph_def.node}
    producer_of: dict[str, str] = {}   # input string -> producing node (a tensor feeds many)

    def producers(name: str) -> list[str]:
        out = []
        for i in nodes[name].input:
            p = producer_of.get(i)
            if p is None:
                p = producer_of[i] = (i[1:] if i[0] == "^" else i).partition(":")[0]
            if p in nodes:
                out.append(p)
        return out

    def on_server(name: str) -> bool:
        return nodes[name].device.startswith(f"/job:{SERVER_JOB}")

    def ancestors(roots, stop: set[str] = frozenset()) -> set[str]:
        seen, stack = set(), [r for r in roots if r in nodes and r not in stop]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            stack.extend(p for p in producers(name) if p not in stop)
        return seen

    # `done`: ops fetched with the step whose work the protocol orders before
    # the barrier completes (Edits.step_targets); theirs needs no cover.
    covered = ancestors([barrier, *done])
    # The step's ops not covered yet: an ancestor of a covered op is covered,
    # so the walk from the step ops stops at the covered ones.
    uncovered = ancestors(step_ops, stop=covered)
    touching = sorted(n for n in uncovered
                      if on_server(n) or any(on_server(p) for p in producers(n)))
    nodes[barrier].input.extend("^" + n for n in touching)
    return touching
