"""TensorFlow 2 programs: lifting a traced tf.function step into a graph
(transforms.lift) and what the analysis decides on it from data flow, each
pinned on a small Keras 3 model (tests/programs/keras_step.py)."""
import numpy as np
import pytest
import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.lift import CALL_OP, lift
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.report import build_report
from autopar.transforms.rewrite import rewrite_for_worker
from autopar.transforms.topology import Topology
from tests import models
from tests.programs import keras_step

tf1 = tf.compat.v1
TOPOLOGY = Topology(("127.0.0.1", "127.0.0.1", "127.0.0.2"), 2)


@pytest.fixture(autouse=True)
def _keras_settings():
    with keras_step.keras_settings_kept():
        yield


def _lifted(kind="emb_mlp", optimizer="adam", dtype="float64"):
    program = keras_step.build(kind, optimizer, dtype)
    return program, lift(program.concrete)


def test_lifted_step_runs_in_a_session_as_the_function_runs():
    """Inputs keep their names, every captured variable becomes a resource
    variable of its name fed its Python value at initialisation, and three
    steps in a plain Session equal three calls of the tf.function."""
    program, lifted = _lifted()
    graph, cf = lifted.graph, program.concrete
    assert set(lifted.python_variables) == {v.name.split(":")[0] for v in cf.graph.variables}
    trainable = {v.op.name for v in graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES)}
    assert trainable == {v.path for v in program.model.trainable_variables}
    assert graph.get_operation_by_name(CALL_OP).type == "NoOp"
    assert [t.name for t in graph.get_collection(tf1.GraphKeys.LOSSES)] == [cf.graph.outputs[0].name]
    with graph.as_default():
        init = tf1.global_variables_initializer()
    session = tf1.Session(graph=graph)
    session.run(init, lifted.initial_feed())
    batches = [program.batch(k, 6) for k in range(3)]
    for x, y in batches:
        session.run(CALL_OP, {cf.graph.inputs[0].name: x, cf.graph.inputs[1].name: y})
    lifted_values = {name: session.run(name + "/Read/ReadVariableOp:0")
                     for name in lifted.python_variables}
    for x, y in batches:
        program.train_step(x, y)
    for name, variable in lifted.python_variables.items():
        np.testing.assert_array_equal(lifted_values[name], variable.numpy(), err_msg=name)


def test_a_lifted_output_fetched_alone_trains_nothing():
    """A tf.function's outputs wait for its updates; lifted, only CALL_OP
    does: the loss fetched alone is computed from the current weights and
    updates none (so with micro-batches it comes from the micro-batch runs)."""
    program, lifted = _lifted()
    graph, cf = lifted.graph, program.concrete
    loss = graph.get_tensor_by_name(cf.graph.outputs[0].name)
    assert not loss.op.control_inputs
    with graph.as_default():
        init = tf1.global_variables_initializer()
    session = tf1.Session(graph=graph)
    session.run(init, lifted.initial_feed())
    x, y = program.batch(0, 6)
    feed = {cf.graph.inputs[0].name: x, cf.graph.inputs[1].name: y}
    kernel = [v for v in program.model.trainable_variables if v.path.endswith("kernel")][0]
    weights = kernel.path + "/Read/ReadVariableOp:0"
    before = session.run(weights)
    first = session.run(loss, feed)
    np.testing.assert_array_equal(session.run(weights), before)
    assert session.run(loss, feed) == first
    session.run(CALL_OP, feed)
    assert not np.array_equal(session.run(weights), before)


def test_keras_adam_slots_counter_and_gradients_from_data_flow():
    program, lifted = _lifted()
    analysis = analyze_graph(lifted.graph)
    assert len(analysis.train_groups) == 1
    emb = analysis.variable(program.model.layers[0].embeddings.path)
    kernel = analysis.variable(program.model.layers[2].kernel.path)
    # m and v of each variable, whatever their names; the iteration count is
    # read by every update and written from no gradient: state
    assert [s.split("_")[-1] for s in kernel.slots] == ["momentum", "velocity"]
    assert any(s.name.endswith("iteration") for s in analysis.state)
    assert kernel.gradient == "dense" and kernel.grad_tensor.startswith("gradient_tape/")
    # the embedding's gradient leaves the tape as IndexedSlices; Keras
    # densifies it inside the optimizer
    assert emb.gradient == "sparse" and emb.grad_indices.startswith("gradient_tape/")
    assert kernel.recognised.startswith("writes of it and of its slots fed by its gradient")
    # global_clipnorm: every gradient scaled by one norm taken over all of them
    assert "derived from other gradients" in kernel.ps_blocker
    assert analysis.loss_reduction == "mean"


