"""One run of the Runner's session: a plain run, or a training step, as one
run (`PlainStep`) or as micro-batches accumulated, then the update
(`AccumulatedStep`).

With Config(micro_batches=M) (transforms.accumulate, runtime.dropcompute) a
training-step run is M accumulate runs, one per micro-batch, then one run of
the step's fetches (the update). Micro-batches come from the input as the
script wrote it: a graph reading a tf.data iterator pulls one element per
micro-batch; a feed_dict is split along axis 0 into `micro_batches` equal
parts (scalar feeds go to every run unchanged). Other fetches of that run
(the loss, metrics) are evaluated on every computed micro-batch and returned
as their mean when they are floating-point arrays of one shape, else the
last micro-batch's value. Under a compute threshold a worker stops taking
micro-batches once its compute time in the step reaches tau."""
from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

from autopar.common.errors import AutoparError
from autopar.runtime.step.fetch_map import FetchMapper, flatten_feed
from autopar.runtime.step.graph_queries import iterator_read_by
from autopar.runtime.step.hook import MicroBatchTimes, StepRun
from autopar.runtime.step.training_step import StepFetches

tf1 = tf.compat.v1


def run_plain(session, mapped, feeds, options=None, run_metadata=None, barriers=()):
    """`mapped` (any nesting; None leaves are skipped fetches: initialisers
    autopar already ran) run in one session.run with `barriers`."""
    flat = tf.nest.flatten(mapped)
    real = [x for x in flat if x is not None]
    values = iter(session.run([real, list(barriers)], feed_dict=feeds or None, options=options,
                              run_metadata=run_metadata)[0]) if real else iter(())
    return tf.nest.pack_sequence_as(mapped, [None if x is None else next(values) for x in flat])


# The collective graph key every training step's run declares (any
# nonzero value: one for all steps).
STEP_COLLECTIVE_KEY = 0x61707374


def step_run_options(options=None) -> tf1.RunOptions:
    """`options` (a trace's, a program's, or none) for a training step's
    session.run, declaring the steps' collective graph key. TensorFlow gives
    a run step ids from a sequence the workers share when it finds
    collectives in the run's graph; it does not look inside function calls,
    where the collectives of the ops that run in training steps alone are
    (transforms.features.base.in_step_cond), so that a run on one worker
    alone (the chief's evaluation) does not advance its sequence. Every
    worker runs every step, so declaring the key keeps their step ids
    equal whatever the step's graph holds."""
    out = tf1.RunOptions()
    if options is not None:
        out.CopyFrom(options)
    if not out.experimental.collective_graph_key:
        out.experimental.collective_graph_key = STEP_COLLECTIVE_KEY
    return out


def trace_options():
    """(RunOptions, RunMetadata) of a step traced for the timeline."""
    return tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), tf1.RunMetadata()


class PlainStep:
    """A training step as one run of the user's fetches and the step's own."""

    def __init__(self, session, mapper: FetchMapper, training: StepFetches):
        self.session = session
        self.mapper = mapper
        self.training = training

    @property
    def micro_batches(self) -> int:
        return 1

    def step(self, run: StepRun, mapped, feed_dict):
        feeds, batch = self.mapper.feeds(feed_dict)
        extra = self.training.extras(run.groups, fed=bool(feeds))
        if self.training.feeds:
            feeds = {**(feeds or {}), **self.training.feeds}
        with_step = self.training.with_step(run.groups)
        if with_step:
            extra["with_step"] = with_step
        extra.update(run.fetches)
        options, run_metadata = trace_options() if run.trace else (run.options, run.run_metadata)
        options = step_run_options(options)
        run.started = time.time()
        try:
            result, got = run_plain(self.session, (mapped, extra), feeds, options, run_metadata)
        except (tf.errors.AbortedError, tf.errors.CancelledError) as aborted:
            ended = self._ended_iterator(mapped)
            if ended is not None:
                raise ended from aborted
            raise
        run.ended = time.time()
        run.trace_metadata = run_metadata if run.trace else None
        run.got = got
        run.examples = int(got["batch"]) if "batch" in got else batch
        self._after_step()
        return result

    def _after_step(self) -> None:
        if self.training.after_step is not None:   # e.g. averaging batch-local state
            self.session.run(self.training.after_step)

    def _ended_iterator(self, mapped) -> tf.errors.OutOfRangeError | None:
        """After a training step was aborted or cancelled: the OutOfRangeError
        of the tf.data iterator it reads, when that iterator has ended. A
        step whose servers read the batch (the ids of a server variable's
        lookup) is cleaned up on them when the iterator ends, and TensorFlow
        may report their abort ("Cleanup") or the cancelled get-next instead
        of the end of the data, which a program's `except
        tf.errors.OutOfRangeError` would not catch. Running the iterator
        alone tells: an ended one raises at once (a live one gives up a
        batch, but the step failed anyway)."""
        iterator = iterator_read_by([x for x in tf.nest.flatten(mapped) if x is not None])
        if iterator is None:
            return None
        try:
            self.session.run(iterator)
        except tf.errors.OutOfRangeError as ended:
            return ended
        except tf.errors.OpError:
            return None
        return None


