"""Host addresses as a spec and a cluster name them."""
from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence

from autopar.common.errors import LaunchError


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


def host_address(address: str) -> str:
    """The IP literal of a spec address ("localhost" → "127.0.0.1")."""
    bare = address.strip().strip("[]")
    try:
        infos = socket.getaddrinfo(bare, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return bare
    families = sorted(infos, key=lambda i: i[0] != socket.AF_INET)   # IPv4 first
    return str(families[0][4][0]) if families else bare


def launcher_host(addresses: Sequence[str], is_local: Callable[[str], bool]) -> str:
    """The address the coordinator listens on: the spec's address of this
    machine if it is one of the spec's hosts (loopback for a wildcard one),
    else the local address that routes to the first host."""
    for address in addresses:
        if is_local(address):
            ip = host_address(address)
            try:
                if ipaddress.ip_address(ip).is_unspecified:
                    return "::1" if ":" in ip else "127.0.0.1"
            except ValueError:
                pass
            return ip
    target = host_address(addresses[0])
    family = socket.AF_INET6 if ":" in target else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))   # UDP connect sends nothing; it picks the route
            return str(probe.getsockname()[0])
    except OSError as exc:
        raise LaunchError(f"no route from this machine to {addresses[0]} for the job "
                          f"coordinator ({exc}); check the host's address in the spec") from exc
