"""TensorFlow 2 programs: Keras 3 models trained by a custom tf.function
step (tests/programs/keras_step.py) and by autopar.fit, on 3 workers over 2
uneven hosts with a server each (fit: 2 local workers), end with every
weight, optimizer slot and the optimizer's iteration count, as the Keras
objects hold them after training, equal to one device calling the
tf.function itself. float64 where Adam divides by sqrt(v)."""
import json
import os
import re
import sys

import numpy as np
import pytest

from tests.integration.cluster import (REPO, LineReader, assert_same_parameters, load_worker,
                                       run_beside, run_script, run_to_end, start_job, write_spec,
                                       write_two_host_spec)

SCRIPT = REPO / "tests" / "integration" / "scripts" / "keras_step.py"
STEPS, BATCH = 5, 6
# Each run option but herring once (each case starts 6 processes that import
# Keras 3; herring's path is the same for any program: test_user_programs.py);
# AUTOPAR_TEST_MATRIX=full (`make test-matrix`) runs every program in every
# run option.
CASES = [
    # Adam with global_clipnorm: one norm over every gradient, which keeps
    # every variable off the servers; the embedding's rows are squared before
    # duplicates add (all-gather keeps every row)
    ("emb_mlp", "adam", "float64", "hybrid"),
    # an LSTM: a While loop (its weights stay off the servers in ps:
    # tests/unit/test_tf2_analysis.py, and the full matrix)
    ("lstm", "sgd", "float64", "allreduce"),
    # a GRU under Adam: its bias, read inside the loop, adds to each
    # example's row (before: refused with a KeyError, the loop's shapes lost)
    ("gru", "adam_noclip", "float64", "ps"),
    # an embedding and a regularized Dense each used twice: the tape adds up
    # their gradients outside its scope (the embedding's rows on the servers)
    ("shared", "sgd", "float64", "ps"),
    # momentum SGD in float32, every variable on the servers: two
    # micro-batches' tapes in one step, their gradients added with + (the
    # embedding's rows made dense); the sum travels, the ops after it run on
    # the servers (Keras's sparse rows on servers: "shared" above; the
    # emb_mlp model in every run option: the full matrix). The step cuts
    # each share in halves itself, which autopar refuses unless asked for per
    # worker (the program's Config): one device's here, every piece treated
    # alike and the shares even and equal
    ("micro", "sgd", "float32", "ps"),
    # gradient accumulation: two micro-batches' gradients, each divided by
    # 2, added into zeros; every variable on the servers
    ("accum", "sgd", "float64", "ps"),
    # AMSGrad (v read only through v_hat) with weight decay, which writes
    # each weight besides its update: every variable stays off the servers;
    # trained in 2 micro-batches a step (MICRO_BATCHES)
    ("emb_mlp", "amsgrad_wd", "float64", "ps"),
    # Keras's LossScaleOptimizer: updates inside a (nested) tf.cond, which
    # runs them only for finite gradients; they stay off the servers
    ("emb_mlp", "lossscale", "float32", "ps"),
    # a loss over a masked sequence: Keras weighs each kept position by the
    # batch's size / count of kept positions, which differs between workers
    # (transforms.loss_counts rebuilds the weights the backward pass reads
    # from the count summed over workers)
    ("masked", "sgd", "float64", "hybrid"),
    # a tf.compat.v1 Adam inside the tf.function over tf.Variables: its
    # slots, made outside the function, captured by handle (before: refused
    # as 'not a tf.Variable')
    ("module", "v1_adam", "float64", "ps"),
    # wide & deep: five embedding tables whose ids repeat within a batch and
    # across workers, under Keras's Adam and Adagrad, which square each row
    # before rows of one id add up: the tables on the servers, which receive
    # every worker's rows unsummed (before: kept off them, all-gathered)
    ("wide_deep", "adam_noclip", "float64", "hybrid"),
    ("wide_deep", "adagrad", "float64", "ps"),
]
if os.environ.get("AUTOPAR_TEST_MATRIX") == "full":
    CASES = [(model, optimizer, dtype, option)
             for model, optimizer, dtype in (("emb_mlp", "adam", "float64"),
                                             ("emb_mlp", "sgd", "float32"),
                                             ("lstm", "sgd", "float64"),
                                             ("gru", "adam_noclip", "float64"),
                                             # no Keras layers: tf.Variables in a
                                             # tf.Module (its analysis:
                                             # tests/unit/test_tf2_analysis.py)
                                             ("module", "adam_noclip", "float64"),
                                             ("micro", "sgd", "float32"),
                                             ("accum", "sgd", "float64"),
                                             ("emb_mlp", "amsgrad_wd", "float64"),
                                             ("emb_mlp", "lossscale", "float32"),
                                             ("masked", "sgd", "float64"),
                                             ("wide_deep", "adam_noclip", "float64"),
                                             ("wide_deep", "adagrad", "float64"),
                                             ("wide_deep", "rmsprop", "float64"))
             for option in ("hybrid", "ps", "allreduce")] + [
        ("emb_mlp", "sgd", "float32", "herring"), ("lstm", "sgd", "float32", "herring")]
