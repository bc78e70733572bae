"""A worker of a launched job: connect to every summation server the launcher
started (AUTOPAR_SUMSERVERS) and say so. No TensorFlow: the push/pull itself
is tested with real workers in test_herring_transport.py."""
import os
import socket

servers = os.environ["AUTOPAR_SUMSERVERS"].split(",")
for address in servers:
    host, _, port = address.rpartition(":")
    socket.create_connection((host, int(port)), timeout=30).close()
print(f"reached {len(servers)} summation servers: {','.join(servers)}", flush=True)