@pytest.mark.parametrize("outputs,regularized,reduction,expected", [
    (2, False, "sum", "sum"),
    (1, True, "sum", "neither"),
    (1, True, "sum_over_batch_size", "mean"),
])
def test_a_compiled_loss_of_several_terms_is_found_and_read(outputs, regularized, reduction,
                                                            expected):
    """Keras's compiled loss adds its outputs' losses with Python's sum()
    (0 + a + 0.5 b) and the regularization losses as the sum of a stack,
    whose gradients read none of their inputs: the step's returned loss is
    still found, through the sums, a constant term has no gradient, and a
    regularizer beside a loss summed over the batch is the case no
    aggregation makes one device's (refused). Before: no loss found, a mean
    assumed, gradients of summed losses divided by the workers."""
    import keras
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(3, kernel_regularizer=keras.regularizers.L2(0.01)
                                if regularized else None)(inputs)
    model = keras.Model(inputs, [keras.layers.Dense(2)(hidden) for _ in range(outputs)])
    losses = [keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
              for _ in range(outputs)]
    model.compile(optimizer="sgd", loss=losses, loss_weights=[1.0, 0.5][:outputs])
    x, y = np.zeros((2, 4), "float32"), [np.zeros(2, "int64")] * outputs
    model.compute_loss(x, y, model(x), training=False)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x, y, y_pred, training=True)
        grads = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, y_pred

    lifted = lift(step.get_concrete_function(tf.TensorSpec([None, 4]),
                                             [tf.TensorSpec([None], tf.int64)] * outputs))
    analysis = analyze_graph(lifted.graph)
    assert analysis.loss_reduction == expected, analysis.loss_reduction_why


@pytest.mark.parametrize("reduction", ["sum", "sum_over_batch_size"])
def test_the_loss_of_a_step_that_does_not_return_it(reduction):
    """TensorFlow's quickstart step: the loss goes to a Keras Mean metric,
    the function returns nothing. The loss is still found (the one loss
    no other is computed from), so a summed loss is a sum (before: no loss
    found, a mean assumed)."""
    import keras
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                             reduction=reduction)
    optimizer, train_loss = keras.optimizers.SGD(0.1), keras.metrics.Mean()

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_object(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        train_loss(loss)

    lifted = lift(step.get_concrete_function(tf.TensorSpec([None, 4]),
                                             tf.TensorSpec([None], tf.int64)))
    analysis = analyze_graph(lifted.graph)
    assert analysis.loss_reduction == {"sum": "sum"}.get(reduction, "mean"), \
        analysis.loss_reduction_why
    assert "no loss tensor" not in analysis.loss_reduction_why


@pytest.mark.parametrize("reductions,returned,expected", [
    (("sum", "sum"), True, "sum"),
    (("sum", "sum"), False, "sum"),
    (("sum_over_batch_size", "sum"), True, "neither"),
    (("sum_over_batch_size", "sum"), False, "neither"),
])
def test_the_losses_of_two_tapes_all_decide(reductions, returned, expected):
    """Two tapes, two models, two optimizers (a GAN's step): both losses
    decide how gradients combine, returned or not, and a regularizer the
    step returns beside them says nothing of the batch. One mean and one
    sum: no aggregation matches one device for both, refused (before: the
    first returned loss alone decided; none returned, a mean was assumed)."""
    import keras
    models = [keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]) for _ in range(2)]
    losses = [keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=r)
              for r in reductions]
    optimizers = [keras.optimizers.SGD(0.1) for _ in range(2)]

    @tf.function
    def step(x, y):
        values = []
        for model, loss_fn, optimizer in zip(models, losses, optimizers):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            values.append(loss)
        if returned:
            return values[0], values[1], tf.add_n([tf.nn.l2_loss(m.layers[0].kernel)
                                                   for m in models])

    lifted = lift(step.get_concrete_function(tf.TensorSpec([None, 4]),
                                             tf.TensorSpec([None], tf.int64)))
    analysis = analyze_graph(lifted.graph)
    assert analysis.loss_reduction == expected, analysis.loss_reduction_why
    if expected == "neither":
        assert "reduce differently over the batch" in analysis.loss_reduction_why
        with pytest.raises(UnsupportedGraphError, match="reduce differently"):
            make_plan(analysis, TOPOLOGY)