# Cases trained with Config(micro_batches=2): each worker's two micro-batches
# accumulate their gradients, one run applies them; the function's outputs
# come from the micro-batch runs (before: every traced step was refused, its
# loss output waiting for the updates, so the update's run read the input).
MICRO_BATCHES = {("emb_mlp", "amsgrad_wd", "float64", "ps"): 2}
# Cases whose tables are split over both servers and looked up by aggregation
# groups of 2 (workers [0, 1] across the hosts, [2] alone): the group's first
# worker pulls the union of its ids' rows and sends each its own
GROUPED = {("wide_deep", "adagrad", "float64", "ps"): [
    "--aggregation-group", "2", "--partitions", "deep_0/embeddings=2,wide_1/embeddings=2"]}
# Cases whose script assigns the learning rate from Python before each step,
# as custom loops decay it (before: the lifted graph kept the first rate).
DECAYED_LR = {("shared", "sgd", "float64", "ps")}
# Cases whose last step's global batch is one larger, split 3/2/2 over the
# workers, as a dataset's last batch is: each worker weighs its gradients by
# its share of the step's examples (transforms.batch_weights; not with
# micro-batches, nor for a step that splits its batch in halves itself).
UNEVEN_LAST = {c for c in CASES if c not in MICRO_BATCHES and c[0] not in ("micro", "accum")}
# Keras 3's BatchNormalization and LayerNormalization (the batch-norm test)
BATCH_NORM_PROGRAM = ("bn_mlp", "adam", "float64")
FIT_OPTIONS = (["hybrid", "ps", "allreduce", "herring"]
               if os.environ.get("AUTOPAR_TEST_MATRIX") == "full" else ["hybrid"])


