"""checkpoint_dir is the only place a job reads or deletes checkpoints, and a
checkpoint that cannot be used or saved is named for what it is.

- A crafted ``checkpoint`` state file listing a path outside the directory:
  the outside files survive (rotation used to delete ``PATH.*``).
- A copied directory (``cp -r A B``, state file listing A's absolute paths)
  resumes from B's own files, to an uninterrupted run's parameters, and A is
  untouched; a moved one (``mv A B``) resumes too instead of calling its
  intact checkpoints corrupt.
- A garbage state file, a checkpoint of another model (same names, other
  shapes), an unwritable directory and a full disk are autopar errors naming
  the file, the variable or the directory; a full disk keeps the previous
  checkpoint; when every checkpoint is damaged nothing is deleted (nor said
  to be), and an intact one the state file does not list is used before
  that is said. A script's launcher refuses an unwritable directory before
  it starts anything.
"""
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from autopar.common.errors import AutoparError
from autopar.runtime.checkpoint import Checkpointer
from tests.integration.cluster import assert_same_parameters, child_env, small_disk
from tests.integration.test_graceful_stop import _checkpoint_steps, _train

tf1 = tf.compat.v1


@pytest.fixture(scope="module")
def uninterrupted():
    """Parameters after 6 uninterrupted single-device steps."""
    return _train(None, 6)


def _absolute_state(directory: Path) -> None:
    """The state file as TensorFlow's functions and earlier autopar versions
    wrote it: absolute paths."""
    steps = sorted(_checkpoint_steps(directory))
    paths = [str(directory / f"model.ckpt-{s}") for s in steps]
    tf1.train.update_checkpoint_state(str(directory), paths[-1], paths)
    assert str(directory) in (directory / "checkpoint").read_text()


def _snapshot(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.iterdir())}


def _logged(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


def test_a_crafted_state_file_cannot_delete_files_outside(tmp_path, caplog):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "important.txt").write_text("keep me")
    (victim / "important.cfg").write_text("keep me too")
    ckpt = tmp_path / "ckpt"
    _train(ckpt, 2)
    (ckpt / "checkpoint").write_text(
        f'model_checkpoint_path: "{ckpt}/model.ckpt-2"\n'
        f'all_model_checkpoint_paths: "{victim}/important"\n'
        'all_model_checkpoint_paths: "model.ckpt-1"\n'
        'all_model_checkpoint_paths: "model.ckpt-2"\n')
    with caplog.at_level(logging.INFO, logger="autopar.checkpoint"):
        _train(ckpt, 5, caplog)   # keep_checkpoints=4: rotation deletes the oldest listed
    assert (victim / "important.txt").read_text() == "keep me"
    assert (victim / "important.cfg").read_text() == "keep me too"
    log = _logged(caplog)
    assert f"ignoring {str(victim / 'important')!r}" in log, log
    assert "restored" in log and "model.ckpt-2 (global step 2)" in log, log
    assert _checkpoint_steps(ckpt) == {2, 3, 4, 5}
    assert str(tmp_path) not in (ckpt / "checkpoint").read_text()   # names only from now on


@pytest.mark.parametrize("how", ["copy", "move"])
def test_a_copied_or_moved_directory_resumes_from_its_own_files(tmp_path, caplog, how,
                                                               uninterrupted):
    original, other = tmp_path / "A", tmp_path / "B"
    _train(original, 3)
    _absolute_state(original)
    if how == "copy":
        shutil.copytree(original, other)
        before = _snapshot(original)
    else:
        original.rename(other)
    with caplog.at_level(logging.INFO, logger="autopar.checkpoint"):
        resumed = _train(other, 6, caplog)
    log = _logged(caplog)
    assert f"restored {other}/model.ckpt-3 (global step 3)" in log, log
    assert "corrupt" not in log, log
    assert_same_parameters(uninterrupted, resumed, what=f"resumed in a {how} of the directory")
    assert _checkpoint_steps(other) == {3, 4, 5, 6}
    if how == "copy":
        assert _snapshot(original) == before   # the original is untouched
    else:
        assert not original.exists()


def _one_variable_graph(directory: Path, shape, keep: int = 5):
    graph = tf.Graph()
    with graph.as_default():
        tf1.get_variable("v", shape, initializer=tf1.ones_initializer())
        checkpointer = Checkpointer(graph, str(directory), 1, keep=keep)
        init = tf1.global_variables_initializer()
    session = tf1.Session(graph=graph)
    session.run(init)
    return checkpointer, session


def test_a_checkpoint_of_another_shape_names_the_variable(tmp_path):
    ckpt = tmp_path / "ckpt"
    checkpointer, session = _one_variable_graph(ckpt, [3])
    checkpointer.save(session, 1)
    session.close()
    checkpointer, session = _one_variable_graph(ckpt, [4])
    with pytest.raises(AutoparError, match=r"model\.ckpt-1 does not hold this graph's variables "
                                           r"\('v' has shape \[3\] there, \[4\] in this graph\)"):
        checkpointer.restore(session)
    session.close()
    assert _checkpoint_steps(ckpt) == {1}   # refused, not deleted


