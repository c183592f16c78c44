"""`kunlun-fleet status` on the served 3-host sim fleet, as an operator runs it every
morning (suite "bench-sim", lane "fleet", after the e2e, which leaves the fleet served):
every host healthy and exit 0, and the run changed nothing (no task changed, the serving
files and the running service untouched). A stopped service named in its row is tested
once, in tests/monitoring/test_monitoring_sim.py (its alert and its row in one stop)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from kunlun_fleet.sim.testing import host_curl, ssh
from kunlun_fleet.bundle import load_pins as stack_pins

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.sim, pytest.mark.slow]
HOSTS = ("kf-node-1", "kf-node-2", "kf-node-3")
PINS = stack_pins()
PORT = PINS["kunlun_stack_serving"]["port"]
# What a host's serving state is made of on disk, and the running service's identity: the
# same before and after a status run.
UNTOUCHED = (
    "stat -c '%n %Y %s' /etc/systemd/system/kunlun-serve.service /etc/kunlun-serve/serve.env "
    "/etc/kunlun-serve/image /etc/ansible/facts.d/xpu.fact; "
    "systemctl show --property InvocationID --value kunlun-serve.service"
)


def status(*args, timeout=600):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    cmd = [str(ROOT / ".venv/bin/kunlun-fleet"), "status", "-i", "inventories/sim", "--json", *args]
    proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=timeout)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(
            "kunlun-fleet status printed no JSON document (exit %d):\n%s\n%s"
            % (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
        ) from None
    return proc.returncode, doc, proc.stderr


def rows(doc):
    return {r["host"]: r for r in doc["hosts"]}


def last_report():
    runs = sorted(p for p in (ROOT / "reports" / "runs").iterdir() if p.name.endswith("-status"))
    return json.loads((runs[-1] / "summary.json").read_text())


def untouched():
    return {i: ssh(i, UNTOUCHED).stdout for i in (1, 2, 3)}


@pytest.fixture(scope="module")
def served(sim_fleet):
    """The e2e leaves the three hosts serving; say so plainly when they are not. Asked on
    each host itself: the host firewall opens vLLM's port to the gateways and the
    monitoring hosts only (docs/security.md)."""
    for i in (1, 2, 3):
        found = ssh(i, host_curl("/health", PORT) + " -sf -o /dev/null", check=False)
        assert found.returncode == 0, (
            "kf-node-%d does not serve (curl exit %d on the host): this suite runs after the e2e, which leaves "
            "the fleet served; run `kunlun-fleet demo` first" % (i, found.returncode)
        )


def test_every_host_healthy_and_nothing_changed(served):
    before = untouched()
    code, doc, err = status()
    report = last_report()
    assert code == 0, json.dumps([(r["host"], r["reasons"]) for r in doc["hosts"]]) + err[-2000:]
    assert doc["healthy"] is True and doc["exit_code"] == 0
    assert sorted(rows(doc)) == list(HOSTS)
    for host, row in rows(doc).items():
        assert row["reachable"] and row["healthy"] and row["reasons"] == [], (host, row["reasons"])
        assert row["service"]["active"] == "active", host
        assert row["image"]["state"] == "current" and row["image"]["runs_id"] == row["image"]["current_id"], host
        assert row["driver"]["devices_ok"] == row["driver"]["expected"] == PINS["kunlun_stack_device_count"], host
        assert row["gateway"]["state"] == "in", (host, row["gateway"])
        assert row["serving"]["model"] == PINS["kunlun_stack_model"]["name"], host
        assert row["serving"]["requests_running"] is not None, (host, row["serving"])
        # The e2e leaves kf-node-3 on the ext4 volume it was delivered with (adopted).
        fstype = "ext4" if host == "kf-node-3" else "xfs"
        assert row["volume"]["mount_point"] == "/home" and row["volume"]["fstype"] == fstype, host
        assert row["os"]["pretty_name"], host
        # The e2e's acceptance stage (same checkout, same lane, run before) left each host's figure.
        assert row["acceptance"] and row["acceptance"]["tokens_per_s"] is not None, host
    # Nothing changed: no task reported a change (check mode, too), the serving files and the
    # running service are the same.
    assert report["check_mode"] is True and report["command"] == "status"
    assert {h: c["changed"] for h, c in report["hosts"].items()} == {h: 0 for h in report["hosts"]}, report["hosts"]
    assert set(HOSTS) <= set(report["hosts"])
    assert untouched() == before