def _start_reference(tmp_path_factory, model, optimizer, dtype, decay_lr=False,
                     uneven_last=False):
    """One device running the step (a process of its own, as every worker
    is, forked from the tests' fork server), started; (a LineReader of the
    process, its output directory)."""
    out = tmp_path_factory.mktemp(f"ref_{model}_{optimizer}")
    proc = start_job([sys.executable, str(SCRIPT), "--reference", "--model", model,
                      "--optimizer", optimizer, "--dtype", dtype, "--steps", str(STEPS),
                      "--batch", str(BATCH), "--out", str(out)]
                     + (["--decay-lr"] if decay_lr else [])
                     + (["--uneven-last"] if uneven_last else []))
    return LineReader(proc), out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The one-device results of every program this module compares with,
    all started at the first request (side by side on the two cores they
    take less time than one after another)."""
    started = {}
    programs = [(m, o, d, (m, o, d, r) in DECAYED_LR, (m, o, d, r) in UNEVEN_LAST)
                for m, o, d, r in CASES] + [(*BATCH_NORM_PROGRAM, False, True)]

    def get(model, optimizer, dtype, decay=False, uneven=False):
        key = (model, optimizer, dtype, decay, uneven)
        for k in [key] + ([] if started else programs):
            if k not in started:
                started[k] = _start_reference(tmp_path_factory, *k)
        reader, out = started[key]
        reader.rest(timeout=240)
        assert reader.proc.returncode == 0, reader.text[-3000:]
        return load_worker(out, 0)
    yield get
    for reader, _ in started.values():
        reader.__exit__(None, None, None)


@pytest.mark.parametrize("model,optimizer,dtype,run_option", CASES,
                         ids=["-".join(c) for c in CASES])
def test_custom_training_step_matches_one_device(model, optimizer, dtype, run_option, tmp_path,
                                                  reference):
    decay = (model, optimizer, dtype, run_option) in DECAYED_LR
    uneven = (model, optimizer, dtype, run_option) in UNEVEN_LAST
    expected = reference(model, optimizer, dtype, decay, uneven)
    # (servers only where the run option puts variables on them)
    spec = write_two_host_spec(tmp_path, workers=(2, 1),
                               servers=(0, 0) if run_option == "allreduce" else (1, 1))
    micro = MICRO_BATCHES.get((model, optimizer, dtype, run_option), 1)
    log = run_script([sys.executable, str(SCRIPT), "--model", model, "--optimizer", optimizer,
                      "--dtype", dtype, "--steps", str(STEPS), "--batch", str(BATCH),
                      "--spec", str(spec), "--run-option", run_option,
                      "--micro-batches", str(micro), "--out", str(tmp_path / "dist")]
                     + (["--decay-lr"] if decay else [])
                     + (["--uneven-last"] if uneven else [])
                     + GROUPED.get((model, optimizer, dtype, run_option), []))
    if (model, optimizer, dtype, run_option) in GROUPED:
        assert ("lookups of deep_0/embeddings, wide_1/embeddings are pulled once per group of 2"
                in log), log[-3000:]
    if model == "masked":   # the count's weights rebuilt: exact for any split
        assert "loss count 'sparse_categorical_crossentropy/Sum:0'" in log
        assert "examples where its first had" not in log
    elif uneven:   # weighed, not warned of
        assert "each worker weighs its gradients by N * b / B" in log
        assert "examples where its first had" not in log
    if micro > 1:
        for i in range(3):
            assert (f"worker {i}: DropCompute computed {micro * STEPS} of {micro * STEPS} "
                    "micro-batches") in log
    assert "update recognised from writes of it and of its slots" in log
    if model in ("micro", "accum"):   # its halves, trained per worker as asked: noted
        assert re.search(r"the loss mixes the examples of a batch at '[^']*strided_slice[^']*'"
                         r".*; with Config\(batch_mixing=\"per_worker\"\) each of the 3 "
                         "workers", log), log[-3000:]
    if model in ("emb_mlp", "micro", "accum") and optimizer == "sgd":   # all 5 in ps
        # (hybrid: emb_mlp's sparse embedding on the servers, micro's
        # gradients all dense, all-reduced)
        assert {"ps": "5 on servers", "allreduce": "0 on servers"}.get(
            run_option, "1 on servers" if model == "emb_mlp" else "0 on servers") in log
    # (hybrid would put only the embedding on a server, and Adam's squared
    # rows keep it off first: the report gives that reason)
    if optimizer.endswith("_wd") and run_option != "allreduce":
        assert "0 on servers" in log
        assert "writes it outside its update" in log or run_option == "hybrid"
    if model == "wide_deep" and run_option != "allreduce":
        # the five tables on the servers (with the dense layers in ps)
        assert {"ps": "9 on servers"}.get(run_option, "5 on servers") in log
    if model in ("lstm", "gru") and run_option == "ps":
        assert "kept off the servers: read inside" in log
    if decay:   # the reference's rate went 0.1, 0.05, ... 0.1 / STEPS
        (rate,) = [v for k, v in expected.items() if k.endswith("learning_rate")]
        assert rate == pytest.approx(0.1 / STEPS)
    if optimizer == "lossscale":
        assert expected["adam/iteration"] == STEPS - 1   # the last step was skipped
        if run_option != "allreduce":
            assert "0 on servers" in log
            assert "runs only when" in log or run_option == "hybrid"
    # the optimizer's state is compared too: Keras's iteration count, or
    # tf.compat.v1 Adam's powers of beta
    assert "iteration" in " ".join(expected) or "beta1_power:0" in expected
    for i in range(3):
        assert_same_parameters(expected, load_worker(tmp_path / "dist", i),
                               what=f"{model} {optimizer} {run_option} worker {i}")


def test_batch_norm_over_every_worker_matches_one_device(tmp_path, reference):
    """Keras 3's BatchNormalization in a tf.function step under the default
    Config (a traced step's batch_norm_group "auto": the global batch's
    statistics; before: each worker's own unless "all" was set), whose
    backward pass GradientTape builds (its ops are
    named after the forward op's scope, not <op>_grad), and a
    LayerNormalization: every weight, slot and moving statistic equal to one
    device on the global batch, the last step's too, split 3/2/2: the
    statistics weigh each worker's by its rows, and so do the gradients
    (transforms.batch_weights). Each norm's gamma and beta share a shape,
    and Keras's optimizer passes all gradients through one IdentityN: each
    must be recognised as its own variable's."""
    model, optimizer, dtype = BATCH_NORM_PROGRAM
    expected = reference(model, optimizer, dtype, uneven=True)
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    log = run_script([sys.executable, str(SCRIPT), "--model", model, "--optimizer", optimizer,
                      "--dtype", dtype, "--steps", str(STEPS), "--batch", str(BATCH),
                      "--spec", str(spec), "--run-option", "hybrid",
                      "--uneven-last", "--out", str(tmp_path / "dist")])
    assert "statistics over all 3 workers" in log
    assert "each worker weighs its gradients by N * b / B" in log
    assert any("moving_variance" in name for name in expected)
    for i in range(3):
        assert_same_parameters(expected, load_worker(tmp_path / "dist", i),
                               what=f"{model} worker {i}")


FIT = REPO / "examples" / "keras_fit.py"


@pytest.mark.parametrize("run_option", FIT_OPTIONS)
def test_fit_matches_one_device(run_option, tmp_path):
    """autopar.fit on 2 workers, which take the step's graph from the plan:
    per-epoch loss and metrics (aggregated over
    workers, training and validation) and the trained weights equal Keras's
    own model.fit on one device (the same shuffled order; each epoch's last,
    smaller batch trained), in float64 (float32 for herring, whose servers
    add float32: weights to float32 tolerance)."""
    dtype = "float32" if run_option == "herring" else "float64"

    def command(name, *extra):
        return [sys.executable, str(FIT), "--epochs", "2", "--dtype", dtype,
                "--save", str(tmp_path / (name + "{worker}.npz")), *extra]
    spec = (write_spec(tmp_path, 2) if run_option == "hybrid"
            else write_two_host_spec(tmp_path, workers=(1, 1), servers=(1, 1)))
    single, log = run_beside(command("single", "--keras"), command(
        "dist", "--spec", str(spec), "--run-option", run_option,
        "--csv", str(tmp_path / "epochs.csv")))
    # a Keras callback (CSVLogger), run by the chief with the aggregated logs
    rows = (tmp_path / "epochs.csv").read_text().splitlines()
    assert rows[0].split(",") == ["epoch", "accuracy", "loss", "val_accuracy", "val_loss"]
    assert [r.split(",")[0] for r in rows[1:]] == ["0", "1"]
    history = [line for line in single.splitlines() if line.startswith("history ")]
    if dtype == "float64":   # the logs to their 6 printed digits
        assert history and f"[worker 0] {history[0]}" in log and f"[worker 1] {history[0]}" in log
    assert log.count("epoch 2/2:") == 1   # logged by the chief alone
    # the step traced by the launcher alone, each worker taking its graph
    # from the plan (runtime/step_graph.py)
    for i in range(2):
        assert f"[worker {i}] worker {i}: step graph taken from the plan" in log
    with np.load(tmp_path / "single0.npz") as data:
        expected = {k: data[k] for k in data.files}
    for i in range(2):
        with np.load(tmp_path / f"dist{i}.npz") as data:
            assert_same_parameters(expected, {k: data[k] for k in data.files},
                                   **({"rtol": 1e-9, "atol": 1e-12} if dtype == "float64" else {}),
                                   what=f"fit worker {i}")


DIGITS = str(REPO / "tests" / "integration" / "scripts" / "keras_fit_digits.py")
CNN = [DIGITS, "--model", "cnn"]


def test_a_convolutional_network_fit_as_keras_fits_it(tmp_path):
    """A Keras 3 CNN (Conv2D, BatchNormalization, MaxPooling2D, Dropout,
    Dense) compiled with "adam" and fit on arrays with Keras's default
    shuffle and a validation split, by autopar.fit's default Config: 3
    workers on 2 uneven hosts, its variables on the servers (ps), end with
    Keras's own model.fit's weights, slots and per-epoch logs (each epoch's
    last batch, 30 of 45, trained as Keras trains it), the batch statistics
    over the global batch without being asked (before: each worker's own
    unless Config(batch_norm_group="all"), not one device's)."""
    expected, got, log = _keras_then_autopar(CNN, tmp_path, (2, 1), "--run-option", "ps")
    assert "statistics over all 3 workers" in log
    # fit splits each batch into equal shares: its last, smaller, one too
    assert "examples where its first had" not in log
    assert sorted(got) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-9, err_msg=name)
    _assert_workers_hold(tmp_path, 3, rtol=1e-7, atol=1e-9)


def test_image_augmentation_inside_the_model_fit_as_keras_fits_it(tmp_path):
    """RandomFlip, RandomZoom and RandomTranslation inside the model (one
    draw per image, each image moved by its own transform) and a dilated
    convolution, fit on 3 workers over 2 uneven hosts: each worker's images
    get one device's draws, and the weights, slots and logs are Keras's own
    fit's (before: refused, the transformed images taken for a mixing of
    the batch's examples and the dilated convolution's blocks for no
    example's rows)."""
    expected, got, log = _keras_then_autopar([DIGITS, "--model", "augmented"], tmp_path,
                                             (2, 1), "--run-option", "allreduce")
    assert "random draws per example" in log
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-9, err_msg=name)
    _assert_workers_hold(tmp_path, 3, rtol=1e-7, atol=1e-9)


