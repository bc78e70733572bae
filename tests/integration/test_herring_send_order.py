"""The order in which a worker's Herring connection sends its pushes
(cpp_ops/herring_ops.cc, Connection::OrderOf): segment by segment, the
earliest push first, then the lowest buffer index, so every worker sends a
server the same buffer at the same time whatever order its executor ran the
ops in. A buffer earlier in that order that becomes ready while a later one
is being sent goes first; the later one resumes where it stopped.

The server here is a recorder written against the wire format
(cpp_ops/herring_wire.h): it is the only place the order of the frames on
the connection can be seen. It holds its reading back while the worker
queues a large buffer 1 and, a second later, a small buffer 0, then
records every push frame and answers it with a result (one contributor: the
sum is the segment itself), so the worker's ops complete."""
from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np

from autopar.common.env import HERRING_WINDOW
from tests.integration.cluster import REPO, LineReader, child_env

WORKER = REPO / "tests" / "integration" / "scripts" / "herring_worker.py"
# cpp_ops/herring_wire.h FrameHeader: magic, type, wire dtype, average, four
# uint32 (contributors, contributor index, seg_len, seg_elems), six uint64
# (buffer, generation, shard offset, shard length, segment offset, payload bytes).
HEADER = struct.Struct("<IHBBIIIIQQQQQQ")
PUSH, RESULT = 1, 2
SEGMENT = 1 << 14
BIG = 128 * SEGMENT          # buffer 1: 128 segments, 8 MiB
SMALL = 4 * SEGMENT          # buffer 0, queued a second after buffer 1
HOLD_S = 4.0                 # the recorder reads nothing for this long after the connection
WINDOW = 32 << 10            # the worker's send buffer: little of buffer 1 fits before the hold ends


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = conn.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class Recorder:
    def __init__(self):
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.frames: list[tuple[int, int]] = []   # (buffer, segment offset) in arrival order
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            self.listener.settimeout(240)
            conn, _ = self.listener.accept()
            with conn:
                time.sleep(HOLD_S)
                expected = BIG + SMALL
                while expected:
                    raw = _recv_exact(conn, HEADER.size)
                    fields = list(HEADER.unpack(raw))
                    assert fields[0] == 0x31475248 and fields[1] == PUSH, fields
                    seg_len, buffer, seg_offset, payload_bytes = fields[6], fields[8], fields[12], fields[13]
                    payload = _recv_exact(conn, payload_bytes)
                    self.frames.append((buffer, seg_offset))
                    expected -= seg_len
                    fields[1] = RESULT
                    conn.sendall(HEADER.pack(*fields) + payload)
        except BaseException as exc:   # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.listener.close()


def test_a_buffer_earlier_in_the_order_overtakes_one_being_sent(tmp_path):
    recorder = Recorder()
    env = dict(child_env(), AUTOPAR_SUMSERVERS=recorder.address, **{HERRING_WINDOW: str(WINDOW)})
    proc = subprocess.Popen([sys.executable, str(WORKER), "0"], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    cases = [{"buffer_id": 1, "n": 1, "size": BIG, "kind": "normal", "wire": "float32",
              "average": True, "segment": SEGMENT, "shards": [[0, 0, BIG]], "first": 0},
             # "late": contributor 0 (this worker) pushes it a second after the others.
             {"buffer_id": 0, "n": 1, "size": SMALL, "kind": "normal", "wire": "float32",
              "average": True, "segment": SEGMENT, "shards": [[0, 0, SMALL]], "first": 0,
              "late": 0}]
    with LineReader(proc) as reader:
        reader.wait_for("^READY", 240)
        proc.stdin.write(json.dumps({"cmd": "reduce", "out": str(tmp_path), "steps": 1,
                                     "cases": cases}) + "\n")
        proc.stdin.flush()
        reader.wait_for("^RESULT ", 120)
        proc.stdin.close()
        recorder.thread.join(30)
    assert recorder.error is None, recorder.error
    order = [buffer for buffer, _ in recorder.frames]
    assert sorted(order) == [0] * (SMALL // SEGMENT) + [1] * (BIG // SEGMENT), order
    # Buffer 0 went out as soon as the segment of buffer 1 in hand was sent:
    # only what the socket buffers held and a segment or two came before it,
    # and buffer 1 resumed after it where it had stopped.
    first_small = order.index(0)
    assert first_small < 16, order
    assert order[first_small:first_small + SMALL // SEGMENT] == [0] * (SMALL // SEGMENT), order
    big_offsets = [offset for buffer, offset in recorder.frames if buffer == 1]
    assert big_offsets == list(range(0, BIG, SEGMENT)), big_offsets
    saved = np.load(tmp_path / "worker0.npz")
    for b in (0, 1):   # one contributor: the mean is the buffer itself
        np.testing.assert_array_equal(saved[f"out_{b}_0"], saved[f"in_{b}_0"])
