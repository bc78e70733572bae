"""What every layer shares (installed as ``autopar.common``): the errors a user
can cause (errors.py), job and role names (roles.py), the launcher's
environment contract (env.py) and process-group teardown (procs.py), which
the benchmark harness reuses. A leaf: it imports nothing from autopar's
other layers, nor TensorFlow. transforms/ takes only errors and roles from
here (it reads no environment and starts no process)."""
