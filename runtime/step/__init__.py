"""The Runner's step loop (runtime/runner.py), in parts of one job each:

- `fetch_map.py`      the user's fetches and feeds → this worker's graph
- `training_step.py`  which runs are training steps, the train groups they
                      update, and what a step fetches and feeds besides the
                      user's (losses, loss counts, batch size, barriers)
- `executor.py`       one run: plain, or a training step as one run or as
                      micro-batches accumulated, then the update
- `hook.py`           the interface every hook implements (begin,
                      before_run, after_run, end, as tf.train.SessionRunHook)
                      and what one run tells them (`StepRun`)
- hooks: `stop.py` (stop requests by SIGINT/SIGTERM), `checkpoint_hook.py`,
  `progress_hooks.py` (the progress log, the coordinator's reports, the
  unequal-batch warning), `trace_hooks.py` (timeline, measured bytes),
  `dropcompute_hook.py`, `python_bridge.py` (a lifted TF2 step's Python
  variables); `hooks.py` puts them in their order
- `evaluate.py`       distributed evaluation and the sum over workers
- `graph_queries.py`  what the loop asks of a graph (initialisers, the
                      iterator a fetch reads, writes of trainable variables)
"""
