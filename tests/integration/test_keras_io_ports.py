"""keras-io programs, ported with the smallest change
(tests/integration/scripts/keras_io_*.py), fit by Keras's own model.fit on
one device and by autopar.fit on 3 workers over 2 uneven hosts with a
server each: every variable and optimizer slot and the per-epoch logs
equal. Each program runs in one run option in `make test`, in every one in
`make test-matrix` (AUTOPAR_TEST_MATRIX=full)."""
import os
import sys

import numpy as np
import pytest

from tests.integration.cluster import REPO, run_to_end, write_two_host_spec
from tests.integration.test_keras_programs import _assert_workers_hold, _keras_then_autopar

SCRIPTS = REPO / "tests" / "integration" / "scripts"
CASES = [("transformer", "hybrid"), ("dcgan", "allreduce"), ("vae", "ps"), ("wgan_gp", "allreduce"),
         ("bidirectional_lstm", "ps")]
if os.environ.get("AUTOPAR_TEST_MATRIX") == "full":
    CASES = [(p, o) for p in ("transformer", "dcgan", "vae", "wgan_gp", "bidirectional_lstm")
             for o in ("hybrid", "ps", "allreduce")]
# The program's own arguments, on one device and on every worker alike:
# WGAN-GP's discriminator trained once per step (its 3 times are refused,
# test_a_keras_io_program_autopar_cannot_split_is_refused_naming_the_op)
ARGUMENTS = {"wgan_gp": ["--d-steps", "1"]}


@pytest.mark.parametrize("program,run_option", CASES, ids=[f"{p}-{o}" for p, o in CASES])
def test_a_keras_io_program_fits_as_on_one_device(program, run_option, tmp_path):
    """transformer (text_classification_with_transformer): the position ids
    come from ops.arange, so every worker looks up the same positions, its
    rows holding its share of the batch's sum; Keras's Adam squares each
    row before rows of one id add, so the rows are combined by id first
    (before: kept apart, Adam's v got the sum of their squares, every
    variable off); the token embedding's rows, squared by Adam before an
    id's rows add, reach the servers unsummed. Dropout draws per example. dcgan
    (dcgan_overriding_train_step): its own train_step draws the latent
    vectors (tf.random.normal, stateful) per example, and the labels' noise
    over its fake rows then its real ones; batches of 32 split 11/11/10, so
    each worker draws the global batch's rows and keeps its examples'
    (before: 33/33/30 rows drawn, not one device's). vae (generative/vae.py):
    its own train_step feeds three Mean trackers the batch's losses (means
    over its rows) and logs their results, the total's as "loss"; batches
    of 128 split 43/43/42, so each worker weighs what it adds to a tracker
    by its rows, and "loss" is found to be the total tracker's result
    (before: the trackers' logs were the workers' mean of their means, and
    "loss" the workers' results weighted by their last rows). wgan_gp
    (generative/wgan_gp.py): a gradient penalty, the gradient of the
    discriminator at images interpolated by per-example random weights,
    differentiated again; dropout after the generator's UpSampling2D, whose
    tf.repeat tiles by a count TensorFlow cannot fold (before: refused, the
    mask's shape taken for one that is no example's). bidirectional_lstm
    (nlp/bidirectional_lstm_imdb.py): two Bidirectional LSTMs (While loops
    run forwards and backwards) over padded reviews, its embedding under
    Keras's Adam on the servers; the epoch's last batch of 4 splits
    2/1/1."""
    script = [str(SCRIPTS / f"keras_io_{program}.py"), *ARGUMENTS.get(program, [])]
    expected, got, log = _keras_then_autopar(script, tmp_path, (2, 1),
                                             "--run-option", run_option)
    assert sorted(got) == sorted(expected)
    for name in got:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-9, err_msg=name)
    # float64; Adam's 1/sqrt(v) of rows summed in another order
    _assert_workers_hold(tmp_path, 3, rtol=1e-7, atol=1e-10)
    if program == "vae":
        assert "what a step adds of a mean over its batch to 'kl_loss/total', " \
            "'reconstruction_loss/total', 'total_loss/total'" in log
        assert "is no metric's result" not in log
    if program == "bidirectional_lstm":
        assert {"hybrid": "1 on servers", "ps": "3 on servers"}.get(
            run_option, "0 on servers") in log
    if program == "transformer":
        assert "deduplicated lookup" in log
        # both tables on the servers: the tokens' rows pushed unsummed, the
        # positions' combined by id (before: the tokens' kept off, all-gathered)
        assert {"hybrid": "2 on servers", "ps": "22 on servers"}.get(
            run_option, "0 on servers") in log


REFUSED = {
    # its score is tf.tensordot(user_vector, movie_vector, 2), one sum over
    # every example of the batch: each example's prediction would see only
    # its worker's share
    "movielens": ("the loss mixes the examples of a batch at "
                  "'recommender_net_1/Tensordot/MatMul'"),
    # its discriminator is updated 3 times in one step, each update from a
    # gradient taken after the last: autopar averages one per variable and step
    "wgan_gp": ("variable 'conv2d/kernel' is updated 3 times in one step "
                "('adam_1/AssignSubVariableOp', "),
}


# wgan_gp's refusal is the analysis' (tests/unit/test_tf2_analysis.py: a
# variable updated twice in one step) on a program whose step traces for
# seconds: the full matrix alone
REFUSED_PROGRAMS = (sorted(REFUSED) if os.environ.get("AUTOPAR_TEST_MATRIX") == "full"
                    else ["movielens"])


@pytest.mark.parametrize("program", REFUSED_PROGRAMS)
def test_a_keras_io_program_autopar_cannot_split_is_refused_naming_the_op(program, tmp_path):
    """movielens (collaborative_filtering_movielens) and wgan_gp as the
    programs have them: refused before training, naming the op, with no
    traceback and no other warning before the reason (before: a warning
    that the job's fork server was killed came first)."""
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    returncode, output = run_to_end(
        [sys.executable, str(SCRIPTS / f"keras_io_{program}.py"),
         "--spec", str(spec), "--out", str(tmp_path / "dist{worker}.npz")])
    assert returncode == 2, output[-4000:]
    reason = next(line for line in output.splitlines() if line.startswith("autopar: "))
    assert reason.startswith("autopar: " + REFUSED[program]), output[-4000:]
    assert "Traceback" not in output and "history" not in output
    assert "did not stop" not in output, output[-4000:]
    assert not list(tmp_path.glob("dist*.npz"))