COMPILED = [str(REPO / "tests" / "integration" / "scripts" / "keras_fit_compiled.py")]


@pytest.mark.parametrize("loss", ["mse", "hinge", "unreduced"])
def test_fit_computes_the_compiled_loss_as_keras_fit_does(tmp_path, loss):
    """A string loss ("mse": a per-example function), loss_weights, a
    regularizer, dropout and sample weights, trained from a tf.data.Dataset
    of batches that reshuffles each epoch (with a seed): autopar.fit's step
    computes the loss as Keras's train step does (model.compute_loss), each
    worker draws one device's dropout masks for its rows, and every worker
    reads the dataset's batches in the order Keras's fit does (the last
    batch of each epoch, 10 examples, split 3/3/2/2: each worker weighs its
    gradients by its rows; before, it was left out), so 4 workers
    on 2 uneven hosts end with Keras's own model.fit's weights, slots and
    per-epoch losses, validation included (before: a dataset was refused;
    with arrays, the dropout masks made the losses 0.49 off); and an
    EarlyStopping callback (run by the chief) stops every worker after the
    epoch it stops Keras's fit (4 of 5) and restores the best epoch's
    weights, a LearningRateScheduler halves the rate from the second epoch
    on: callbacks see the trained weights, and what they write is what
    every worker trains with. "hinge": Keras's Hinge loss, which converts
    labels of 0 and 1 to -1 and 1 in a cond on whether all of the batch's
    are 0 or 1; each training step checks every worker's share decides
    alike (before: refused, "a StatelessIf combining the values of several
    examples"). "unreduced": MeanSquaredError(reduction=None), a loss of one
    value per example, which Keras's step differentiates as their sum and
    its loss tracker logs as their mean over the epoch (before: the job
    failed after its first step, converting the vector to a number)."""
    expected, got, log = _keras_then_autopar(
        COMPILED + {"hinge": ["--hinge"], "unreduced": ["--unreduced"]}.get(loss, []),
        tmp_path, (3, 1))
    # with the learning rate LearningRateScheduler adds to the logs
    assert sorted(got) == ["learning_rate", "loss", "val_loss"]
    if loss == "mse":
        assert len(expected["loss"]) == 4
    elif loss == "hinge":
        assert "conds deciding by whether every example, or any, of the batch passes a test " \
            "('compile_loss/hinge/cond')" in log, log[-3000:]
    # the last batch of each epoch (10 examples) trains in unequal shares
    assert "not trained on" not in log
    if loss == "unreduced":
        # (a sum over the batch: the workers' gradients add up, whatever their shares)
        assert "gradients: summed over workers" in log, log[-3000:]
    else:
        assert "each worker weighs its gradients by N * b / B" in log
    for name in got:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-12, err_msg=name)
    _assert_workers_hold(tmp_path, 4, rtol=1e-9, atol=1e-12)


