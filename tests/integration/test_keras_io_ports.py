"""keras-io programs, ported with the smallest change
(tests/integration/scripts/keras_io_*.py), fit by Keras's own model.fit on
one device and by autopar.fit on 3 workers over 2 uneven hosts with a
server each: every variable and optimizer slot and the per-epoch logs
equal. Each program runs in one run option in `make test`, in every one in
`make test-matrix` (AUTOPAR_TEST_MATRIX=full)."""
import os

import numpy as np
import pytest

from tests.integration.cluster import REPO
from tests.integration.test_keras_programs import _assert_workers_hold, _keras_then_autopar

SCRIPTS = REPO / "tests" / "integration" / "scripts"
CASES = [("transformer", "hybrid"), ("dcgan", "allreduce")]
if os.environ.get("AUTOPAR_TEST_MATRIX") == "full":
    CASES = [(p, o) for p in ("transformer", "dcgan") for o in ("hybrid", "ps", "allreduce")]


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
    (before: 33/33/30 rows drawn, not one device's)."""
    expected, got, log = _keras_then_autopar([str(SCRIPTS / f"keras_io_{program}.py")],
                                             tmp_path, (2, 1), "--run-option", run_option)
    assert sorted(got) == sorted(expected)
    for name in got:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-9, err_msg=name)
    # float64; Adam's 1/sqrt(v) of rows summed in another order
    _assert_workers_hold(tmp_path, 3, rtol=1e-7, atol=1e-10)
    if program == "transformer":
        assert "deduplicated lookup" in log
        # both tables on the servers: the tokens' rows pushed unsummed, the
        # positions' combined by id (before: the tokens' kept off, all-gathered)
        assert {"hybrid": "2 on servers", "ps": "22 on servers"}.get(
            run_option, "0 on servers") in log
