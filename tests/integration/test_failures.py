"""A dead worker stops the whole job: the launcher exits non-zero within 10 s,
names the process, shows the end of its log once, and leaves nothing running."""
import os
import re
import signal
import time

from tests.integration.cluster import LineReader, start_job, survivors, train_command, write_spec


def test_killed_worker_stops_job(tmp_path):
    spec = write_spec(tmp_path, workers=2, servers=1)
    proc = start_job(train_command("mlp_sgd", tmp_path / "out", "--steps", "1000",
                                   "--run-option", "ps",    # the server holds every variable
                                   "--stall-at", "3", "--spec", str(spec)))
    with LineReader(proc) as reader:
        reader.wait_for(r"worker 1 stalling at step 3", 120)
        text = reader.text
        pids = {int(p) for p in re.findall(r"worker \d pid (\d+)", text)}
        pids |= {int(p) for p in re.findall(r"server \d.*pid[ =](\d+)", text)}
        worker1 = int(re.search(r"worker 1 pid (\d+)", text).group(1))
        assert len(pids) >= 3, text   # 2 workers and the server
        os.kill(worker1, signal.SIGKILL)
        killed_at = time.monotonic()
        rest = reader.rest(timeout=30)
        elapsed = time.monotonic() - killed_at
    output = reader.text
    assert proc.returncode != 0
    # The one timing bound here is the requirement itself: a dead worker ends the job within 10 s.
    assert elapsed < 10, f"launcher took {elapsed:.1f}s to stop the job"
    # Its last lines were streamed already: said once, not again in the report.
    assert "worker 1" in rest and "(its output is above)" in rest, rest[-2000:]
    assert output.count("worker 1 stalling at step 3") == 1, output[-3000:]
    assert not survivors(pids), output[-2000:]