def test_a_dataset_batch_of_fewer_examples_than_workers_fails_the_job_before_its_step(
        tmp_path):
    """50 examples in batches of 16: the last batch of each epoch has 2
    examples for 4 workers, which one device trains on and 2 workers would
    have no row of. Every worker reads that batch and stops before its step,
    naming it (before: left out with a warning, and the job ended off one
    device's weights); nothing is saved."""
    spec = write_two_host_spec(tmp_path, workers=(3, 1), servers=(1, 1))
    code, log = run_to_end([sys.executable, *COMPILED, "--examples", "50", "--spec", str(spec),
                            "--out", str(tmp_path / "dist{worker}.npz")])
    assert code != 0
    assert re.search(r"job failed: worker \d \(pid \d+\) failed", log), log[-2000:]
    assert ("autopar.fit: epoch 1, batch 4 has 2 examples, which do not split over the 4 "
            "workers: each needs a row of every batch (one device trains on it)") in log
    assert not list(tmp_path.glob("dist*.npz"))


OWN_STEP = str(REPO / "tests" / "integration" / "scripts" / "keras_fit_own_step.py")


@pytest.mark.parametrize("model,run_option", [("compiled", "hybrid"), ("summed", "allreduce"),
                                              ("gan", "ps"), ("wgan", "hybrid")])
