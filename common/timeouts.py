"""How long a process waits for its peers, from the Config's stall and busy
timeouts: shared by the Config (Config.peer_timeout_s), the launcher (the
Herring transport's timeout) and the workers (DropCompute's agreement)."""
from __future__ import annotations

# A bound for a wait that has none, where a transport needs a number.
NO_TIMEOUT_S = 1e9


def peer_timeout_s(stall_timeout_s: float, busy_timeout_s: float) -> float:
    """Config.peer_timeout_s of these two settings (0: no bound)."""
    if not stall_timeout_s or not busy_timeout_s:
        return 0.0
    return float(max(stall_timeout_s, busy_timeout_s))
