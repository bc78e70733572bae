"""How DropCompute's workers agree on the threshold: through the job
coordinator (Agreement), or in all-reduces when there is none
(CollectiveAgreement)."""
from __future__ import annotations

import numpy as np


class Agreement:
    """How workers agree on the threshold, through the job coordinator:
    gather() posts this worker's bytes and returns every worker's (in worker
    order) once all have posted; share() is the chief's value for everyone
    (the chief publishes it, the others fetch it), so every worker holds the
    very same tau."""

    has_timeout = True   # a worker that never posts costs its peers a timeout, not a hang

    def __init__(self, client, worker_index: int, num_workers: int, timeout_s: float) -> None:
        self._client = client
        self._index = worker_index
        self._n = num_workers
        self._timeout = timeout_s

    def gather(self, key: str, payload: bytes, timeout_s: float | None = None) -> list[bytes]:
        values = self._client.exchange(key, payload, self._n,
                                       self._timeout if timeout_s is None else timeout_s)
        by_index = {int(name.rsplit(" ", 1)[1]): v for name, v in values.items()}
        return [by_index[i] for i in range(self._n)]

    def share(self, key: str, payload: bytes | None) -> bytes:
        if self._index == 0:
            self._client.publish(key, payload)
            return payload
        return self._client.fetch(key, self._timeout)


class CollectiveAgreement:
    """The same agreement without a job coordinator (a process that joined
    through TF_CONFIG): the payloads travel in all-reduces of float64 vectors
    (Runner's `sum_over_workers`, the collective distributed evaluation uses),
    each worker filling only its own slots with its bytes, 6 to a value
    (exact in float64). First the lengths, then the payloads padded to the
    longest. Every worker makes the same calls in the same order, which is
    what the collectives need. share() is a gather of which only the chief's
    payload is kept. No timeout: a collective waits for every worker (the job
    summary at close, which a worker may never reach, is left out)."""

    BYTES_PER_VALUE = 6
    has_timeout = False

    def __init__(self, worker_index: int, num_workers: int) -> None:
        self._index = worker_index
        self._n = num_workers
        self.sum_over_workers = None   # set by the Runner once its session exists

    def gather(self, key: str, payload: bytes, timeout_s: float | None = None) -> list[bytes]:
        lengths = np.zeros(self._n)
        lengths[self._index] = len(payload)
        lengths = self.sum_over_workers(lengths).astype(np.int64)
        k = self.BYTES_PER_VALUE
        width = -(-int(lengths.max()) // k) or 1
        mine = np.frombuffer(payload.ljust(width * k, b"\0"), np.uint8).reshape(width, k)
        values = np.zeros((self._n, width))
        values[self._index] = mine.astype(np.float64) @ (256.0 ** np.arange(k - 1, -1, -1))
        summed = self.sum_over_workers(values.ravel()).reshape(self._n, width).astype(np.int64)
        out = []
        for i in range(self._n):
            digits = (summed[i][:, None] // (256 ** np.arange(k - 1, -1, -1))) % 256
            out.append(digits.astype(np.uint8).tobytes()[:lengths[i]])
        return out

    def share(self, key: str, payload: bytes | None) -> bytes:
        return self.gather(key, payload if self._index == 0 else b"")[0]