def test_the_loss_is_what_the_tape_differentiates():
    """A step traced for a static batch, whose summed loss's gradient reads
    none of the loss's inputs (Sum of a static shape), returning a mean of
    activations the backward pass reads (a ReLU's output) before the loss:
    the loss is the tape's target, found from its backward pass, a sum
    (before: the activations' mean was taken for the loss)."""
    import keras
    hidden = keras.layers.Dense(3, activation="relu")
    model = keras.Sequential([keras.Input((4,)), hidden, keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            activations = hidden(x)
            loss = tf.reduce_sum(tf.square(model.layers[-1](activations) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_mean(activations), loss

    cf = step.get_concrete_function(tf.TensorSpec([8, 4]), tf.TensorSpec([8, 2]))
    lifted = lift(cf)
    assert [t.name for t in lifted.graph.get_collection(tf1.GraphKeys.LOSSES)] == \
        [cf.graph.outputs[1].name]
    analysis = analyze_graph(lifted.graph)
    assert analysis.loss_reduction == "sum", analysis.loss_reduction_why


def test_a_tape_that_differentiates_each_examples_loss_sums_them():
    """tape.gradient of the per-example losses (a Keras loss function's
    unreduced values): the gradient of their sum, so the workers' gradients
    add up (before: no loss found, a mean assumed)."""
    import keras
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            losses = keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True)
        grads = tape.gradient(losses, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.reduce_mean(losses)

    lifted = lift(step.get_concrete_function(tf.TensorSpec([None, 4]),
                                             tf.TensorSpec([None], tf.int64)))
    analysis = analyze_graph(lifted.graph)
    assert analysis.loss_reduction == "sum", analysis.loss_reduction_why


def test_a_constant_dense_shape_is_not_taken_for_the_indices():
    """A tf.Variable read by tf.nn.embedding_lookup: its IndexedSlices
    gradient's dense_shape is a constant (the table's static shape), an
    integer vector as near to Keras's densifying segment sum as the indices;
    taken for the indices, every worker's rows went to the wrong ids."""
    program, lifted = _lifted("module", optimizer="adam_noclip")
    analysis = analyze_graph(lifted.graph)
    table = analysis.variable(program.model.table.name.split(":")[0])
    assert table.gradient == "sparse"
    indices = lifted.graph.get_tensor_by_name(table.grad_indices)
    assert tf.get_static_value(indices) is None
    ids = lifted.graph.get_tensor_by_name(program.concrete.graph.inputs[0].name)
    assert _reaches(ids, {indices.op.name})


def test_a_penalised_embedding_gets_the_sum_of_rows_and_penalty():
    """An embedding with a regularizer: the tape densifies its rows'
    IndexedSlices (a segment sum outside its scope) to add the penalty's
    dense gradient; the sum is the gradient, not the penalty's term alone
    (the rows' term was then applied unaveraged)."""
    program, lifted = _lifted("bn_mlp", "adam")
    emb = analyze_graph(lifted.graph).variable(program.model.layers[0].embeddings.path)
    assert emb.gradient == "dense"
    total = lifted.graph.get_tensor_by_name(emb.grad_tensor)
    assert total.op.type == "AddN"
    assert {t.op.type for t in total.op.inputs} >= {"UnsortedSegmentSum"}


def test_micro_batch_gradients_added_by_the_program_are_one_gradient():
    """Two tapes in one step (two micro-batches), each variable's gradients
    added with +: the sum is the gradient that travels; averaging one term
    left the other this worker's own."""
    program, lifted = _lifted("micro", "sgd")
    analysis = analyze_graph(lifted.graph)
    for v in analysis.variables:
        assert v.gradient == "dense" and v.grad_tensor, (v.name, v.gradient, v.grad_values,
                                                          v.grad_indices, v.shape)
        total = lifted.graph.get_tensor_by_name(v.grad_tensor)
        assert total.op.type == "AddV2", (v.name, v.grad_tensor)
        assert all(t.op.name.startswith("gradient_tape") or t.op.type == "UnsortedSegmentSum"
                   for t in total.op.inputs), v.name


def test_gradients_combined_otherwise_than_by_a_sum_are_refused():
    """Each micro-batch's gradient clipped, then added: no one gradient per
    variable is the step's, so the analysis names two of them."""
    import keras
    program = keras_step.build("emb_mlp", "sgd", "float64")
    model, optimizer = program.model, program.optimizer
    loss_fn = keras.losses.MeanSquaredError()

    @tf.function
    def step(x, y):
        grads = []
        for part in (slice(None, 3), slice(3, None)):
            with tf.GradientTape() as tape:
                loss = loss_fn(y[part], model(x[part], training=True))
            grads.append([tf.clip_by_norm(tf.convert_to_tensor(g), 0.1)
                          for g in tape.gradient(loss, model.trainable_variables)])
        optimizer.apply_gradients(zip([a + b for a, b in zip(*grads)], model.trainable_variables))
        return loss

    concrete = step.get_concrete_function(tf.TensorSpec([None, keras_step.IDS], tf.int32),
                                          tf.TensorSpec([None, 1], tf.float64))
    with pytest.raises(UnsupportedGraphError, match=r"from 2 gradients combined otherwise than "
                                                    r"by a sum \('gradient_tape"):
        analyze_graph(lift(concrete).graph)


def test_gradients_accumulated_from_zeros_each_scaled_are_one_gradient():
    """Gradient accumulation as custom loops write it: zeros, plus each
    micro-batch's gradient divided by 2 (before: refused as gradients
    "combined otherwise than by a sum"). The accumulated sum travels; a
    gradient the program reads otherwise too (tf.clip_by_norm also takes
    its norm) is not a scaled term of one: there the gradient itself travels,
    every reader seeing its average."""
    program, lifted = _lifted("accum", "sgd")
    analysis = analyze_graph(lifted.graph)
    for v in analysis.variables:
        total = lifted.graph.get_tensor_by_name(v.grad_tensor)
        assert total.op.type == "AddV2", (v.name, v.grad_tensor)
        first, scaled = total.op.inputs
        assert first.op.type == "AddV2" and scaled.op.type == "RealDiv", v.name
        # tf.zeros_like(v), folded into a constant where v's shape is static
        assert first.op.inputs[0].op.type in ("ZerosLike", "Const"), v.name
    import keras
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def clipped(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grads = [tf.clip_by_norm(g, 0.5) for g in tape.gradient(loss, model.trainable_variables)]
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    graph = lift(clipped.get_concrete_function(tf.TensorSpec([None, 3]),
                                               tf.TensorSpec([None, 2]))).graph
    for v in analyze_graph(graph).variables:
        assert v.grad_tensor.startswith("gradient_tape/"), (v.name, v.grad_tensor)


@pytest.mark.parametrize("combine", ["clip", "square"])
def test_an_embeddings_gradients_combined_otherwise_than_by_a_sum_are_refused(combine):
    """Two micro-batches' IndexedSlices gradients of an embedding, each
    made dense and clipped (or squared), then added. Before: taken for a
    sparse gradient, the second micro-batch's rows alone, which would have
    been averaged over the workers while the first's stayed this worker's."""
    import keras
    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(24, 6),
                              keras.layers.GlobalAveragePooling1D()])
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):
        grads = []
        for part in (slice(None, 2), slice(2, None)):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x[part]) - y[part]) ** 2)
            g = tf.convert_to_tensor(tape.gradient(loss, model.trainable_variables)[0])
            grads.append(tf.clip_by_norm(g, 0.1) if combine == "clip" else g ** 2)
        optimizer.apply_gradients([(grads[0] + grads[1], model.trainable_variables[0])])

    concrete = step.get_concrete_function(tf.TensorSpec([None, 3], tf.int32),
                                          tf.TensorSpec([None, 6]))
    with pytest.raises(UnsupportedGraphError, match=r"embeddings' is updated from 2 gradients "
                                                    r"combined otherwise than by a sum"):
        analyze_graph(lift(concrete).graph)


