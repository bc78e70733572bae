"""Spec fields that reach ssh's command line cannot smuggle in ssh options or
shell commands: `autopar launch` rejects them before any process starts."""
import json
import sys

import pytest

from autopar import cli


def _cases(marker_proxy):
    # The ProxyCommand would create `marker_proxy` if ssh ever read it as an option.
    proxy = f"-oProxyCommand=touch {marker_proxy}"
    values = ["-V", "-oProxyCommand=x", proxy, "a;b", "$(x)", f"$(touch {marker_proxy})"]
    return [("address", v) for v in values] + [("user", v) for v in values]


@pytest.mark.parametrize("index", range(12))
def test_injection_rejected_before_anything_starts(index, tmp_path, capsys):
    proxy_marker = tmp_path / "proxy_ran"
    field, value = _cases(proxy_marker)[index]
    host = {"address": "192.0.2.7", "workers": 1}  # TEST-NET-1: would go through ssh
    if field == "address":
        host["address"] = value
    else:
        host["ssh"] = {"user": value}
    spec = tmp_path / "spec.yaml"
    spec.write_text("hosts:\n  - " + json.dumps(host) + "\n")
    marker = tmp_path / "started"
    status = cli.main(["launch", "--spec", str(spec), "--", sys.executable, "-c",
                       f"open({str(marker)!r}, 'w').close()"])
    err = capsys.readouterr().err
    assert status == 2, err
    where = "hosts[0].address" if field == "address" else "hosts[0].ssh.user"
    assert f"{spec}: {where}: " in err and repr(value) in err, err
    assert not marker.exists() and not proxy_marker.exists()
