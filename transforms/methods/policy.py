"""Run options are policies: for each kind of gradient, the methods a
variable may use, in order of preference. The planner gives a variable the
first method of its list that serves the job (SyncMethod.job_choice) and
does not decline it (SyncMethod.declines). The last method of every list
takes any variable of its kind. The dtype a gradient travels in is not a
method but an axis of its own (transforms.methods.wire).

This table and the method packages are the only places that name methods.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    dense: tuple[str, ...]    # methods for a dense gradient, preferred first
    sparse: tuple[str, ...]   # ... for a sparse (IndexedSlices) gradient
    # The method the option asks for by name: its job_choice refuses a job
    # it cannot serve instead of passing to the next method.
    required: str = ""

    def methods(self, gradient: str) -> tuple[str, ...]:
        return self.dense if gradient == "dense" else self.sparse


# Parallax §5: "hybrid" sends dense gradients by all-reduce (or herring,
# when its cost model predicts fewer bytes on the busiest link) and sparse
# ones through parameter servers; "ps" puts every variable on servers;
# "allreduce" uses no servers; "herring" sums dense gradients on the
# summation servers.
POLICIES: dict[str, Policy] = {
    "hybrid": Policy(dense=("herring", "allreduce"), sparse=("ps", "allgather")),
    "ps": Policy(dense=("ps", "allreduce"), sparse=("ps", "allgather"), required="ps"),
    "allreduce": Policy(dense=("allreduce",), sparse=("allgather",)),
    "herring": Policy(dense=("herring", "allreduce"), sparse=("ps", "allgather"),
                      required="herring"),
}
RUN_OPTIONS = tuple(POLICIES)


def policy(run_option: str) -> Policy:
    if run_option not in POLICIES:
        raise ValueError(f"run_option must be one of {RUN_OPTIONS}, got {run_option!r}")
    return POLICIES[run_option]
