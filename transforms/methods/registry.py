"""The table of synchronisation methods (transforms.methods.base for the
interface, transforms.methods.policy for which variables use which).
Adding a method: a package under transforms/methods/ and one line here.

Order matters: the planner lays out methods' variables and allocates their
collective instance keys, and the rewrite builds their ops, in this order,
identically on every process.
"""
from __future__ import annotations

from autopar.transforms.methods.allgather.method import AllGather
from autopar.transforms.methods.allreduce.method import AllReduce
from autopar.transforms.methods.base import SyncMethod
from autopar.transforms.methods.herring.method import Herring
from autopar.transforms.methods.ps.method import ParameterServer

METHODS: dict[str, SyncMethod] = {m.name: m for m in (
    AllReduce(),
    AllGather(),
    ParameterServer(),
    Herring(),
)}


def processes(plan) -> set[str]:
    """Every process kind besides the workers `plan` needs."""
    return set().union(*(m.processes(plan) for m in METHODS.values()))