def test_gradients_computed_inside_a_loop_are_refused_naming_it():
    """Gradient accumulation in a tf.range loop: the tapes run inside the
    While op's body, which the analysis does not see into (before: "no
    gradient computation found ... build the train op with a
    tf.compat.v1.train optimizer")."""
    import keras
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):
        accumulated = [tf.zeros_like(v) for v in model.trainable_variables]
        for i in tf.range(2):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x[i::2]) - y[i::2]) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            accumulated = [a + g / 2 for a, g in zip(accumulated, grads)]
        optimizer.apply_gradients(zip(accumulated, model.trainable_variables))

    concrete = step.get_concrete_function(tf.TensorSpec([None, 3]), tf.TensorSpec([None, 2]))
    with pytest.raises(UnsupportedGraphError, match=r"the step's gradients are computed inside "
                                                    r"the loop 'while' \(While"):
        analyze_graph(lift(concrete).graph)


def test_a_variable_updated_several_times_in_one_step_is_refused_as_such():
    """A critic trained twice per step (WGAN-GP's several discriminator
    steps in one train_step): each update from a gradient of its own, taken
    after the last update. Refused naming the two updates (before: as
    gradients "combined otherwise than by a sum", advising to add them)."""
    import keras
    program = keras_step.build("emb_mlp", "sgd", "float64")
    model, optimizer = program.model, program.optimizer
    loss_fn = keras.losses.MeanSquaredError()

    @tf.function
    def step(x, y):
        for _ in range(2):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                          model.trainable_variables))
        return loss

    concrete = step.get_concrete_function(tf.TensorSpec([None, keras_step.IDS], tf.int32),
                                          tf.TensorSpec([None, 1], tf.float64))
    with pytest.raises(UnsupportedGraphError, match=r"is updated 2 times in one step \('.*', "
                                                    r"'.*'\), each from a gradient of its own"):
        analyze_graph(lift(concrete).graph)


