"""Training progress on the chief: step, loss, examples/s."""
from __future__ import annotations

import logging
import time

log = logging.getLogger("autopar.progress")

_BAR_WIDTH = 30


class Progress:
    """``board``: a runtime.tensorboard.ChiefBoard the logged values also go
    to; ``drops``: DropCompute.totals, for its drop rate; ``stall_warnings``:
    the number of stall warnings the launcher has issued so far."""

    def __init__(self, every: int, num_workers: int, total_steps: int | None = None,
                 tty: bool = False, board=None, drops=None, stall_warnings=None):
        self.every = every
        self.num_workers = num_workers
        self.total_steps = total_steps
        self.tty = tty
        self.board = board
        self._drops = drops
        self._stall_warnings = stall_warnings
        self._dropped_before = (0, 0)
        self._last_time = time.monotonic()
        self._examples = 0
        self._steps = 0
        self._last_steps = 0

    def step(self, step: int, loss: float | None, local_examples: int | None) -> None:
        """Record one training step; every `every` steps log a line. Examples/s
        counts the global batch: every worker processes as many as this one."""
        if not self.every:
            return
        self._examples += (local_examples or 0) * self.num_workers
        self._steps += 1
        if step % self.every:
            return
        now = time.monotonic()
        elapsed = max(now - self._last_time, 1e-9)
        rate = self._examples / elapsed
        if self.board is not None:
            self.board.step(step, loss, rate if local_examples else None, elapsed / self._steps,
                            self._drop_rate(),
                            None if self._stall_warnings is None else self._stall_warnings())
        self._last_time, self._examples, self._last_steps, self._steps = now, 0, self._steps, 0
        parts = [f"step {step}"]
        if loss is not None:
            parts.append(f"loss {loss:.4f}")
        if local_examples:
            parts.append(f"{rate:.1f} examples/s")
        line = "  ".join(parts)
        if self.tty and self.total_steps:
            # One line the launcher redraws in place (runtime/children.py, BAR).
            done = min(step / self.total_steps, 1.0)
            filled = int(done * _BAR_WIDTH)
            left = max(self.total_steps - step, 0) * elapsed / max(self._last_steps, 1)
            line = (f"[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {100 * done:3.0f}%  "
                    f"{line.replace(f'step {step}', f'step {step}/{self.total_steps}', 1)}  "
                    f"ETA {_clock(left)}")
        log.info("%s", line)

    def _drop_rate(self) -> tuple[float | None, float] | None:
        """(τ, share of micro-batches dropped since the last logged step)."""
        if self._drops is None:
            return None
        tau, computed, possible = self._drops()
        before_computed, before_possible = self._dropped_before
        self._dropped_before = (computed, possible)
        possible, computed = possible - before_possible, computed - before_computed
        return tau, (1 - computed / possible) if possible else 0.0


def _clock(seconds: float) -> str:
    """``0:01:05`` (h:mm:ss)."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
