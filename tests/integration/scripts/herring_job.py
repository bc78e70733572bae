"""A worker of a launched job: connect to every summation server the launcher
started (AUTOPAR_SUMSERVERS) and say so. No TensorFlow: the push/pull itself
is tested with real workers in test_herring_transport.py. The launcher does
not wait for a summation server to listen before it starts the workers (a
forked worker can be first); like herring's transport (cpp_ops/herring_ops.cc
ConnectTo), a refused connection is retried until a deadline."""
import os
import socket
import time

servers = os.environ["AUTOPAR_SUMSERVERS"].split(",")
deadline = time.monotonic() + 30
for address in servers:
    host, _, port = address.rpartition(":")
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=30).close()
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
print(f"reached {len(servers)} summation servers: {','.join(servers)}", flush=True)