def test_a_non_chief_keeps_what_reads_the_ops_before_a_server_update():
    """ps: a non-chief does not run its server variables' updates, but the
    ops between gradient and update stay, for Keras's optimizer reads them
    elsewhere too (an Identity of the first gradient); they were NoOps, and
    the worker's graph did not import."""
    program, lifted = _lifted("micro", "sgd")
    analysis = analyze_graph(lifted.graph)
    plan = make_plan(analysis, TOPOLOGY, options=PlanOptions(run_option="ps"))
    worker = rewrite_for_worker(lifted.graph, analysis, plan, 1)
    with tf.Graph().as_default():
        tf1.import_graph_def(worker.meta_graph.graph_def, name="")


@pytest.mark.parametrize("optimizer", ["adam_noclip", "adagrad", "rmsprop"])
def test_squared_rows_reach_the_servers_unsummed(optimizer):
    """Keras's Adam, Adagrad and RMSprop square each row of the IndexedSlices
    gradient before rows of one id are added: the embedding goes to the
    servers all the same (before: kept off them), which get every
    contributor's rows as they left the tapes: the hosts' leaders (2 + 1
    workers: 0 and 2) each push their host's gathered rows, not combined by
    id, into a queue of their own, and the chief's update reads both
    queues' rows in host order (no accumulator, which adds rows by id)."""
    program, lifted = _lifted(optimizer=optimizer)
    analysis = analyze_graph(lifted.graph)
    emb = analysis.variable(program.model.layers[0].embeddings.path)
    assert emb.row_wise and emb.ps_blocker == ""
    kernel = analysis.variable(program.model.layers[2].kernel.path)
    assert kernel.ps_blocker == "" and not kernel.row_wise
    plan = make_plan(analysis, TOPOLOGY, options=PlanOptions(run_option="hybrid"))
    assert plan.variable(emb.name).method == "ps"
    assert "unsummed" in plan.variable(emb.name).reason
    queues = {f"autopar/acc/{emb.name}/part_0/rows_from_{c}" for c in range(2)}
    for worker, pushed in ((0, 0), (1, None), (2, 1)):
        graph_def = rewrite_for_worker(lifted.graph, analysis, plan, worker).meta_graph.graph_def
        with tf.Graph().as_default():
            # (Adagrad's cond, its update on the server, has an unused output
            # whose Identity a worker not running it made a NoOp too)
            tf1.import_graph_def(graph_def, name="")
        nodes = graph_def.node
        by_name = {n.name: n for n in nodes}
        shared = {n.name: n.attr["shared_name"].s.decode() for n in nodes
                  if n.op == "FIFOQueueV2" and "rows_from" in n.attr["shared_name"].s.decode()}
        assert set(shared.values()) == queues
        enqueues = [shared[by_name[n.input[0]].name] for n in by_name.values()
                    if n.op == "QueueEnqueueV2" and n.input[0] in shared]
        assert enqueues == ([] if pushed is None else [f"autopar/acc/{emb.name}/part_0/rows_from_{pushed}"])
        dequeues = sorted(shared[n.input[0]] for n in nodes
                          if n.op == "QueueDequeueV2" and n.input[0] in shared)
        assert dequeues == (sorted(queues) if worker == 0 else [])
        assert not [n for n in nodes if n.op == "SparseConditionalAccumulator"
                    and emb.name in n.attr["shared_name"].s.decode()]


def test_unsummed_rows_bytes_are_an_estimate():
    """A row-wise table's push carries every row a worker looked up,
    repeats included: with the batch's size unknown, its bytes are an
    estimate at a=1, not a bound (before: called an upper bound, as a push
    of one row per distinct id is); an SGD table's stay a bound."""
    for optimizer, bound in (("adagrad", False), ("sgd_plain", True)):
        program, lifted = _lifted(optimizer=optimizer)
        analysis = analyze_graph(lifted.graph)
        emb = analysis.variable(program.model.layers[0].embeddings.path)
        assert emb.alpha is None and emb.row_wise is not bound
        report = build_report(analysis, make_plan(analysis, TOPOLOGY,
                                                  options=PlanOptions(run_option="hybrid")))
        row = next(v for v in report.variables if v.name == emb.name)
        assert (row.method, row.bytes_bound) == ("ps", bound)
        assert any(note.startswith(emb.name) and "not a bound" in note
                   for note in report.notes) is not bound


