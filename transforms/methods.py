"""The table of synchronisation methods (see transforms.sync_method for the
interface). Adding a method: write its SyncMethod subclass in its own module
and add it here; nothing else changes."""
from __future__ import annotations

from autopar.transforms.allgather import AllGather
from autopar.transforms.allreduce import AllReduce
from autopar.transforms.herring import Herring
from autopar.transforms.ps import ParameterServer
from autopar.transforms.sync_method import SyncMethod

# Order matters: prepare() allocates collective instance keys and rewrite()
# builds ops in this order, identically on every process.
METHODS: dict[str, SyncMethod] = {m.name: m for m in (AllReduce(), AllGather(), ParameterServer(),
                                               Herring())}
