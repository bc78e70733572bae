"""gRPC, as autopar's processes import it (`from autopar.runtime.rpc import
grpc`): with its fork support off, which grpc reads at its first import.

The launcher and the fork server start children with fork+exec while the
coordinator's gRPC threads run. With gRPC's fork support on, the child's
post-fork handler restarts gRPC's epoll poller, which subprocess then closes
before exec: the child aborts ("epoll_wait error: Bad file descriptor",
SIGABRT; grpc/grpc#43055, seen here with grpcio 1.85). No child uses the
parent's gRPC state, so the handlers are not needed. Set here, where a job's
process first needs gRPC (not when autopar is imported): a value the
environment already has is kept."""
import os

FORK_SUPPORT = "GRPC_ENABLE_FORK_SUPPORT"
os.environ.setdefault(FORK_SUPPORT, "0")

import grpc  # noqa: E402,F401 - after the setting above