def test_server_ops_read_constants_of_their_own_server():
    """Keras's Adagrad's sparse division is a cond taking the table's shape,
    a constant of the worker's backward pass; split in two partitions, each
    copy on its server. Read across, a constant is a message per step, and
    the cond's pass-through of it to an unused output left a transfer
    pending past the barrier (a peer's cleanup then aborted the chief's
    step, one run in three): each server has its own copy."""
    program, lifted = _lifted(optimizer="adagrad", dtype="float32")
    analysis = analyze_graph(lifted.graph)
    emb = program.model.layers[0].embeddings.path
    plan = make_plan(analysis, TOPOLOGY, options=PlanOptions(run_option="hybrid",
                                                              partitions={emb: 2}))
    graph_def = rewrite_for_worker(lifted.graph, analysis, plan, 0).meta_graph.graph_def
    nodes = {n.name: n for n in graph_def.node}
    conds = [n for n in graph_def.node if n.op == "StatelessIf" and n.device.startswith("/job:ps")]
    assert len(conds) == 2
    for node in graph_def.node:
        if not node.device.startswith("/job:ps"):
            continue
        for inp in node.input:
            source = nodes[inp.lstrip("^").split(":")[0]]
            if not inp.startswith("^") and source.op == "Const":
                assert source.device == node.device, (node.name, inp)


def test_momentum_sgd_embedding_goes_to_the_servers_whole():
    """Keras 3's SGD with momentum reads the momentum before it writes it and
    makes the sparse gradient dense to the variable's shape, outside the ops
    that write them: the update cannot run per row partition, so a request
    for partitions keeps the embedding whole (the LM's tf.compat.v1 Adam,
    whose update takes the variables' handles, splits)."""
    program, lifted = _lifted(optimizer="sgd", dtype="float32")
    analysis = analyze_graph(lifted.graph)
    emb = analysis.variable(program.model.layers[0].embeddings.path)
    assert emb.ps_blocker == "" and len(emb.slots) == 1
    plan = make_plan(analysis, TOPOLOGY, options=PlanOptions(run_option="hybrid"))
    assert plan.variable(emb.name).method == "ps"
    assert "outside the ops that write it" in emb.partition_blocker
    split = make_plan(analysis, TOPOLOGY, options=PlanOptions(
        run_option="hybrid", partitions={emb.name: 2}))
    assert len(split.variable(emb.name).partitions) == 1
    assert "kept whole, not split into partitions: its update" in split.variable(emb.name).reason
    lm = analyze_graph(models.build("lm_adam_clip").graph).variable("embedding")
    assert lm.partition_blocker == ""


def test_a_split_keras_embedding_reads_only_its_rows():
    """Keras 3's Embedding gathers rows of the variable's value (GatherV2 of
    a ReadVariableOp), not ResourceGather: split into partitions, the gather
    reads its rows on their servers, and the read, which the traced step's
    ops also wait for, reads no partition whole."""
    program, lifted = _lifted(optimizer="sgd_plain", dtype="float32")
    analysis = analyze_graph(lifted.graph)
    emb = program.model.layers[0].embeddings.path
    plan = make_plan(analysis, TOPOLOGY, options=PlanOptions(run_option="hybrid",
                                                              partitions={emb: 2}))
    assert len(plan.variable(emb).partitions) == 2
    wg = rewrite_for_worker(lifted.graph, analysis, plan, 1)
    nodes = {n.name: n for n in wg.meta_graph.graph_def.node}
    parts = {n for n in nodes if nodes[n].op == "VarHandleOp"
             and nodes[n].attr["shared_name"].s.decode().startswith(emb + "/part_")}
    seen, stack = set(), [CALL_OP] + [b for _, b in wg.step_barriers + wg.step_targets]
    while stack:
        name = stack.pop()
        if name in nodes and name not in seen:
            seen.add(name)
            stack.extend(i.lstrip("^").split(":")[0] for i in nodes[name].input)
    on_parts = {nodes[n].op for n in seen if nodes[n].input
                and nodes[n].input[0].split(":")[0] in parts}
    assert "ResourceGather" in on_parts and "ReadVariableOp" not in on_parts, on_parts


def test_amsgrad_velocity_read_through_v_hat_is_a_slot():
    """AMSGrad updates the weight from v_hat = max(v_hat, v), never from v:
    v is still the variable's own state, fed by its gradient (it was taken
    for state shared by all, kept on the workers and updated there from each
    worker's own rows while the embedding's update ran on a server)."""
    program, lifted = _lifted(optimizer="amsgrad_wd")
    analysis = analyze_graph(lifted.graph)
    for layer, attr in ((0, "embeddings"), (2, "kernel")):
        info = analysis.variable(getattr(program.model.layers[layer], attr).path)
        assert sorted(s.split("_")[-1] for s in info.slots) == ["hat", "momentum", "velocity"]
    assert not [s.name for s in analysis.state if "velocity" in s.name]
    # v's rows are squared before duplicates add (a server would take them
    # unsummed), and weight decay's write keeps the table off the servers
    emb = analysis.variable(program.model.layers[0].embeddings.path)
    assert emb.row_wise
    assert "writes it outside its update" in emb.ps_blocker


