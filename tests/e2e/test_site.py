"""site.yml end to end on the 3-host sim fleet, then the checks an operator would make."""

import os
import subprocess
from pathlib import Path

import pytest

from kunlun_fleet.sim.testing import recap, sim

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.sim


def run_site(*extra):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", "inventories/sim", "site.yml", *extra],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=3600)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def first_run(sim_fleet):
    """From bare hosts: reset all three, then the README's demo command."""
    for host in ("kf-node-1", "kf-node-2", "kf-node-3"):
        sim("sim-reset", host)
    proc = subprocess.run([str(ROOT / ".venv/bin/kunlun-fleet"), "demo"], cwd=ROOT, text=True,
                          capture_output=True, timeout=3600, env=dict(os.environ, ANSIBLE_FORCE_COLOR="0"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "=== kunlun-fleet demo summary ===" in out and "site.yml: succeeded" in out, out[-3000:]
    return out


def test_first_run_reaches_every_host(first_run):
    hosts = recap(first_run)
    assert {"kf-node-1", "kf-node-2", "kf-node-3"} <= set(hosts), hosts
    assert all(h["failed"] == 0 and h["unreachable"] == 0 for h in hosts.values()), hosts


def test_second_run_changes_nothing(first_run):
    rc, out = run_site()
    assert rc == 0, out[-6000:]
    changed = {h: r["changed"] for h, r in recap(out).items() if r["changed"]}
    assert changed == {}, "second run changed: %s\n%s" % (changed, out[-4000:])


def test_check_diff_changes_nothing(first_run):
    rc, out = run_site("--check", "--diff")
    assert rc == 0, out[-6000:]
    changed = {h: r["changed"] for h, r in recap(out).items() if r["changed"]}
    assert changed == {}, "check mode reports changes on a converged fleet: %s\n%s" % (changed, out[-4000:])
