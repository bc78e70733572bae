"""Host addresses as a spec and a cluster name them."""
from __future__ import annotations

import ipaddress


def is_loopback_address(address: str) -> bool:
    """A loopback address ("localhost", 127.x.x.x, ::1; brackets allowed).
    A host name other than localhost is taken for a real machine."""
    bare = address.strip().strip("[]")
    if bare.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare.partition("%")[0]).is_loopback
    except ValueError:
        return False
