"""DropCompute (papers/dropcompute.txt §3-4), one module per responsibility:
threshold.py (the arithmetic of a compute threshold: pure numpy/math),
records.py (simulated delay, step records, the per-worker CSV, warm-up
records as exchanged), agreement.py (how workers agree on the threshold),
worker_state.py (one worker's state across steps, used by runtime/step/)."""
