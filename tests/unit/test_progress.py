"""The chief's progress lines, and the launcher drawing its bar as one line
on a terminal (runtime/progress.py, runtime/console.py write_line)."""
from __future__ import annotations

import io
import logging

from autopar.runtime import console
from autopar.runtime import progress
from autopar.runtime.children import BAR


def _lines(monkeypatch, caplog, tty: bool, total: int | None) -> list[str]:
    clock = iter([0.0, 2.0, 4.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    meter = progress.Progress(10, 2, total, tty=tty)
    with caplog.at_level(logging.INFO, logger="autopar.progress"):
        for step in range(1, 21):
            meter.step(step, 0.5, 8)
    return [r.getMessage() for r in caplog.records if r.name == "autopar.progress"]


def test_plain_lines_without_a_terminal_or_a_total(monkeypatch, caplog):
    assert _lines(monkeypatch, caplog, False, 40) == [
        "step 10  loss 0.5000  80.0 examples/s", "step 20  loss 0.5000  80.0 examples/s"]


def test_a_bar_with_the_rate_and_the_time_left_on_a_terminal(monkeypatch, caplog):
    lines = _lines(monkeypatch, caplog, True, 40)
    # 10 steps in 2 s: the 20 steps left take 4 s.
    assert lines[1] == ("[###############...............]  50%  step 20/40  loss 0.5000  "
                        "80.0 examples/s  ETA 0:00:04")
    assert all(BAR.match(line) for line in lines)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_launcher_redraws_a_bar_in_place_and_keeps_other_lines(monkeypatch):
    out = _Terminal()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr(console, "_bar_shown", False)
    console.write_line("[worker 0] [#.] 10%  step 1\n", bar=True)
    console.write_line("[worker 0] [##] 20%  step 2\n", bar=True)
    console.write_line("[worker 1] something else\n")
    console.write_line("[worker 0] [##] 30%  step 3\n", bar=True)
    up = "\x1b[1A\x1b[2K"
    assert out.getvalue() == ("[worker 0] [#.] 10%  step 1\n" + up + "[worker 0] [##] 20%  step 2\n"
                              "[worker 1] something else\n[worker 0] [##] 30%  step 3\n")