def test_a_models_own_train_step_fit_as_keras_fits_it(model, run_option, tmp_path):
    """A model class that overrides train_step, as Keras's guide to
    customizing fit() writes one (before: refused): autopar.fit traces the
    model's own step on what Keras's fit hands it, (x, y, sample_weight)
    of arrays or a dataset's element (x alone), and 3 workers on 2 uneven
    hosts end with Keras's own model.fit's variables, slots and per-epoch
    logs: the metrics the step updates in the graph, each worker's on its
    rows, are reset at each epoch's start and their state summed over
    workers at its end (R2Score's arrays too); validation runs the model's
    own test step, combined the same way, a Mean fed the batch's loss by
    Keras's guide's test_step weighing each worker's value by its share of
    a batch that splits unevenly (the last, 1/1/0; before: the workers'
    means weighed alike); EarlyStopping, watching a metric of the step, stops every worker
    after epoch 2 of 4. The summed loss's Mean tracker (one value per step,
    a sum over the batch): in training weighed by N, in validation counted
    by each worker's share (before: their count N per step, one device's 1,
    the logged loss 1/N of one device's); a tracker of the batch's mean
    beside it weighed by the worker's rows, N * b / B, in batches that split
    unevenly (before: only beside a loss averaged over the batch); a Sum of
    the batch's mean, in training and validation, weighed by the worker's
    share b / B (before: the workers' means added up, N times one
    device's), and a Sum of the summed loss, which adds up as it is. The GAN: two models, an optimizer each, the latent
    vectors and the labels' noise drawn from a SeedGenerator per example
    (one device's draws), on the servers. WGAN-GP: a gradient penalty
    differentiated inside the critic's tape, its interpolation weights
    drawn per example; its losses logged as computed (the workers' mean:
    one device's for equal shares). The GANs' steps are traced by the
    launcher alone, each worker building the two optimizers the trace built
    and taking the step's graph from the plan; the compiled loss's metrics,
    built by the trace, make each worker trace that step itself."""
    expected, got, log = _keras_then_autopar([OWN_STEP, "--model", model], tmp_path, (2, 1),
                                             "--run-option", run_option)
    # The GANs' steps traced by the launcher alone: each worker built the
    # two optimizers the trace built and took the graph from the plan. The
    # compiled loss's metrics are built by the trace (their first
    # update_state): each worker traces that step itself.
    taken = [f"[worker {i}] worker {i}: step graph taken from the plan" in log for i in range(3)]
    assert taken == [model != "compiled"] * 3
    assert sorted(got) == sorted(expected) and len(got[sorted(got)[0]]) == (
        3 if model == "gan" else 2)
    if model == "compiled":
        assert sorted(got) == ["loss", "mae", "r2_score", "val_loss", "val_mae", "val_r2_score"]
    if model == "summed":
        assert sorted(got) == ["examples", "loss", "mean", "sumloss", "summean", "val_examples",
                               "val_loss", "val_mean", "val_sumloss", "val_summean"]
        assert "what a step adds of a sum over its batch to 'loss/total'" in log
        assert "what a step adds of a mean over its batch to 'mean/total' (" in log
        # the Sum of the batch's mean: each worker's addition weighed by its share
        assert ("what a step adds of a mean over its batch to 'summean/total' (a total no "
                "count divides") in log
    for name in got:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-12, err_msg=name)
    _assert_workers_hold(tmp_path, 3, rtol=1e-9, atol=1e-12)


PYDATASET = str(REPO / "tests" / "integration" / "scripts" / "keras_fit_pydataset.py")


def test_a_pydataset_fit_as_keras_fits_it(tmp_path):
    """A keras.utils.PyDataset (before: refused as a generator), its batch
    order shuffled by fit (drawn by the chief, as Keras draws it) and by the
    dataset's own on_epoch_end from NumPy's global random state (the same in
    every worker of a seeded program), validated on a PyDataset: 3 workers
    on 2 uneven hosts end with Keras's own model.fit's variables, slots and
    per-epoch logs."""
    expected, got, _ = _keras_then_autopar([PYDATASET, "--reshuffle", "global"], tmp_path,
                                           (2, 1))
    assert sorted(got) == ["loss", "mae", "val_loss", "val_mae"] and len(got["loss"]) == 3
    for name in got:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-12, err_msg=name)
    _assert_workers_hold(tmp_path, 3, rtol=1e-9, atol=1e-12)


def test_a_pydataset_read_differently_by_the_workers_is_refused(tmp_path):
    """A PyDataset whose on_epoch_end shuffles with a generator of each
    process's own: the workers' first batches differ, and every worker
    stops with the reason before training on them."""
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    with LineReader(start_job([sys.executable, PYDATASET, "--reshuffle", "fresh", "--spec",
                               str(spec), "--out", str(tmp_path / "dist{worker}.npz")])) as job:
        output = job.rest(timeout=240)
    assert job.proc.returncode != 0
    # (every worker stops with it; whichever the launcher hears of first)
    assert re.search(r"job failed: worker \d \(pid \d+\) failed", output), output[-2000:]
    assert ("autopar.fit: the workers read different batches from the PyDataset x (the first of "
            "epoch 1)") in output
    assert not list(tmp_path.glob("dist*.npz"))


QUICKSTART = str(REPO / "tests" / "integration" / "scripts" / "quickstart_metrics.py")


def test_metrics_combined_over_workers_are_one_devices(tmp_path):
    """TensorFlow's quickstart loop, its metrics (a Mean of the loss, an
    accuracy, an AUC's arrays) combined over 3 workers on 2 uneven hosts
    after each of 2 epochs and never reset: each epoch's results are one
    device's over the same global batches, the second's counting on from
    the first's (the combined values are Python's view: each worker's
    copies go on from their own), and they hold after the runner closes.
    Batches of 7 split 3/2/2: the Mean adds each worker's loss weighed by
    its rows (before: the workers' mean of their means)."""
    def results(log: str) -> list:
        line = next(line for line in log.splitlines() if "results " in line and (
            "[worker" not in line or "[worker 0]" in line))
        return json.loads(line.split("results ", 1)[1])
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    expected, got = (results(log) for log in run_beside(
        [sys.executable, QUICKSTART], [sys.executable, QUICKSTART, "--spec", str(spec)]))
    # the third: read after the runner closed, the last combine_metrics the
    # last thing inside its block (before: close() copied each worker's own
    # values back over them)
    assert len(got) == 3 and got[1] != got[0] and expected[2] == expected[1]
    # float64; a mean's sum over workers rounds otherwise than one device's
    np.testing.assert_allclose(got, expected, rtol=1e-12)


