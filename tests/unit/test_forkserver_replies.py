"""The launcher's (and the benchmark harness's) bookkeeping of a fork
server's replies (runtime/forkserver.py), from replies written to a socket:
no server process here."""
import socket
import threading
from collections import deque

from autopar.runtime.forkserver import ForkServer


def _client(replies):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fs = ForkServer.__new__(ForkServer)
    fs._cond, fs._forked, fs._exited = threading.Condition(), {}, {}
    fs._ready = fs._closed = fs._stopping = fs._forked_any = False
    fs._sock, fs._tail, fs.pid = ours, deque(), 0
    for reply in replies:
        theirs.send(reply.encode())
    theirs.close()
    fs._read_replies()
    return fs


def test_replies_are_parsed():
    fs = _client(["READY 10", "FORKED 1 101", "FAILED 2 out of memory", "EXITED 101 0"])
    assert fs._ready and fs._closed
    assert fs._forked == {1: 101, 2: "out of memory"}
    assert fs._exited == {101: 0}


def test_a_recycled_pid_does_not_inherit_the_old_exit_status():
    # pid 101 ran a child that exited 0; later the kernel hands 101 to a new one.
    fs = _client(["READY 10", "FORKED 1 101", "EXITED 101 0", "FORKED 7 101"])
    assert fs._forked[7] == 101
    assert 101 not in fs._exited          # the new child is running, not "exited 0"