def test_a_weight_decayed_besides_its_update_stays_off_the_servers():
    """Keras's weight decay writes each weight (w -= w * wd * lr) outside
    the update its gradient feeds: every worker runs that write, so a
    server's one copy would decay once per worker a step."""
    program, lifted = _lifted(optimizer="sgd_wd", dtype="float32")
    analysis = analyze_graph(lifted.graph)
    for layer, attr in ((0, "embeddings"), (2, "kernel"), (2, "bias")):
        info = analysis.variable(getattr(program.model.layers[layer], attr).path)
        assert "writes it outside its update" in info.ps_blocker, info.name
    plan = make_plan(analysis, TOPOLOGY, options=PlanOptions(run_option="ps"))
    assert {plan.variable(v.name).method for v in analysis.variables} <= {"allreduce", "allgather"}


def test_lstm_weights_read_in_the_while_loop_stay_replicated():
    program, lifted = _lifted(kind="lstm", optimizer="sgd")
    analysis = analyze_graph(lifted.graph)
    cell = [v for v in analysis.variables if "lstm" in v.name]
    assert cell and all("While" in v.ps_blocker for v in cell)
    plan = make_plan(analysis, TOPOLOGY, options=PlanOptions(run_option="ps"))
    assert {plan.variable(v.name).method for v in cell} == {"allreduce"}


def test_an_lstm_steps_loss_is_found_through_the_loops_gradient():
    """The While's gradient reads zeros_like(output) for each loop output
    the loss does not use, built outside the tape's scope: they carry a
    shape, and the tape's target is still the loss (before: none found, so
    the loss's reduction was unknown)."""
    program, lifted = _lifted(kind="lstm", optimizer="sgd")
    analysis = analyze_graph(lifted.graph)
    assert analysis.loss == program.concrete.graph.outputs[0].name
    assert analysis.loss_reduction == "mean"


def test_a_captured_table_the_step_reads_is_lifted_with_its_contents():
    """A captured static table (a Keras lookup layer's vocabulary) becomes a
    table of the lifted graph filled by the tables' initializer: the lifted
    step reads the same values as the function (before: refused)."""
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant([1, 2], tf.int64),
                                            tf.constant([0.5, 2.0])), 0.0)
    w = tf.Variable(1.0)

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(table.lookup(ids)) * w
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    cf = step.get_concrete_function(tf.TensorSpec([None], tf.int64))
    lifted = lift(cf)
    with lifted.graph.as_default():
        init = [tf1.global_variables_initializer(), tf1.tables_initializer()]
    session = tf1.Session(graph=lifted.graph)
    session.run(init, lifted.initial_feed())
    ids = np.array([1, 2, 2, 7])
    got = [session.run([cf.graph.outputs[0].name, CALL_OP], {cf.graph.inputs[0].name: ids})[0]
           for _ in range(2)]
    assert got == [step(ids).numpy() for _ in range(2)]   # lookups 0.5, 2, 2 and the default 0


def test_same_shaped_variables_keep_their_own_gradients_through_identity_n():
    """Keras's optimizer passes every gradient through one IdentityN (output
    k is input k). A batch norm's and a layer norm's gamma and beta share a
    shape: each variable's gradient is the IdentityN input at the position
    its update reads, not the first gradient of its shape by name."""
    program, lifted = _lifted("bn_mlp", "adam")   # global_clipnorm: an IdentityN
    graph = lifted.graph
    analysis = analyze_graph(graph)
    norms = [v for v in analysis.variables if v.name.endswith(("gamma", "beta"))]
    assert len(norms) == 4
    assert len({v.grad_tensor for v in norms}) == 4, [(v.name, v.grad_tensor) for v in norms]
    identity_n = [op for op in graph.get_operations() if op.type == "IdentityN"]
    assert len(identity_n) == 1
    for v in norms:
        updates = set(v.update_ops)
        # the outputs of the IdentityN from which v's update is reached
        feeding = [t for t in identity_n[0].outputs if _reaches(t, updates)]
        assert len(feeding) == 1, v.name
        # what enters it there: v's gradient times the global-norm clipping scale
        passed = feeding[0].op.inputs[feeding[0].value_index]
        assert v.grad_tensor in {x.name for x in passed.op.inputs}, (v.name, passed.name)


def _reaches(t, targets: set) -> bool:
    seen, frontier = set(), [t]
    while frontier:
        for c in frontier.pop().consumers():
            if c.name in targets:
                return True
            if c.name not in seen:
                seen.add(c.name)
                frontier.extend(c.outputs)
    return False


