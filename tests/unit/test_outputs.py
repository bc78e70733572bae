"""Every path a job writes is checked before anything starts
(runtime/outputs.py): a directory is created and written in, a file's
directory must take a new file; what cannot be written is an AutoparError
naming the option. The launcher checks the paths this machine writes."""
import os

import pytest

import autopar
from autopar.common.errors import AutoparError
from autopar.runtime import outputs
from autopar.runtime.spec import load_spec

LOCAL = load_spec({"hosts": [{"address": "127.0.0.1", "workers": 2}]})
REMOTE_CHIEF = load_spec({"hosts": [{"address": "10.254.254.1", "workers": 1},
                                    {"address": "127.0.0.1", "workers": 1}]})


def _bad_places(tmp_path):
    (tmp_path / "a_file").write_text("")
    return {"under /proc": "/proc/version/out", "under a file": str(tmp_path / "a_file" / "out")}


@pytest.mark.parametrize("option", ["checkpoint_dir", "tensorboard_dir", "dropcompute_log_dir"])
@pytest.mark.parametrize("place", ["under /proc", "under a file"])
def test_a_directory_that_cannot_be_written_is_refused_naming_its_option(tmp_path, option, place):
    path = _bad_places(tmp_path)[place]
    config = autopar.Config(**{option: path}, micro_batches=2)
    with pytest.raises(AutoparError, match=rf"^{option} {path} is not writable \("):
        outputs.check_job_outputs(config, LOCAL)


def test_directories_are_created_and_left_empty(tmp_path):
    config = autopar.Config(checkpoint_dir=str(tmp_path / "a" / "ckpt"),
                            tensorboard_dir=str(tmp_path / "board"))
    outputs.check_job_outputs(config, LOCAL)
    assert os.listdir(tmp_path / "a" / "ckpt") == [] and os.listdir(tmp_path / "board") == []


def test_only_what_this_machine_writes_is_checked(tmp_path):
    # The chief runs on another host: its directories are its own to check.
    outputs.check_job_outputs(autopar.Config(checkpoint_dir="/proc/version/ck"), REMOTE_CHIEF)
    # DropCompute's CSV is written only with micro-batches.
    outputs.check_job_outputs(autopar.Config(dropcompute_log_dir="/proc/version/dc"), LOCAL)


@pytest.mark.parametrize("where, problem", [
    ("/proc/version/trace.json", "/proc/version is not a directory"),
    ("{tmp}/missing/trace.json", "its directory {tmp}/missing does not exist"),
    ("{tmp}", "it is a directory"),
    ("/proc/trace.json", "no file can be created in /proc ("),
])
def test_a_file_that_cannot_be_written_is_refused(tmp_path, where, problem):
    path, problem = where.format(tmp=tmp_path), problem.format(tmp=tmp_path)
    with pytest.raises(AutoparError) as caught:
        outputs.writable_file(path, "timeline")
    assert str(caught.value).startswith(f"timeline {path} cannot be written: {problem}"), \
        str(caught.value)
    outputs.writable_file(str(tmp_path / "trace.json"), "timeline")
    assert os.listdir(tmp_path) == []      # nothing left by the check

