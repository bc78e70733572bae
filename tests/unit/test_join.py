"""runtime/join.py: an MPI rank's place in the spec's cluster, and what is
refused before anything starts."""
import pytest

from autopar.common.errors import SpecError
from autopar.runtime import join
from autopar.runtime.spec import load_spec


def _spec(*hosts):
    return load_spec({"hosts": list(hosts)})


def test_ranks_are_workers_in_spec_order_with_explicit_or_range_ports():
    spec = _spec({"address": "127.0.0.1", "workers": 2, "worker_ports": [5001, 5003]},
                 {"address": "localhost", "workers": 1, "ports": [6000, 6010]})
    cluster = join.mpi_cluster(spec, 2, 3)
    assert cluster == {"worker": ["127.0.0.1:5001", "127.0.0.1:5003", "localhost:6000"]}


@pytest.mark.parametrize("hosts, rank, size, message", [
    ([{"address": "127.0.0.1", "workers": 2, "servers": 1, "ports": [5000, 5010]}], 0, 2,
     "runs only workers"),
    ([{"address": "127.0.0.1", "workers": 2, "ports": [5000, 5010]}], 0, 3,
     "started 3 process(es), but the spec lists 2 worker(s)"),
    ([{"address": "127.0.0.1", "workers": 2}], 0, 2, "gives no ports"),
    ([{"address": "127.0.0.1", "workers": 1, "ports": [5000, 5010]},
      {"address": "10.255.255.1", "workers": 1, "ports": [5000, 5010]}], 1, 2,
     "runs on another machine"),
])
def test_mismatches_are_refused_naming_what_to_change(hosts, rank, size, message):
    with pytest.raises(SpecError) as caught:
        join.mpi_cluster(_spec(*hosts), rank, size)
    assert message in str(caught.value)


def test_mpi_variables_are_read_and_checked():
    assert join.mpi_rank({}) is None
    assert join.mpi_rank({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}) == (1, 4)
    assert join.mpi_rank({"PMI_RANK": "0", "PMI_SIZE": "1"}) == (0, 1)
    with pytest.raises(SpecError, match="OMPI_COMM_WORLD_RANK='4'"):
        join.mpi_rank({"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "4"})
