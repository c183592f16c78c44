"""`kunlun-fleet host add|remove` (kunlun_fleet/cli.py) and playbooks/remove_host.yml: what
is refused before anything changes - a name that is no serving host, a host the fleet
depends on, the last serving host - by the command (exit 3) and by the playbook itself (for
ansible-playbook users: its first play fails every host, so nothing after it runs). The
removal and the addition under load: tests/gateway/test_membership_sim.py."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kunlun_fleet import cli, runner

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def inventory(tmp_path):
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {
        "all": {
            "children": {
                "xpu_servers": {"hosts": {h: local for h in ("p800-a01", "p800-a02", "p800-a03")}},
                "image_builders": {"hosts": {"p800-a01": {}}},
                "gateways": {"hosts": {"gw-01": local}},
                "monitoring": {"hosts": {"gw-01": {}}},
            }
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return str(tmp_path)


@pytest.mark.parametrize(
    "action, hosts, said",
    [
        ("remove", "p800-a09", "not serving hosts of %s (xpu_servers): p800-a09; its serving hosts: p800-a01"),
        ("add", "p800-a09", "not serving hosts of %s (xpu_servers): p800-a09; add them to its hosts.yml first"),
        ("remove", "p800-a01", "the fleet depends on p800-a01 (a gateway, the image builder or a monitoring host)"),
        ("remove", "gw-01", "not serving hosts"),
        ("remove", ",", "give the hosts"),
    ],
)
def test_refused_before_anything_runs(inventory, capsys, action, hosts, said):
    assert cli.main(["host", action, "-i", inventory, hosts]) == runner.REFUSED
    err = capsys.readouterr().err
    assert said.replace("%s", inventory) in err, err


def test_the_last_serving_hosts_are_not_removed(inventory, capsys):
    assert cli.main(["host", "remove", "-i", inventory, "p800-a01,p800-a02,p800-a03"]) == runner.REFUSED
    assert "the fleet depends on p800-a01" in capsys.readouterr().err
    groups = {"xpu_servers": ["a", "b"], "gateways": ["gw"]}
    assert cli._membership_refusal("remove", ["a", "b"], groups, "inv") == "no serving host would be left"
    assert cli._membership_refusal("remove", ["a"], groups, "inv") is None
    assert cli._membership_refusal("add", ["a", "b"], groups, "inv") is None


@pytest.mark.parametrize(
    "removed, said",
    [
        ('["p800-a01"]', "the fleet depends on p800-a01"),
        ('["p800-a09"]', "not serving hosts (xpu_servers): p800-a09"),
        ('"p800-a02"', "give the hosts as a list"),
        ('["p800-a01", "p800-a02", "p800-a03"]', "the fleet depends on p800-a01"),
    ],
)
def test_the_playbook_refuses_and_nothing_after_runs(inventory, removed, said):
    proc = subprocess.run(
        [
            str(ROOT / ".venv/bin/ansible-playbook"),
            "-i",
            inventory,
            str(ROOT / "playbooks/remove_host.yml"),
            "-e",
            '{"kunlun_stack_removed_hosts": %s}' % removed,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and said in out and "Nothing was changed" in out, out[-3000:]
    assert "PLAY [Remove hosts | Drained" not in out and "PLAY [Remove hosts | The gateways" not in out, out[-3000:]
