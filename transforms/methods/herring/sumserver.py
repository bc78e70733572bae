"""Herring's summation servers as a process kind (transforms.methods.
process_kind): one cpp_ops/sum_server.cc per server of the spec, on that
server's host, named to every process of the job in AUTOPAR_SUMSERVERS (the
push/pull kernel reads it at run time, transport.py). No TensorFlow here:
the launcher reads this declaration (transforms/methods/process_registry.py)."""
from __future__ import annotations

from autopar.common import env
from autopar.common.roles import SUMSERVER_ROLE
from autopar.transforms.methods.process_kind import HOST, PORT, ProcessKind

SUMMATION_SERVER = ProcessKind(
    role=SUMSERVER_ROLE,
    what="summation servers",
    # Bound to the spec's address, like the other servers (bind shim).
    command=("{native:autopar_sumserver}", "--host", HOST, "--port", PORT),
    publishes=env.SUMSERVERS,
    # cpp_ops/sum_server.cc: "cannot listen on ADDR: Address in use".
    bind_failure=r"autopar_sumserver: cannot listen on",
    flow_window=env.HERRING_WINDOW,
    transport_timeout=env.HERRING_TIMEOUT,
    client_library="libautopar_herring.so",
)