def test_a_weight_used_twice_or_regularized_gets_the_tapes_sum():
    """A tape adds up a weight's gradients from each use and its
    regularizer's with an AddN outside its scope, and an embedding's
    IndexedSlices from each lookup by concatenating rows and ids. The
    variable's gradient is that sum (what the optimizer applies), not one
    of its terms (the others would then skip the averaging)."""
    import keras
    program, lifted = _lifted("shared", "sgd")
    graph = lifted.graph
    analysis = analyze_graph(graph)
    shared = next(layer for layer in program.model.layers
                  if isinstance(layer, keras.layers.Dense) and layer.kernel_regularizer)
    kernel = graph.get_tensor_by_name(analysis.variable(shared.kernel.path).grad_tensor)
    # two uses and the L2 penalty
    assert kernel.op.type == "AddN" and len(kernel.op.inputs) == 3, kernel.name
    table = next(layer for layer in program.model.layers
                 if isinstance(layer, keras.layers.Embedding))
    embedding = analysis.variable(table.embeddings.path)
    assert embedding.gradient == "sparse"
    for name in (embedding.grad_values, embedding.grad_indices):
        joined = graph.get_tensor_by_name(name).op
        assert joined.type == "ConcatV2" and len(joined.inputs) == 3, name   # 2 pieces, the axis


def test_a_dense_layer_on_a_sequence_has_its_kernel_gradient_found():
    """Keras's Dense on a [batch, time, features] input multiplies through
    Tensordot, which reshapes by a computed shape: the kernel's gradient
    leaves the tape as (None, units), the kernel's shape only when it runs
    (it was refused: 'no gradient of shape [4, 5] reaching it was found')."""
    model, _optimizer, concrete = keras_step.sequence_step()
    lifted = lift(concrete)
    analysis = analyze_graph(lifted.graph)
    kernel = analysis.variable(model.layers[2].kernel.path)
    grad = lifted.graph.get_tensor_by_name(kernel.grad_tensor)
    assert grad.shape.as_list() == [None, 5] and kernel.gradient == "dense"
    assert kernel.grad_tensor.startswith("gradient_tape/")
    assert analysis.loss_counts == []


def test_a_captured_table_the_step_writes_is_refused_by_name():
    """A table the step only reads is lifted with its contents
    (tests/unit/test_keras_fit_arguments.py, Keras's lookup layers); one it
    writes would be written on each worker's copy: refused."""
    table = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, -1)

    @tf.function
    def step(keys):
        table.insert(keys, tf.ones_like(keys, tf.int64))
        return table.lookup(keys)

    with pytest.raises(UnsupportedGraphError, match="captures the resource .*not a tf.Variable"):
        lift(step.get_concrete_function(tf.TensorSpec([None], tf.string)))


def test_an_iterator_passed_to_the_step_is_refused_by_name():
    """A step that takes its batch from an iterator it is passed
    (`x, y = next(iterator)` inside): a session cannot feed an eager
    iterator (before: a KeyError from deep in Session.run at the first call)."""
    dataset = tf.data.Dataset.from_tensor_slices(tf.ones([8, 2])).batch(4).repeat()
    w = tf.Variable(tf.ones([2, 1]))

    @tf.function
    def step(iterator):
        x = next(iterator)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.matmul(x, w))
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    with pytest.raises(UnsupportedGraphError, match="the traced function takes 'iterator' "
                                                    r"\(resource: an iterator"):
        lift(step.get_concrete_function(iter(dataset)))


def test_a_dropout_after_a_vocabulary_lookups_one_hot_draws_per_example():
    """Keras's IntegerLookup and StringLookup with output_mode="one_hot"
    look their ids up in a table the lift makes anew, and the import gave
    that lookup an output of unknown rank (its shape function reads the
    table's handle data): the one-hot rows after it were taken for no
    example's, and a Dropout after them refused. The lift now keeps the
    shapes tracing inferred, so the mask is drawn per example."""
    import keras
    numbers = keras.layers.IntegerLookup(output_mode="one_hot")
    numbers.adapt(np.array([[1], [3], [5]]))
    words = keras.layers.StringLookup(output_mode="one_hot")
    words.adapt(np.array([["a"], ["b"]]))
    ids = keras.Input((1,), dtype="int64")
    tokens = keras.Input((1,), dtype="string")
    features = keras.layers.concatenate([keras.ops.cast(numbers(ids), "float32"),
                                         keras.ops.cast(words(tokens), "float32")])
    model = keras.Model([ids, tokens], keras.layers.Dense(1)(
        keras.layers.Dropout(0.5)(keras.layers.Dense(4)(features))))
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, s, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model([x, s], training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    lifted = lift(step.get_concrete_function(tf.TensorSpec([None, 1], tf.int64),
                                             tf.TensorSpec([None, 1], tf.string),
                                             tf.TensorSpec([None, 1], tf.float32)))
    finds = [op for op in lifted.graph.get_operations() if op.type == "LookupTableFindV2"]
    assert len(finds) == 2 and all(op.outputs[0].shape.as_list() == [None, 1] for op in finds)
    draws = analyze_graph(lifted.graph).batch_draws
    assert len(draws) == 1 and "dropout" in next(iter(draws))
