"""TensorBoard event files from the chief (Config.tensorboard_dir).

The chief writes, at every logged step (Config.log_every_steps): the loss it
fetched, examples/s, seconds per step, the bytes the plan predicts each
worker sends and receives per step for each synchronisation method, the
stall warnings the launcher has issued so far (with a launcher), and
with micro-batches DropCompute's threshold τ and the share of micro-batches
dropped; once, at the first step, the plan report as text; once, after
the first Config.measure_steps steps, what they measured (runtime/measured.py:
bytes per method, the rows each sparse gradient carried, the job's network).

Records are written as TensorBoard reads them (TFRecord files of
``tf.compat.v1.Event`` protos, ``events.out.tfevents.<time>.<host>``) with
``tf.io.TFRecordWriter``: no summary ops in any graph and no eager
execution needed, so it works whatever mode the user's script runs in.
"""
from __future__ import annotations

import logging
import os
import socket
import time

import tensorflow as tf

from autopar.runtime.outputs import writable_directory

log = logging.getLogger("autopar.tensorboard")
tf1 = tf.compat.v1


class EventWriter:
    """One event file in ``directory``; each ``scalars`` call is one step."""

    def __init__(self, directory: str) -> None:
        writable_directory(directory, "tensorboard_dir")
        self.path = os.path.join(
            directory, f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}."
                       f"{os.getpid()}.autopar")
        self._writer = tf.io.TFRecordWriter(self.path)
        self._write(tf1.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _write(self, event) -> None:
        self._writer.write(event.SerializeToString())

    def scalars(self, step: int, values: dict[str, float]) -> None:
        summary = tf1.Summary(value=[tf1.Summary.Value(tag=tag, simple_value=float(value))
                                     for tag, value in values.items()])
        self._write(tf1.Event(wall_time=time.time(), step=int(step), summary=summary))
        self._writer.flush()

    def text(self, step: int, tag: str, text: str) -> None:
        """A text summary, as the text plugin reads it (a string tensor)."""
        metadata = tf1.SummaryMetadata(
            plugin_data=tf1.SummaryMetadata.PluginData(plugin_name="text"))
        tensor = tf.make_tensor_proto(text.encode("utf-8"), dtype=tf.string)
        summary = tf1.Summary(value=[tf1.Summary.Value(tag=tag, metadata=metadata,
                                                       tensor=tensor)])
        self._write(tf1.Event(wall_time=time.time(), step=int(step), summary=summary))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class ChiefBoard:
    """What the chief writes (module docstring). ``bytes_per_method``:
    {method: (sent, received)} bytes per worker per step, from the plan."""

    def __init__(self, directory: str, report_text: str,
                 bytes_per_method: dict[str, tuple[float, float]]) -> None:
        self._events = EventWriter(directory)
        self._report = report_text
        self._bytes = bytes_per_method
        self._wrote_report = False
        log.info("TensorBoard events in %s", self._events.path)

    def step(self, step: int, loss: float | None, examples_per_s: float | None,
             seconds_per_step: float, dropcompute: tuple[float | None, float] | None,
             stall_warnings: int | None = None) -> None:
        """``dropcompute``: (τ or None before it is set, share of micro-batches
        dropped over the logged steps) when micro-batching; ``stall_warnings``:
        the launcher's so far (None: a job without a launcher's coordinator)."""
        if not self._wrote_report:
            self._events.text(step, "autopar/plan", self._report)
            self._wrote_report = True
        values = {"autopar/seconds_per_step": seconds_per_step}
        if loss is not None:
            values["autopar/loss"] = loss
        if examples_per_s is not None:
            values["autopar/examples_per_second"] = examples_per_s
        for method, (sent, received) in sorted(self._bytes.items()):
            values[f"autopar/bytes_sent_per_step/{method}"] = sent
            values[f"autopar/bytes_received_per_step/{method}"] = received
        if stall_warnings is not None:
            values["autopar/stall_warnings"] = stall_warnings
        if dropcompute is not None:
            tau, dropped = dropcompute
            values["autopar/dropcompute/drop_rate"] = dropped
            if tau is not None:
                values["autopar/dropcompute/tau_seconds"] = tau
        self._events.scalars(step, values)

    def measured(self, step: int, values: dict[str, float]) -> None:
        """What the chief measured over its first steps (runtime/measured.py)."""
        self._events.scalars(step, values)

    def close(self) -> None:
        self._events.close()
