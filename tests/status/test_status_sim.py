"""`kunlun-fleet status` on the served 3-host sim fleet, as an operator runs it every
morning (suite "bench-sim", lane "fleet", after the e2e, which leaves the fleet served):
every host healthy and exit 0, and the run changed nothing (no task changed, the serving
files and the running service untouched); then kunlun-serve stopped on kf-node-3: exit 2
and kf-node-3's row names the stopped service while the two others stay healthy. The
service is started again and the host waits until status reads it healthy (restored in a
fixture, so the fleet is left serving whatever the outcome)."""

import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from kunlun_fleet.sim.config import host_address
from kunlun_fleet.sim.testing import ssh

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.sim, pytest.mark.slow]
HOSTS = ("kf-node-1", "kf-node-2", "kf-node-3")
PINS = yaml.safe_load((ROOT / "roles/kunlun_stack/defaults/main.yml").read_text())
PORT = PINS["kunlun_stack_serving"]["port"]
STOPPED = 3
# What a host's serving state is made of on disk, and the running service's identity: the
# same before and after a status run.
UNTOUCHED = ("stat -c '%n %Y %s' /etc/systemd/system/kunlun-serve.service /etc/kunlun-serve/serve.env "
             "/etc/kunlun-serve/image /etc/ansible/facts.d/xpu.fact; "
             "systemctl show --property InvocationID --value kunlun-serve.service")


def status(*args, timeout=600):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    cmd = [str(ROOT / ".venv/bin/kunlun-fleet"), "status", "-i", "inventories/sim", "--json", *args]
    proc = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=timeout)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError("kunlun-fleet status printed no JSON document (exit %d):\n%s\n%s"
                             % (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:]))
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
    """The e2e leaves the three hosts serving; say so plainly when they are not."""
    for i in (1, 2, 3):
        try:
            with urllib.request.urlopen("http://%s:%d/health" % (host_address(i), PORT), timeout=10) as r:
                assert r.status == 200
        except OSError as exc:
            raise AssertionError("kf-node-%d does not serve (%s): this suite runs after the e2e, which leaves the "
                                 "fleet served; run `kunlun-fleet demo` first" % (i, exc))


def wait_healthy(host, timeout=300):
    """status --limit host until it reads the host healthy; the last document."""
    end = time.monotonic() + timeout
    while True:
        code, doc, err = status("--limit", host)
        if code == 0 or time.monotonic() > end:
            return code, doc, err
        time.sleep(5)


@pytest.fixture
def node3_stopped(served):
    """kunlun-serve stopped on kf-node-3; started again afterwards and read healthy (the
    serve stage puts it back when a plain start is not enough)."""
    ssh(STOPPED, "systemctl stop kunlun-serve.service")
    try:
        yield "kf-node-%d" % STOPPED
    finally:
        ssh(STOPPED, "systemctl reset-failed kunlun-serve.service 2>/dev/null; systemctl start kunlun-serve.service")
        code, doc, err = wait_healthy("kf-node-%d" % STOPPED)
        if code != 0:
            env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
            serve = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", "inventories/sim",
                                    "playbooks/serve.yml", "--limit", "kf-node-%d" % STOPPED,
                                    "-e", "serve_capacity_check=false"],
                                   cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=500)
            code, doc, err = wait_healthy("kf-node-%d" % STOPPED, timeout=120)
            assert code == 0, ("kf-node-3 was not healthy again after its service was started (%s); the serve "
                               "stage said:\n%s" % (rows(doc).get("kf-node-3", {}).get("reasons"),
                                                   (serve.stdout + serve.stderr)[-3000:]))


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
        # The e2e's acceptance stage (same checkout, same lane) leaves each host's figure.
        if (ROOT / "reports" / "acceptance.json").exists():
            assert row["acceptance"] and row["acceptance"]["tokens_per_s"] is not None, host
    # Nothing changed: no task reported a change (check mode, too), the serving files and the
    # running service are the same.
    assert report["check_mode"] is True and report["command"] == "status"
    assert {h: c["changed"] for h, c in report["hosts"].items()} == {h: 0 for h in report["hosts"]}, report["hosts"]
    assert set(HOSTS) <= set(report["hosts"])
    assert untouched() == before


def test_a_stopped_service_is_named_in_its_row(node3_stopped):
    code, doc, err = status()
    by_host = rows(doc)
    assert code == 2, (code, [(r["host"], r["reasons"]) for r in doc["hosts"]], err[-2000:])
    assert doc["healthy"] is False and doc["exit_code"] == 2
    row = by_host[node3_stopped]
    assert row["reachable"] and not row["healthy"]
    assert row["service"]["active"] in ("inactive", "failed"), row["service"]
    assert any(re.match(r"^kunlun-serve\.service is (inactive|failed)$", r) for r in row["reasons"]), row["reasons"]
    assert row["serving"]["requests_running"] is None
    for other in ("kf-node-1", "kf-node-2"):
        assert by_host[other]["healthy"], (other, by_host[other]["reasons"])
    # The table says the same in kf-node-3's row.
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    table = subprocess.run([str(ROOT / ".venv/bin/kunlun-fleet"), "status", "-i", "inventories/sim"], cwd=str(ROOT),
                           env=env, capture_output=True, text=True, timeout=600)
    assert table.returncode == 2, table.stdout + table.stderr
    line = next(line for line in table.stdout.splitlines() if line.startswith(node3_stopped + " "))
    assert re.search(r"UNHEALTHY: .*kunlun-serve\.service is (inactive|failed)", line), line
