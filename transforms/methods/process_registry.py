"""The table of helper-process kinds the methods declare
(transforms.methods.process_kind), by role: what the launcher, the ports,
the coordinator and the timeline read to start and follow the processes a
plan needs besides the workers (SyncMethod.processes gives their roles).
Adding a kind: its declaration in its method's package, that method's
`process_kinds`, and one line here (tests/unit/test_process_kinds.py checks
the two agree).

Kept apart from transforms/methods/registry.py because that table imports
every method and so TensorFlow, which the launcher of `autopar launch`
never imports. Order matters: the launcher starts, and the timeline lists,
the kinds in this order (after the parameter servers, before the workers).
"""
from __future__ import annotations

from collections.abc import Collection

from autopar.transforms.methods.herring.sumserver import SUMMATION_SERVER
from autopar.transforms.methods.process_kind import ProcessKind

PROCESS_KINDS: dict[str, ProcessKind] = {k.role: k for k in (
    SUMMATION_SERVER,
)}


def process_kinds(roles: Collection[str]) -> list[ProcessKind]:
    """The declared kinds among ``roles`` (a plan's processes), in table order."""
    return [kind for role, kind in PROCESS_KINDS.items() if role in roles]