def test_a_garbage_state_file_is_named_and_left_alone(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    garbage = bytes(range(256)) * 4
    (ckpt / "checkpoint").write_bytes(garbage)
    checkpointer, session = _one_variable_graph(ckpt, [3])
    with pytest.raises(AutoparError, match=rf"{ckpt}/checkpoint is not a TensorFlow checkpoint "
                                           r"state file \(.*\), and saving would overwrite it"):
        checkpointer.restore(session)
    session.close()
    assert (ckpt / "checkpoint").read_bytes() == garbage


def test_an_unwritable_directory_is_refused_before_training(tmp_path):
    (tmp_path / "a_file").write_text("")
    checkpointer, session = _one_variable_graph(tmp_path / "a_file" / "ckpt", [3])
    with pytest.raises(AutoparError, match=r"checkpoint_dir .*a_file/ckpt is not writable"):
        checkpointer.restore(session)
    session.close()


def test_the_launcher_refuses_an_unwritable_directory_before_it_starts_anything(tmp_path):
    # As a script's launcher (get_runner) meets it: one line, exit status 2,
    # no process started (before: the chief refused it once every worker
    # had started).
    script = tmp_path / "train.py"
    script.write_text("import autopar\nfrom tests import models\n"
                      "autopar.get_runner(models.build('mlp_sgd').graph, {'hosts': [{'address': "
                      "'127.0.0.1', 'workers': 2}]}, autopar.Config(checkpoint_dir="
                      "'/proc/version/ck'))\n")
    env = {k: v for k, v in child_env().items() if k != "AUTOPAR_DEBUG"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("autopar")]
    assert len(ours) == 1 and ours[0].startswith(
        "autopar: checkpoint_dir /proc/version/ck is not writable ("), done.stderr
    assert "started" not in done.stdout, done.stdout


def test_nothing_is_deleted_or_said_deleted_when_every_checkpoint_is_damaged(tmp_path, caplog):
    ckpt = tmp_path / "ckpt"
    checkpointer, session = _one_variable_graph(ckpt, [3])
    for step in (1, 2):
        checkpointer.save(session, step)
    for step in (1, 2):
        (ckpt / f"model.ckpt-{step}.data-00000-of-00001").write_bytes(b"")
    before = _snapshot(ckpt)
    with caplog.at_level(logging.INFO, logger="autopar.checkpoint"), \
            pytest.raises(AutoparError, match=r"every checkpoint .* is corrupt.*none was deleted"):
        checkpointer.restore(session)
    session.close()
    log = _logged(caplog)
    assert "is corrupt or incomplete" in log, log
    assert "deleting it" not in log and "deleted the" not in log, log
    assert _snapshot(ckpt) == before


def test_an_intact_checkpoint_the_state_file_does_not_list_is_used_last(tmp_path, caplog):
    # Every listed checkpoint is damaged; the directory still holds an
    # intact one no state file lists (rotation had not deleted it yet): it
    # is restored, not "every checkpoint ... corrupt".
    ckpt = tmp_path / "ckpt"
    checkpointer, session = _one_variable_graph(ckpt, [3], keep=2)
    with session.graph.as_default():
        variable = tf1.global_variables()[0]
        one_two_three, zeros = variable.assign([1.0, 2.0, 3.0]), variable.assign([0.0] * 3)
    session.run(one_two_three)
    checkpointer.save(session, 1)
    kept = tmp_path / "kept"
    shutil.copytree(ckpt, kept)
    for step in (2, 3):
        checkpointer.save(session, step)     # keep=2: lists 2 and 3, deletes 1
    for name in ("model.ckpt-1.index", "model.ckpt-1.data-00000-of-00001"):
        shutil.copy(kept / name, ckpt / name)    # as a kill before the deletion leaves it
    assert "model.ckpt-1" not in (ckpt / "checkpoint").read_text()
    for step in (2, 3):
        (ckpt / f"model.ckpt-{step}.index").write_bytes(b"")
    session.run(zeros)
    with caplog.at_level(logging.INFO, logger="autopar.checkpoint"):
        assert checkpointer.restore(session) == 1
    assert list(session.run(variable)) == [1.0, 2.0, 3.0]
    session.close()
    log = _logged(caplog)
    assert "every checkpoint" not in log, log
    assert ("deleted the damaged checkpoint(s) model.ckpt-3, model.ckpt-2; resuming from "
            "model.ckpt-1 (global step 1), which the state file did not list") in log, log
    assert _checkpoint_steps(ckpt) == {1}


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_says_so_and_keeps_the_previous_checkpoint(tmp_path):
    with small_disk(tmp_path / "disk", "64k") as disk:
        ckpt = disk / "ckpt"
        checkpointer, session = _one_variable_graph(ckpt, [100, 100])   # 40 KB a checkpoint
        checkpointer.save(session, 1)
        with pytest.raises(AutoparError) as error:
            checkpointer.save(session, 2)
        session.close()
        message = str(error.value)
        assert f"could not save checkpoint {ckpt}/model.ckpt-2 at global step 2: no space left " \
               f"on device in {ckpt}; the previous checkpoint model.ckpt-1 is kept" in message
        assert _checkpoint_steps(ckpt) == {1}
        assert sorted(os.listdir(ckpt)) == ["checkpoint", "model.ckpt-1.data-00000-of-00001",
                                            "model.ckpt-1.index"]
        checkpointer, session = _one_variable_graph(ckpt, [100, 100])
        assert checkpointer.restore(session) == 1
        session.close()
