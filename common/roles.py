"""The names of jobs and roles, which every layer and the benchmarks share.

Two vocabularies, kept apart on purpose:

- *jobs* are TensorFlow's: the keys of a ClusterSpec / TF_CONFIG cluster and
  the ``/job:NAME`` part of device strings;
- *roles* are what the launcher calls a process (``AUTOPAR_ROLE``, the
  coordinator's process ids, log labels).

A worker is job "worker" and role "worker"; a parameter server is job "ps"
(TensorFlow's convention) but role "server".
"""

WORKER_JOB = "worker"
SERVER_JOB = "ps"
# TF_CONFIG may name worker 0 separately as the single "chief" task; autopar
# folds it into the workers (runtime/spec.py).
CHIEF_JOB = "chief"

WORKER_ROLE = "worker"
SERVER_ROLE = "server"
# A summation server of the Herring transport (cpp_ops/sum_server.cc): not a
# TensorFlow task, so it has no job; one per server of the spec.
SUMSERVER_ROLE = "sumserver"
# `autopar report` runs the user's script in this role: it prints the report
# and exits instead of training. `autopar launch` runs it so too, once, with
# AUTOPAR_PLAN_OUT set: the script then writes its compiled plan there for
# the launcher (runtime/script_plan.py).
REPORT_ROLE = "report"


def process_name(role: str, index: int) -> str:
    """A process of a job by its role: "worker 1", "server 0", "sumserver 0"
    (the launcher's child names, the coordinator's process ids, the
    timeline's lanes)."""
    return f"{role} {index}"