SUMMARIES = str(REPO / "tests" / "integration" / "scripts" / "summary_step.py")


def test_summaries_written_inside_a_step_are_the_chiefs(tmp_path):
    """A step writing tf.summary records inside it (a scalar of its loss, a
    histogram of a kernel), on 3 workers over 2 uneven hosts, each with a
    writer of its own: the chief's writer gets every record, at the steps
    one device writes them, the loss its own call returned; the other
    workers' writers get none (before: refused, the writer being a captured
    resource)."""
    from tests.programs.summary_step import events
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    log = run_script([sys.executable, SUMMARIES, "--spec", str(spec),
                      "--logdir", str(tmp_path / "logs")])
    losses = {int(m.group(1)): json.loads(m.group(2))
              for m in re.finditer(r"losses (\d) (\[.*\])", log)}
    assert sorted(losses) == [0, 1, 2]
    chief = events(tmp_path / "logs" / "worker0")
    assert [(step, tag) for step, tag, _ in chief] == [
        (1, "loss"), (0, "kernel"), (2, "loss"), (10, "kernel"), (3, "loss"), (20, "kernel")]
    assert [float(v) for _, tag, v in chief if tag == "loss"] == pytest.approx(losses[0],
                                                                               rel=1e-6)
    for worker in (1, 2):
        assert events(tmp_path / "logs" / f"worker{worker}") == []


SUMMED = [DIGITS, "--model", "summed"]


def test_losses_summed_over_the_batch_fit_as_keras_fits_them(tmp_path):
    """Two outputs whose losses sum over the batch (reduction="sum", with
    loss weights), on 3 workers over 2 uneven hosts with the variables on
    the servers, in global batches of 47 (before: refused, "must divide by
    the 3 workers"; any batch trains in shares of any size, as one device
    takes any batch): autopar.fit finds the step's loss through Keras's sum of
    the outputs' losses and adds the workers' gradients (before: no loss
    found, a mean assumed, the weights 190x off), and logs what Keras's
    fit logs: a batch's loss is the workers' sum, each output's loss and
    the validation's as Keras weighs them (every batch once), in Keras's
    validation batches (before: a third of Keras's values)."""
    expected, got, _ = _keras_then_autopar(SUMMED, tmp_path, (2, 1), "--run-option", "ps")
    assert sorted(got) == sorted(expected) and "val_parity_loss" in got
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-9, err_msg=name)
    _assert_workers_hold(tmp_path, 3, rtol=1e-7, atol=1e-9)


MASKED = [str(REPO / "tests" / "integration" / "scripts" / "keras_fit_masked.py")]


@pytest.mark.parametrize("variant", ["mask", "weights_mean", "padded"])
def test_fit_of_a_loss_over_a_count_matches_keras_fit(tmp_path, variant):
    """A sequence tagger over padded sequences (Embedding(mask_zero=True),
    a cross-entropy per position): Keras weighs each kept position by the
    batch's size / count of kept positions, and each worker's count differs.
    Every worker rebuilds the weights its backward pass reads from the count
    summed over workers, so 4 workers end with Keras's own model.fit's
    weights, Adam's slots and per-epoch losses, training and validation
    (before: refused, "a count of the batch's values"). Likewise a loss
    divided by its sample weights' sum (reduction="mean_with_sample_weight",
    no mask): trained as one device before, its logs now are one device's
    too (before: the workers' mean of their own losses); the accuracy of
    the kept positions alone, as Keras's metrics read the mask (before:
    of every position, the predictions autopar computed the metrics from
    carrying none). "padded": the training sequences padded to each batch's
    longest (an input of unknown length) and a Dropout on the embeddings,
    its mask drawn per example (before: refused, "a padded length"); the
    validation's last batch of 2 leaves two workers no rows (before: the
    others' run of the loss counts' graph, which holds the padded lengths'
    check, made the workers' next collective fail)."""
    expected, got, log = _keras_then_autopar(
        MASKED + {"mask": [], "weights_mean": ["--weights-mean"],
                  "padded": ["--padded"]}[variant], tmp_path, (3, 1))
    assert "loss count '" in log
    if variant == "padded":
        assert "random draws per example ('" in log and "inputs of unknown lengths" in log
    assert sorted(got) == ["accuracy", "loss", "val_accuracy", "val_loss"] and len(
        got["loss"]) == 3
    for name in got:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-12, err_msg=name)
    _assert_workers_hold(tmp_path, 4, rtol=1e-9, atol=1e-12)


