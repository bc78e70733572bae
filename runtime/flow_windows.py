"""How many bytes each flow of a job may have in flight (its TCP windows),
from the link speed and the number of flows that share a link: Herring's
flows to its summation servers, and TensorFlow's own connections (below).
The launcher gives them to its children (runtime/commands.py).

A summation server receives a flow from every worker and a worker one from
every server, so max(workers, servers) flows share the busiest link. Bytes
in flight beyond the link's bandwidth-delay product only wait in its queue,
and a server returns a segment after every worker's copy is in: the queues
on a push's way and on its result's way delay the result stream by their
depth. Dense CNN at 25 Mbit/s, 4 and 8 workers and servers, with the pushes
sent in one order: 128 KiB per flow 80 % / 71 % of the link limit (and
45 spurious retransmission timeouts at N = 8, a 0.5 s queue), 16 KiB
88 % / 82 %, 8 KiB 88 % / 80 %. Too small a window idles a fast link:
100 MiB averaged at 1 Gbit/s by 4 workers took 0.46 s with 16 KiB per
flow against 0.30 s with 128 KiB, the processes' acknowledgements waiting
for the 2 shared cores for milliseconds. So a link may hold QUEUE_S of its
rate in flight, split over its flows, within [MIN_BYTES, DEFAULT_BYTES].
QUEUE_S is 8 ms: with 4 ms, 8 workers averaging 32 MiB at 1 Gbit/s took
0.50–0.59 s with the 62.5 KiB it gives against 0.47 s with 96 KiB and
0.44 s with 128 KiB, and the dense CNN at 100 Mbit/s with 4 workers ran at
85 % of its limit with 16 KiB against 87–88 % with 25 KB (8 ms); below
100 Mbit/s at N >= 4 both give the 16 KiB floor.

The launcher exports the result as AUTOPAR_HERRING_WINDOW_BYTES to the
workers and summation servers (cpp_ops/herring_wire.h reads it); a spec
without `network.bandwidth_gbps` keeps the transport's default.

The same rule bounds TensorFlow's own connections between a job's workers
and parameter servers (tcp_window_bytes; set by the bind shim,
cpp_ops/bind_shim.c): S servers answering one worker's pull at once, N
workers' pushes into one server, a ring's neighbours. Left to the kernel's
autotuning those windows grow to megabytes, which only stand in the link's
queue: at 25 Mbit/s a 1000-frame queue is 0.5 s deep, and the sparse LM's
ps path with 8 workers had 22 retransmission timeouts in 20 steps, none with
the windows bounded; at 100 Mbit/s with 8 workers, where this machine's 2
cores bind, the queued bytes cost CPU (autopar's all-reduce used 2200 CPU ms
per sparse-LM step, 1581 with the windows bounded, and its step went from
1151 to 1022 ms; bench/README.md, "Bounded TCP windows")."""
from __future__ import annotations

DEFAULT_BYTES = 128 << 10   # cpp_ops/herring_wire.h kFlowWindowBytes: link speed unknown
# The windows cpp_ops/herring_wire.h and cpp_ops/bind_shim.c take from the
# environment (bytes); they ignore any other value.
SETTABLE_BYTES = (4 << 10, 64 << 20)
MIN_BYTES = 16 << 10
QUEUE_S = 0.008


def flow_window_bytes(bandwidth_gbps: float | None, workers: int, servers: int) -> int | None:
    """The window for each flow of a job whose links run at ``bandwidth_gbps``
    with ``workers`` workers and ``servers`` summation servers; None when the
    link speed is unknown (the transport's default applies)."""
    if not bandwidth_gbps or bandwidth_gbps <= 0:
        return None
    per_link = bandwidth_gbps * 1e9 / 8 * QUEUE_S
    flows = max(workers, servers, 1)
    return int(min(DEFAULT_BYTES, max(MIN_BYTES, per_link / flows)))


def job_window_setting(user_setting: str | None, bandwidth_gbps: float | None, workers: int,
                       servers: int) -> str | None:
    """The AUTOPAR_HERRING_WINDOW_BYTES to give a job's processes: the
    user's own setting wins, else flow_window_bytes (None: set nothing, the
    transport's default applies)."""
    window = user_setting or flow_window_bytes(bandwidth_gbps, workers, servers)
    return None if window is None else str(window)


def tcp_window_bytes(bandwidth_gbps: float | None, workers: int, servers: int) -> int | None:
    """The receive window of each TensorFlow connection between a job's
    processes (workers and parameter servers): flow_window_bytes, or None
    (the kernel's autotuning) when that reaches DEFAULT_BYTES: a fast link
    needs more in flight than a fixed SO_RCVBUF may give (the kernel caps it
    at net.core.rmem_max, 208 KiB by default, where autotuning goes to
    megabytes).

    Every connection gets the job's smallest share, max(workers, servers)
    flows per link, also a ring's, whose link carries one flow: sized for
    that one flow (8 ms of the rate, 100 KB at 100 Mbit/s), autopar's
    all-reduce on the sparse LM with 8 workers used as much CPU per step as
    with autotuned windows (2258 against 2200 ms; 1581 with 16 KiB) and its
    step stayed at 1147 ms (1022 with 16 KiB). The cost of the small share:
    a flow moves at most a window per round trip, so a ring runs at the
    link's rate while its round trip stays under 8 ms / max(workers,
    servers) (1 ms with 8 workers; at least 16 KiB per round trip, 0.13 ms
    at 1 Gbit/s, with 64). AUTOPAR_TCP_WINDOW_BYTES sets another window, 0
    none."""
    window = flow_window_bytes(bandwidth_gbps, workers, servers)
    return window if window is not None and window < DEFAULT_BYTES else None
