"""autopar, joined through TF_CONFIG (autopar's external-launcher path).

The harness starts every process itself inside its host's namespace with
TF_CONFIG describing the cluster; `autopar.get_runner(graph, None, config)`
joins it: workers get a Runner, "ps" tasks serve and never return. The graph
is the plain single-device graph of bench/peers/graph_model.py; the run option
(`allreduce`, `ps`, `hybrid`, `herring`, ...) comes from the job's options and
is passed as `autopar.Config(run_option=...)` when this autopar's Config has
that field. For `herring` the harness starts the summation servers and sets
AUTOPAR_SUMSERVERS (and ps tasks only when the model has sparse variables).

The chief also prints the plan report's prediction of bytes per worker per
step (Parallax Table 3) with its result, for the harness to compare with the
bytes it counted on the wire.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.peers import common  # noqa: E402


def config_kwargs(options: dict) -> dict:
    from autopar.config import Config
    fields = {f.name for f in dataclasses.fields(Config)}
    kwargs = {"log_every_steps": 0}
    run_option = options.get("run_option", "allreduce")
    if "run_option" in fields:
        kwargs["run_option"] = run_option
    elif run_option != "allreduce":
        raise RuntimeError(f"this autopar's Config has no run_option field: cannot run {run_option!r}")
    for key, value in options.get("config", {}).items():
        if key in fields:
            kwargs[key] = value
    return kwargs


def run(job: common.Job) -> None:
    common.quiet_tensorflow()
    import tensorflow as tf
    import autopar
    from bench.peers import graph_model

    tf.compat.v1.disable_eager_execution()
    tf_config = {"cluster": job.cluster, "task": {"type": "ps" if job.role == "ps" else "worker",
                                                  "index": job.index}}
    os.environ["TF_CONFIG"] = json.dumps(tf_config)
    kwargs = config_kwargs(job.options)
    if job.options.get("timeline") or os.environ.get("BENCH_TIMELINE"):
        # Each worker writes its part beside its logs (a TF_CONFIG job has no
        # launcher to merge them). BENCH_TIMELINE: every autopar peer, for
        # the step breakdown (bench/breakdown.py).
        kwargs["timeline"] = str(job.run_dir / "timeline.json")
    config = autopar.Config(**kwargs)
    model = graph_model.build(job.workload)
    report = None
    if job.is_chief:
        # The plan this job really runs: the topology get_runner derives from
        # TF_CONFIG and AUTOPAR_SUMSERVERS (without summation servers hybrid
        # keeps dense gradients on the ring; autopar.analyze of a spec assumes
        # the launcher starts them).
        from autopar.runtime.membership import cluster_topology
        from autopar.transforms.compile import compile_for_config
        report = json.loads(compile_for_config(model.graph, cluster_topology(job.cluster),
                                               config).report().to_json())
        report = {"totals": report.get("totals"), "num_workers": report.get("num_workers"),
                  "num_servers": report.get("num_servers"),
                  "per_server": report.get("per_server") or report.get("servers"),
                  # the planner's aggregation structure (0: the hosts, every server)
                  "aggregation_group": report.get("aggregation_group", 0),
                  "sparse_servers": report.get("sparse_servers", 0),
                  "structure_why": report.get("structure_why", ""),
                  # the dense all-reduce: 2-D summation over groups (0: by hosts or the
                  # flat ring) and why; the buckets using 2-D summation
                  "allreduce_group": report.get("allreduce_group", 0),
                  "hierarchical_why": report.get("hierarchical_why", ""),
                  "two_dimensional_buckets": sum(1 for b in report.get("buckets", [])
                                                 if b.get("host_key")),
                  "variables": [{k: v.get(k) for k in ("name", "kind", "bytes", "method", "alpha",
                                                       "sent_per_worker", "received_per_worker")}
                                for v in report.get("variables", [])]}
    runner = autopar.get_runner(model.graph, None, config)   # a "ps" task serves here forever
    eval_feed = model.eval_feed(job.workload.eval_batch())
    trace_dir = os.environ.get("BENCH_TRACE_DIR")
    trace_k = job.warmup + job.steps - 1   # the last measured step

    def step(k):
        if not trace_dir or k != trace_k:
            return runner.run(model.train_op, feed_dict=model.feed(job.batch(k)))
        return traced_step(runner, model.train_op, model.feed(job.batch(k)), trace_dir, job.index)

    with runner:
        common.run_training(
            job,
            step=step,
            evaluate=lambda: runner.run(model.eval_loss, feed_dict=eval_feed),
            report=report, run_option=job.options.get("run_option", "allreduce"),
            tensorflow=tf.__version__)


def traced_step(runner, train_op, feed, trace_dir: str, index: int):
    """BENCH_TRACE_DIR set: the last measured step runs under a full trace;
    its step stats (every device of the step, servers included) and wall time
    go to the directory, named as bench/ps_profile.py reads them."""
    import time
    import tensorflow as tf
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    metadata = tf.compat.v1.RunMetadata()
    start = time.perf_counter()
    out = runner.run(train_op, feed_dict=feed, options=options, run_metadata=metadata)
    wall_us = int((time.perf_counter() - start) * 1e6)
    path = Path(trace_dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"worker{index}.step_stats.pb").write_bytes(metadata.step_stats.SerializeToString())
    (path / f"worker{index}.wall_us").write_text(str(wall_us))
    return out


if __name__ == "__main__":
    common.main_wrapper(run)
