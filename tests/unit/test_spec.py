"""Resource-spec loading and validation: every bad spec fails with a message
naming the file, the field or line, and the problem."""
import json
from pathlib import Path

import pytest

from autopar.common.errors import SpecError
from autopar.runtime.spec import (HostSpec, ResourceSpec, SSHSettings, load_spec, parse_parallax_spec,
                          parse_yaml_spec, spec_from_tf_config)

SPECS = Path(__file__).resolve().parents[2] / "resource_specs"


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def yaml_error(tmp_path: Path, text: str, name: str = "bad.yaml") -> str:
    path = write(tmp_path, name, text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert path in message
    return message


# ----------------------------------------------------------------- shipped files

def test_localhost_2workers_yaml():
    spec = load_spec(SPECS / "localhost_2workers.yaml")
    assert (spec.num_workers, spec.num_servers, spec.num_hosts()) == (2, 0, 1)
    assert [h.address for h in spec.worker_hosts()] == ["127.0.0.1"] * 2
    assert spec.source.endswith("localhost_2workers.yaml")


def test_localhost_4workers_2servers_yaml():
    spec = load_spec(str(SPECS / "localhost_4workers_2servers.yaml"))
    assert (spec.num_workers, spec.num_servers) == (4, 2)
    assert len(spec.server_hosts()) == 2


def test_multihost_example_yaml():
    spec = load_spec(SPECS / "multihost_example.yaml")
    assert (spec.num_workers, spec.num_servers, spec.num_hosts()) == (8, 6, 3)
    assert [h.address for h in spec.worker_hosts()] == ["10.0.0.11"] * 4 + ["10.0.0.12"] * 4
    assert [h.address for h in spec.server_hosts()] == ["10.0.0.11"] * 2 + ["10.0.0.12"] * 2 + ["10.0.0.13"] * 2
    assert spec.bandwidth_gbps == 10.0
    a, _, c = spec.hosts
    assert a.ports == (24000, 24099)
    assert a.ssh == SSHSettings(user="alice", port=22, key_file="~/.ssh/id_ed25519",
                                python="/opt/venvs/autopar/bin/python", workdir="/home/alice/jobs/resnet")
    assert c.ssh.port == 2222 and c.server_ports == (25000, 25001)


def test_parallax_text_file():
    spec = load_spec(SPECS / "localhost_2workers.txt")
    assert (spec.num_workers, spec.num_servers) == (2, 1)


@pytest.mark.parametrize("name", ["localhost_2workers.yaml", "localhost_4workers_2servers.yaml",
                                  "multihost_example.yaml", "localhost_2workers.txt"])
def test_round_trip_through_json(name):
    spec = load_spec(SPECS / name)
    assert ResourceSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


# ----------------------------------------------------------------- good cases

def test_worker_hosts_order_across_hosts():
    spec = parse_yaml_spec("hosts:\n- {address: a, workers: 1}\n- {address: b, workers: 2, servers: 1}\n", "s")
    assert [h.address for h in spec.worker_hosts()] == ["a", "b", "b"]
    assert [h.address for h in spec.server_hosts()] == ["b"]


def test_load_spec_accepts_spec_and_dict():
    spec = load_spec({"hosts": [{"address": "127.0.0.1", "workers": 2}], "network": {"bandwidth_gbps": 25}})
    assert spec.num_workers == 2 and spec.bandwidth_gbps == 25.0
    assert load_spec(spec) is spec


def test_yaml_content_without_yaml_extension(tmp_path):
    spec = load_spec(write(tmp_path, "spec.conf", "hosts:\n  - address: h1\n    workers: 3\n"))
    assert spec.num_workers == 3 and spec.num_servers == 0


def test_parallax_format_variants():
    spec = parse_parallax_spec("# cluster\n\nhost-a: 0,1,2\n[::1]: 0, 1\n", "p.txt")
    assert [(h.address, h.workers, h.servers) for h in spec.hosts] == [
        ("host-a", 3, 1), ("::1", 2, 1)]
    # One worker per listed GPU id (docs/gpus.md); a bare host, one CPU worker.
    assert [h.worker_gpus() for h in spec.hosts] == [[(0,), (1,), (2,)], [(0,), (1,)]]
    spec = parse_parallax_spec("host-b   # one worker\nhost-c\n", "p.txt")
    assert [(h.address, h.workers, h.worker_gpus()) for h in spec.hosts] == [
        ("host-b", 1, [()]), ("host-c", 1, [()])]
    # GPU workers and CPU workers cannot sum gradients together.
    with pytest.raises(SpecError, match=r"hosts\[1\].gpus: is missing while hosts\[0\] gives GPUs"):
        parse_parallax_spec("host-a: 0,1,2\nhost-b   # one worker\n", "p.txt")


def test_tf_config_chief_worker_ps():
    tf_config = {"cluster": {"chief": ["a:1000"], "worker": ["a:1001", "b:1000"], "ps": ["b:2000", "c:2000"]},
                 "task": {"type": "worker", "index": 1}}
    spec, role, index = spec_from_tf_config(json.dumps(tf_config))
    assert (role, index) == ("worker", 2)
    assert spec.source == "TF_CONFIG"
    assert [(h.address, h.worker_ports, h.server_ports) for h in spec.hosts] == [
        ("a", (1000, 1001), None), ("b", (1000,), (2000,)), ("c", None, (2000,))]
    assert [h.address for h in spec.worker_hosts()] == ["a", "a", "b"]
    assert spec_from_tf_config({**tf_config, "task": {"type": "chief", "index": 0}})[1:] == ("worker", 0)
    assert spec_from_tf_config({**tf_config, "task": {"type": "ps", "index": 1}})[1:] == ("server", 1)


def test_tf_config_interleaved_hosts_keep_worker_order():
    tf_config = {"cluster": {"worker": ["a:1", "b:1", "a:2"]}, "task": {"type": "worker", "index": 2}}
    spec, _, _ = spec_from_tf_config(tf_config)
    assert [h.address for h in spec.worker_hosts()] == ["a", "b", "a"]
    assert [h.worker_ports for h in spec.hosts] == [(1,), (1,), (2,)]


# ----------------------------------------------------------------- file-level errors

def test_nonexistent_file():
    with pytest.raises(SpecError, match=r"/no/such/spec\.yaml.*cannot be read.*check the path"):
        load_spec("/no/such/spec.yaml")


def test_unreadable_file_directory(tmp_path):
    with pytest.raises(SpecError, match="cannot be read"):
        load_spec(tmp_path)


def test_yaml_syntax_error(tmp_path):
    message = yaml_error(tmp_path, "hosts:\n  - address: a\n    workers: [1, 2\n")
    assert "YAML syntax error" in message and "line" in message


def test_empty_file(tmp_path):
    assert "is empty" in yaml_error(tmp_path, "# nothing here\n\n")


def test_empty_parallax_file(tmp_path):
    assert "is empty" in yaml_error(tmp_path, "\n   \n", name="hosts.txt")


def test_hosts_not_a_list(tmp_path):
    assert "hosts: must be a list" in yaml_error(tmp_path, "hosts:\n  address: a\n  workers: 1\n")


def test_hosts_missing(tmp_path):
    assert "hosts: is missing" in yaml_error(tmp_path, "network: {bandwidth_gbps: 1}\n")


# ----------------------------------------------------------------- unknown keys

@pytest.mark.parametrize("text, where, key", [
    ("hosts: [{address: a, workers: 1}]\nhost: x\n", "top level", "host"),
    ("hosts: [{address: a, worker: 1}]\n", "hosts[0]", "worker"),
    ("hosts: [{address: a, workers: 1, ssh: {usr: bob}}]\n", "hosts[0].ssh", "usr"),
    ("hosts: [{address: a, workers: 1}]\nnetwork: {bandwidth: 10}\n", "network", "bandwidth"),
])
def test_unknown_keys(tmp_path, text, where, key):
    message = yaml_error(tmp_path, text)
    assert f"{where}: unknown key '{key}'" in message and "allowed keys" in message


def test_unknown_key_suggests_closest(tmp_path):
    assert "did you mean 'workers'" in yaml_error(tmp_path, "hosts: [{address: a, worker: 1}]\n")


# ----------------------------------------------------------- host fields, ports

# (id, spec text, what the message must say)
FIELD_ERRORS = [
    ("missing_address", "hosts: [{workers: 1}]\n", ["hosts[0].address: is missing"]),
    ("empty_address", "hosts: [{address: a, workers: 1}, {address: '', workers: 1}]\n",
     ["hosts[1].address: must be a non-empty host name"]),
    ("address_with_port", "hosts: [{address: 'a:2222', workers: 1}]\n", ["looks like host:port"]),
    ("zero_workers_in_total", "hosts: [{address: a, workers: 0, servers: 1}]\n", ["zero workers in total"]),
    ("negative_count", "hosts: [{address: a, workers: 1}, {address: b, workers: 1, servers: -1}]\n",
     ["hosts[1].servers: must not be negative, got -1"]),
    ("host_without_processes", "hosts: [{address: a, workers: 1}, {address: b, workers: 0}]\n",
     ["hosts[1]: host b runs no process"]),
    ("duplicate_explicit_ports_same_address",
     "hosts:\n  - {address: a, workers: 2, worker_ports: [2000, 2001]}\n"
     "  - {address: a, workers: 1, worker_ports: [2001]}\n",
     ["hosts[1].worker_ports[0]: duplicate address:port a:2001"]),
    ("duplicate_explicit_ports_within_host",
     "hosts: [{address: a, workers: 1, servers: 1, worker_ports: [2000], server_ports: [2000]}]\n",
     ["duplicate address:port a:2000"]),
    ("overlapping_ranges_same_address",
     "hosts:\n  - {address: a, workers: 1, ports: [2000, 2010]}\n"
     "  - {address: a, workers: 1, ports: [2010, 2020]}\n",
     ["hosts[1].ports: duplicate address:port", "overlaps hosts[0].ports"]),
    ("ssh_port_out_of_range", "hosts: [{address: a, workers: 1, ssh: {port: 0}}]\n",
     ["hosts[0].ssh.port: must be a port number 1..65535"]),
    ("range_start_after_end", "hosts: [{address: a, workers: 1, ports: [3000, 2000]}]\n",
     ["hosts[0].ports: range start 3000 is greater than end 2000"]),
    ("range_too_small", "hosts: [{address: a, workers: 2, servers: 2, ports: [2000, 2002]}]\n",
     ["hosts[0].ports: range 2000-2002 has 3 ports but the host needs 4"]),
    ("range_not_a_pair", "hosts: [{address: a, workers: 1, ports: [1, 2, 3]}]\n", ["must be [start, end]"]),
    ("explicit_ports_count_mismatch", "hosts: [{address: a, workers: 2, worker_ports: [2000]}]\n",
     ["hosts[0].worker_ports: has 1 ports for 2 workers"]),
]


@pytest.mark.parametrize("text, fragments", [pytest.param(t, f, id=i) for i, t, f in FIELD_ERRORS])
def test_field_errors(tmp_path, text, fragments):
    message = yaml_error(tmp_path, text)
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("value", ["two", "1.5", "true"])
def test_non_integer_count(tmp_path, value):
    message = yaml_error(tmp_path, f"hosts: [{{address: a, workers: {value}}}]\n")
    assert "hosts[0].workers: must be an integer count" in message


def test_same_ranges_on_different_addresses_are_fine():
    spec = parse_yaml_spec("hosts:\n  - {address: a, workers: 1, ports: [2000, 2010]}\n"
                           "  - {address: b, workers: 1, ports: [2000, 2010]}\n", "s")
    assert spec.num_hosts() == 2


@pytest.mark.parametrize("field, value, where", [
    ("ports", "[0, 10]", "hosts[0].ports[0]"),
    ("ports", "[60000, 70000]", "hosts[0].ports[1]"),
    ("worker_ports", "[65536]", "hosts[0].worker_ports[0]"),
])
def test_port_out_of_range(tmp_path, field, value, where):
    message = yaml_error(tmp_path, f"hosts: [{{address: a, workers: 1, {field}: {value}}}]\n")
    assert f"{where}: port" in message and "out of range 1..65535" in message


# ----------------------------------------------------------------- bandwidth

@pytest.mark.parametrize("value", ["0", "-1", "fast", ".inf", ".nan"])
def test_bad_bandwidth(tmp_path, value):
    message = yaml_error(tmp_path, f"hosts: [{{address: a, workers: 1}}]\nnetwork: {{bandwidth_gbps: {value}}}\n")
    assert "network.bandwidth_gbps: must be a positive finite number" in message


# ----------------------------------------------------------------- limits

@pytest.mark.parametrize("hosts, fragment", [
    ("[{address: a, workers: 100000000}]", "hosts[0]: host a runs 100000000 workers and 0 servers, "
                                            "more than the 1024 processes"),
    ("[{address: a, workers: 1, servers: 1024}]", "more than the 1024 processes one host can have"),
    ("[" + ", ".join(f"{{address: h{i}, workers: 1000}}" for i in range(17)) + "]",
     "hosts: 17000 workers in all, more than the 16384 a job can have"),
    ("[" + ", ".join(f"{{address: h{i}, workers: 1, servers: 1000}}" for i in range(5)) + "]",
     "hosts: 5000 servers in all, more than the 4096"),
])
def test_counts_beyond_the_limits_are_refused(tmp_path, hosts, fragment):
    assert fragment in yaml_error(tmp_path, f"hosts: {hosts}\n")


def test_too_many_hosts_are_refused():
    with pytest.raises(SpecError, match=r"hosts: lists 4097 hosts, more than the 4096"):
        ResourceSpec(hosts=tuple(HostSpec(f"h{i}", 1) for i in range(4097)))


@pytest.mark.parametrize("first, second", [
    ("localhost", "127.0.0.1"), ("127.0.0.1", "localhost"), ("::1", "localhost"),
    ("::1", "0:0::1"), ("NODE1", "node1")])
def test_one_port_under_two_names_of_an_address_is_refused(tmp_path, first, second):
    message = yaml_error(tmp_path, f"hosts:\n  - {{address: '{first}', workers: 1, worker_ports: [24001]}}\n"
                                   f"  - {{address: '{second}', workers: 0, servers: 1, server_ports: [24001]}}\n")
    assert f"hosts[1].server_ports[0]: duplicate address:port {second}:24001 (also " \
           f"hosts[0].worker_ports[0]" in message, message


def test_shared_cores_of_an_emulated_cluster():
    spec = load_spec({"hosts": [{"address": "10.0.0.1", "workers": 1}],
                      "network": {"bandwidth_gbps": 1, "shared_cores": 2}})
    assert spec.shared_cores == 2.0
    assert ResourceSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert load_spec({"hosts": [{"address": "a", "workers": 1}]}).shared_cores is None


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_bad_shared_cores(tmp_path, value):
    message = yaml_error(tmp_path, f"hosts: [{{address: a, workers: 1}}]\nnetwork: {{shared_cores: {value}}}\n")
    assert "network.shared_cores: must be a positive number" in message


# ----------------------------------------------------------------- Parallax errors

@pytest.mark.parametrize("line, problem", [
    ("host-b: 0,x", "device ids must be non-negative integers"),
    ("host-b: -1", "device ids must be non-negative integers"),
    ("host-b: 0,,1", "device ids must be non-negative integers"),
    ("host-b:", "device ids must be non-negative integers"),
    ("host-b: 0,0", "device id listed twice"),
    ("host b: 0", "bad host name"),
    (": 0,1", "bad host name"),
    ("host-a: 2", "host host-a already listed on line 1"),
])
def test_malformed_parallax_lines(tmp_path, line, problem):
    message = yaml_error(tmp_path, f"host-a: 0,1\n# comment\n{line}\n", name="cluster.txt")
    assert "line 3" in message and problem in message


# ----------------------------------------------------------------- TF_CONFIG errors

@pytest.mark.parametrize("tf_config, problem", [
    ("{not json", "not valid JSON"),
    ({"task": {"type": "worker", "index": 0}}, "cluster: is missing"),
    ({"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 0}}, "cluster.worker[0]: expected"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}, "task.index: 3"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 0}}, "unsupported task type"),
    ({"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}, "duplicate address:port a:1"),
])
def test_tf_config_errors(tf_config, problem):
    with pytest.raises(SpecError, match="TF_CONFIG") as info:
        spec_from_tf_config(tf_config)
    assert problem in str(info.value)


# ----------------------------------------------------------------- in-memory specs

def test_in_memory_spec_is_validated():
    with pytest.raises(SpecError, match=r"<memory>: hosts\[0\]\.workers: must not be negative"):
        ResourceSpec(hosts=(HostSpec(address="a", workers=-1),))


def test_in_memory_lists_become_tuples():
    spec = ResourceSpec(hosts=[HostSpec(address="a", workers=1, ports=[2000, 2001])])
    assert spec.hosts[0].ports == (2000, 2001) and isinstance(spec.hosts, tuple)
    hash(spec)


# ----------------------------------------------------------------- fields that reach ssh

INJECTIONS = ["-V", "-oProxyCommand=x", "a;b", "$(x)", "`x`", "a|b", "a&b", "a b", "a>b", "a\nb"]


@pytest.mark.parametrize("address", INJECTIONS + ["-a.example", "a..b", "a-.b", "_a", "a@b", "1.2.3.999",
                                                  "x" * 64 + ".com", "[::1]", "fe80::1%eth 0"])
def test_bad_address_rejected(tmp_path, address):
    message = yaml_error(tmp_path, f"hosts: [{{address: {json.dumps(address)}, workers: 1}}]\n")
    assert "hosts[0].address: " in message and repr(address) in message
    assert any(why in message for why in ("not a valid host name", "starts with '-'", "whitespace",
                                          "IPv4 address nor a host name", "without the brackets",
                                          "looks like host:port"))


@pytest.mark.parametrize("user", INJECTIONS + ["a@b", "a:b", "x" * 33, "a/b"])
def test_bad_ssh_user_rejected(tmp_path, user):
    message = yaml_error(tmp_path, f"hosts: [{{address: node1, workers: 1, ssh: {{user: {json.dumps(user)}}}}}]\n")
    assert f"hosts[0].ssh.user: {user!r} is not a valid user name" in message
    assert "portable user name" in message


@pytest.mark.parametrize("field", ["key_file", "python", "workdir"])
@pytest.mark.parametrize("value", ["-oProxyCommand=x", "-V", "/a\nb"])
def test_bad_ssh_paths_rejected(tmp_path, field, value):
    message = yaml_error(tmp_path, f"hosts: [{{address: node1, workers: 1, ssh: {{{field}: {json.dumps(value)}}}}}]\n")
    assert f"hosts[0].ssh.{field}: " in message and ("starts with '-'" in message or "control character" in message)


@pytest.mark.parametrize("address", ["node-1", "Node1.example.com", "example.com.", "10.0.0.1", "::1",
                                     "2001:db8::5", "fe80::1%eth0", "1a", "x" * 63])
def test_good_addresses_accepted(address):
    spec = load_spec({"hosts": [{"address": address, "workers": 1,
                                 "ssh": {"user": "alice.b_c-1", "workdir": "/srv/my job", "python": "python3"}}]})
    assert spec.hosts[0].address == address and spec.hosts[0].ssh.user == "alice.b_c-1"


def test_in_memory_spec_address_validated():
    with pytest.raises(SpecError, match=r"<memory>: hosts\[0\]\.address: '-V' starts with '-'"):
        ResourceSpec(hosts=(HostSpec(address="-V", workers=1),))
    with pytest.raises(SpecError, match=r"hosts\[0\]\.ssh\.user: '-oX=y' is not a valid user name"):
        ResourceSpec(hosts=(HostSpec(address="node1", workers=1, ssh=SSHSettings(user="-oX=y")),))


@pytest.mark.parametrize("address", ["-V", "-oProxyCommand=x", "a;b", "$(x)"])
def test_bad_address_in_parallax_file(tmp_path, address):
    message = yaml_error(tmp_path, f"host-a: 0\n{address}: 0,1\n", name="cluster.txt")
    assert "line 2: bad host name" in message and repr(address) in message


@pytest.mark.parametrize("address", ["-V", "-oProxyCommand=x", "a;b", "$(x)"])
def test_bad_address_in_tf_config(address):
    tf_config = {"cluster": {"worker": ["a:1", f"{address}:2"]}, "task": {"type": "worker", "index": 0}}
    with pytest.raises(SpecError, match=r"TF_CONFIG: cluster\.worker\[1\]: bad host") as info:
        spec_from_tf_config(tf_config)
    assert repr(address) in str(info.value)


# ----------------------------------------------------------------- hostile input

# Nine anchors, each a list of nine aliases of the previous one: fewer than 512
# bytes standing for 9**9 values ("billion laughs").
_NAMES = "abcdefghi"
_BOMB = "[" + ", ".join(f"&{k} [{', '.join([f'*{p}' if p else '0'] * 9)}]"
                        for k, p in zip(_NAMES, ["", *_NAMES[:-1]])) + "]"


@pytest.mark.parametrize("host", ["- address: 127.0.0.1\n    workers: {bomb}\n",
                                  "- address: {bomb}\n    workers: 1\n",
                                  "- {bomb}\n"], ids=["workers", "address", "host"])
def test_an_alias_bomb_is_refused_without_expanding_it(tmp_path, host):
    """Refused before any of its values is walked or formatted into a message
    (which used to end in a MemoryError)."""
    assert len(_BOMB) < 512
    message = yaml_error(tmp_path, "hosts:\n  " + host.format(bomb=_BOMB))
    assert "aliases (*name) expand to more than 10000 values" in message
    assert len(message) < 1000


@pytest.mark.parametrize("value", ["x" * 100_000, list(range(100_000)), {"a": ["b"] * 100_000},
                                   -10 ** 5000], ids=["str", "list", "dict", "int"])
def test_huge_values_are_shown_briefly(value):
    """A message shows at most a few hundred characters of a bad value, whatever its size."""
    with pytest.raises(SpecError) as info:
        ResourceSpec(hosts=(HostSpec("127.0.0.1", workers=value),), source="s.yaml")
    assert "hosts[0].workers: must" in str(info.value)
    assert len(str(info.value)) < 600


def test_a_huge_or_endless_file_is_refused(tmp_path):
    assert "is larger than" in yaml_error(tmp_path, "hosts:\n" + "#" * (2 << 20) + "\n")
    with pytest.raises(SpecError, match="is larger than"):
        load_spec("/dev/zero")


# ----------------------------------------------------------------- isolation

def test_isolation_defaults_to_auto_and_round_trips():
    spec = load_spec({"hosts": [{"address": "127.0.0.1", "workers": 2}]})
    assert spec.isolation == "auto"
    spec = load_spec({"hosts": [{"address": "10.0.0.1", "workers": 2}],
                      "network": {"isolation": "firewall"}})
    assert ResourceSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("text, expected", [
    ("network: {isolation: private}\n", "network.isolation: must be one of auto, namespace, "
                                         "firewall, none, got 'private'"),
    ("network: {isolation: namespace}\n", "network.isolation: 'namespace' needs every host on "
                                          "a loopback address"),
])
def test_bad_isolation(tmp_path, text, expected):
    message = yaml_error(tmp_path, "hosts: [{address: 127.0.0.1, workers: 1}, "
                                   "{address: 10.0.0.2, workers: 1}]\n" + text)
    assert expected in message, message