class AccumulatedStep(PlainStep):
    """A training step of up to `micro_batches` accumulate runs, then the
    update (module docstring). `accumulate`: (the first micro-batch's op,
    the later micro-batches' op); `dropcompute`: the worker's DropCompute
    state (runtime/dropcompute/worker_state.py), which says how many
    micro-batches a step computes."""

    def __init__(self, session, mapper: FetchMapper, training: StepFetches, accumulate,
                 dropcompute):
        super().__init__(session, mapper, training)
        self._first, self._add = accumulate
        self.dropcompute = dropcompute

    @property
    def micro_batches(self) -> int:
        """Micro-batches a training step computes at most (a fed batch is
        split into this many parts; drop_compensation="batch" raises it once
        the threshold is chosen)."""
        return self.dropcompute.micro_batches

    def step(self, run: StepRun, mapped, feed_dict):
        dc = self.dropcompute
        common, parts = split_feed(feed_dict, dc.micro_batches)
        flat = tf.nest.flatten(mapped)
        step_at = [i for i, x in enumerate(flat) if x is not None and self.training.is_step(x)]
        other_at = [i for i, x in enumerate(flat)
                    if x is not None and not self.training.is_step(x)]
        extra = self.training.extras(run.groups, fed=bool(feed_dict))
        start = time.perf_counter()
        run.started = time.time()
        times = MicroBatchTimes(planned=dc.micro_batches)
        compute, outputs, examples = 0.0, [], 0
        while dc.may_compute(times.computed, compute):
            m = times.computed
            feeds, batch = self.mapper.feeds({**common, **parts[m]} if parts else common)
            t0 = time.perf_counter()
            out = self.session.run((self._first if m == 0 else self._add,
                                    [flat[i] for i in other_at], extra), feed_dict=feeds or None)
            latency = time.perf_counter() - t0 + dc.delay()
            times.starts.append(t0 - start)
            times.latencies.append(latency)
            compute += latency
            outputs.append(out)
            examples += int(out[2]["batch"]) if "batch" in out[2] else (batch or 0)
        # The update reads the accumulators only: no batch feed, no input pulled.
        feeds, _ = self.mapper.feeds(common)
        step_fetches = [flat[i] for i in step_at] + self.training.with_step(run.groups)
        options, run_metadata = trace_options() if run.trace else (run.options, run.run_metadata)
        options = step_run_options(options)
        t0 = time.perf_counter()
        applied = self.session.run(step_fetches, feed_dict=feeds or None, options=options,
                                   run_metadata=run_metadata)
        end = time.perf_counter()
        times.compute_s, times.update_start = compute, t0 - start
        times.step_s, times.apply_s = end - start, end - t0
        times.dropped = dc.micro_batches - times.computed if dc.tau is not None else 0
        run.ended = run.started + end - start
        run.trace_metadata = run_metadata if run.trace else None
        run.micro = times
        values: list = [None] * len(flat)
        for i, v in zip(step_at, applied):
            values[i] = v
        for k, i in enumerate(other_at):
            values[i] = combine([out[1][k] for out in outputs])
        run.got = {"loss": combine([out[2]["loss"] for out in outputs])} if "loss" in extra else {}
        run.examples = examples
        self._after_step()
        return tf.nest.pack_sequence_as(mapped, values)


def split_feed(feed_dict, parts: int) -> tuple[dict, list[dict]]:
    """A step's feed as (what every run gets: scalars, [micro-batch i's
    feed]): every other leaf split along axis 0 into `parts` equal parts."""
    common: dict = {}
    arrays: list[tuple] = []     # (leaf, its value as an array), checked before any split
    for key, value in feed_dict.items():
        for leaf, leaf_value in flatten_feed(key, value):
            if isinstance(leaf, (tf.SparseTensor, tf.IndexedSlices)):
                raise AutoparError(
                    f"with Config(micro_batches={parts}) the step's feed is split into "
                    f"micro-batches along axis 0, which a SparseTensor/IndexedSlices feed "
                    f"({getattr(leaf, 'name', leaf)!r}) cannot be: feed dense arrays or read "
                    "the input from a tf.data iterator (one element per micro-batch)")
            array = np.asarray(leaf_value)
            if array.ndim == 0:
                common[leaf] = leaf_value
                continue
            if array.shape[0] % parts:
                raise AutoparError(
                    f"with Config(micro_batches={parts}) the step's feed is split into {parts} "
                    f"equal micro-batches along axis 0, but the value fed to "
                    f"{getattr(leaf, 'name', leaf)!r} has {array.shape[0]} rows: feed a "
                    f"multiple of {parts} rows (Runner.micro_batches)")
            arrays.append((leaf, array))
    if not arrays:
        return common, []
    split: list[dict] = [{} for _ in range(parts)]
    for leaf, array in arrays:
        for i, piece in enumerate(np.split(array, parts)):
            split[i][leaf] = piece
    return common, split


def combine(values: list):
    """Micro-batches' values of one fetch: the mean of floating-point arrays
    of one shape, else the last value."""
    arrays = [np.asarray(v) if isinstance(v, (np.ndarray, np.generic, float)) else None
              for v in values]
    if (all(a is not None and np.issubdtype(a.dtype, np.floating) for a in arrays)
            and len({a.shape for a in arrays}) == 1):
        mean = np.mean(np.stack(arrays), axis=0)
        return mean.astype(arrays[0].dtype) if mean.shape else arrays[0].dtype.type(mean)
    return values[-1]