def test_tensorflows_transformer_tutorial_fits_as_keras_fits_it(tmp_path):
    """TensorFlow's Transformer tutorial (tensorflow/text's
    docs/tutorials/transformer.ipynb, ported: scripts/tf_text_transformer.py)
    on 3 workers: batches padded to their longest sentence, a masked loss
    and a masked_accuracy metric that each reduce the batch to one value.
    Keras's fit calls the model without `training` (its call() takes only
    the inputs), so its Dropouts drop nothing; autopar.fit did call it with
    training=True (before: every variable off, 12 draws of each dropout
    seed more than Keras). Keras averages masked_accuracy's ratio over the
    batches, which no sum of the workers' ratios gives: the chief computes
    it from each whole batch (before: the workers' mean of their shares'
    ratios, 0.0129 against 0.0126 in the first epoch)."""
    script = [str(REPO / "tests" / "integration" / "scripts" / "tf_text_transformer.py")]
    expected, got, log = _keras_then_autopar(script, tmp_path, (2, 1))
    assert sorted(got) == ["loss", "masked_accuracy", "val_loss", "val_masked_accuracy"]
    for name in got:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-12, err_msg=name)
    assert "inputs of unknown lengths" in log
    assert "metrics of whole batches (masked_accuracy: " in log
    # float64. The attention's key biases have no gradient but rounding
    # noise (softmax ignores a shift of every key), which Adam's epsilon of
    # 1e-9 turns into moves of up to ~1e-11 a step
    _assert_workers_hold(tmp_path, 3, rtol=1e-9, atol=1e-8)


def _keras_then_autopar(script: list[str], tmp_path, workers: tuple[int, int], *extra: str):
    """`script` (its path and arguments) fit by Keras's own model.fit on one
    device (--keras), then by autopar.fit (with `extra` arguments) on 2
    hosts of `workers` workers and a server each, each saving its variables
    under tmp_path: (Keras's per-epoch logs, autopar's, autopar's output)."""
    def history(log: str) -> dict:
        line = next(line for line in log.splitlines() if "history " in line)
        return json.loads(line.split("history ", 1)[1])
    spec = write_two_host_spec(tmp_path, workers=workers, servers=(1, 1))
    expected_log, log = run_beside(
        [sys.executable, *script, "--keras", "--out", str(tmp_path / "keras{worker}.npz")],
        [sys.executable, *script, "--spec", str(spec), *extra,
         "--out", str(tmp_path / "dist{worker}.npz")])
    return history(expected_log), history(log), log


def _assert_workers_hold(tmp_path, workers: int, rtol: float, atol: float) -> None:
    """Every one of `workers` workers saved Keras's model.fit's variables
    (_keras_then_autopar's files)."""
    with np.load(tmp_path / "keras0.npz") as data:
        weights = {k: data[k] for k in data.files}
    for i in range(workers):
        with np.load(tmp_path / f"dist{i}.npz") as data:
            assert_same_parameters(weights, {k: data[k] for k in data.files}, rtol=rtol,
                                   atol=atol, what=f"worker {i}")


@pytest.mark.parametrize("optimizer,placement", [
    # SGD with momentum reads the momentum before writing it and makes the
    # sparse gradient dense to the whole variable's shape: kept whole (split,
    # each partition's update combined its rows with every row:
    # "Incompatible shapes: [12,6] vs. [24,6]")
    ("sgd", "whole (its update reads the whole variable)"),
    # plain SGD scatters the rows: split, and the Embedding's gather of the
    # variable's value reads only its rows from the partitions
    ("sgd_plain", "2 partitions on server 0, server 1"),
    # Adagrad squares each row, then scatters the squares and the steps: its
    # rows, unsummed, dealt to the partitions' queues
    ("adagrad", "2 partitions on server 0, server 1")])
def test_an_embedding_asked_for_two_partitions(optimizer, placement, tmp_path, reference):
    """A Keras 3 Embedding on the servers, asked for 2 row partitions, trains
    to one device's values; the report says where it is."""
    model, dtype = "emb_mlp", "float32"
    expected = reference(model, optimizer, dtype)
    spec = write_two_host_spec(tmp_path, workers=(2, 1), servers=(1, 1))
    log = run_script([sys.executable, str(SCRIPT), "--model", model, "--optimizer", optimizer,
                      "--dtype", dtype, "--steps", str(STEPS), "--batch", str(BATCH),
                      "--spec", str(spec), "--run-option", "hybrid",
                      "--partitions", "sequential/embedding/embeddings=2",
                      "--out", str(tmp_path / "dist")])
    assert placement in log, log[-3000:]
    for i in range(3):
        assert_same_parameters(expected, load_worker(tmp_path / "dist", i),
                               what=f"{model} {optimizer} partitions worker {i}")
