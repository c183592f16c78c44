"""Preflight's host checks on a sim host with fault switches (real SSH, real tools).

One reset for the module (host()): the pinned driver installed, so that xpu-smi answers,
and an ext4 filesystem on the data disk. Each refusal changes nothing, so the tests share
that host: the faults the kit reads at every call are rewritten between them, and the data
disk is wiped once the test of the filesystem on it is done.

A fresh sim host passing preflight: molecule/preflight (the role; verify proves nothing
moved). The playbook passing on bare hosts and on converged ones (changed=0): the e2e. An
empty disk reported empty: test_consent_lets_a_used_disk_through_and_an_empty_disk_is_reported_empty
in tests/preflight/test_host_checks_local.py."""

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from kunlun_fleet.sim.testing import INVENTORY, lane_host, ssh
from kunlun_fleet.bundle import load_pins as stack_pins

ROOT = Path(__file__).resolve().parents[2]
# The suite's host: a scratch lane's, or kf-node-1 of the shared fleet.
INDEX, HOST = lane_host(1)
PIN = stack_pins()["kunlun_stack_driver"]["version"]
pytestmark = pytest.mark.sim

# The faults of the module's one reset (machine faults: applied when the host is made).
MACHINE = ("disk_has_fs=1", "xpu_old_driver=" + PIN)
_RESET = {"done": False}


def host(fresh_host, *faults):
    """The module's host with ``faults`` (each one the kit reads at every call); the first
    call resets it (fresh_host, so the session knows it used the host)."""
    if not _RESET["done"]:
        fresh_host(INDEX, *(MACHINE + faults))
        _RESET["done"] = True
        return
    text = "".join("%s\n" % f for f in MACHINE + faults)
    ssh(INDEX, "printf %%s %s > /etc/kunlun-kit/faults" % shlex.quote(text))


@pytest.fixture(autouse=True)
def reset_after_a_failure(request):
    """A failed test may leave the host anywhere: the next one starts from a reset."""
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed != failed:
        _RESET["done"] = False


def preflight(*extra):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-playbook"), "-i", INVENTORY, "playbooks/preflight.yml", "--limit", HOST, *extra],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=900,
    )
    return proc.returncode, proc.stdout + proc.stderr


def said(out):
    """The run's output as one line: the YAML result format folds long messages and
    doubles the apostrophes of single-quoted strings."""
    return re.sub(r"\s+", " ", out).replace("''", "'")


def blkid(dev="/dev/vdb"):
    return ssh(INDEX, "blkid -p -o export %s" % dev, check=False).stdout


def test_data_disk_holding_a_filesystem(fresh_host):
    """Refused naming the disk, what it holds and the fix; the filesystem left as it was."""
    host(fresh_host)
    before = blkid()
    assert "TYPE=ext4" in before, before
    rc, out = preflight()
    text = said(out)
    assert rc != 0
    assert "%s: /dev/vdb holds ext4" % HOST in text, out[-4000:]
    assert "nothing was changed. Fix: if that content may be destroyed, list the disk in storage_take_disks" in text
    assert "changed=0" in out
    assert blkid() == before
    # The accelerator checks after this one need a data disk that passes.
    ssh(INDEX, "wipefs -q -a /dev/vdb")


def test_xpu_smi_reports_seven_of_eight(fresh_host):
    host(fresh_host, "xpu_devices=7")
    ssh(INDEX, "wipefs -q -a /dev/vdb")
    rc, out = preflight()
    assert rc != 0
    assert "%s: xpu-smi reports 7 devices where 8 are expected" % HOST in out, out[-4000:]
    assert "changed=0" in out


# The kit's serials: 02K, six hex digits of the host, then 0010 + the card's index.
SERIAL = r"02K[0-9A-F]{6}%04d"


def test_a_card_in_the_low_power_mode_is_refused(fresh_host):
    """One host, card 3 capped at 120 W: refused, naming the card and the fix. With
    kunlun_stack_require_full_power false, a warning and the run goes on:
    tests/unit/test_full_power_tasks.py::test_the_cases_in_one_run_each_host_its_own_outcome
    (its host not-required; the same tasks; a playbook that passes on a host with the driver: the e2e's second run)."""
    host(fresh_host, "xpu_power_cap=3:120")
    ssh(INDEX, "wipefs -q -a /dev/vdb")
    rc, out = preflight()
    text = said(out)
    assert rc != 0
    assert "%s: 1 of 8 cards is capped below the full 400 W: device 3 (serial" % HOST in text, out[-4000:]
    assert re.search(r"device 3 \(serial %s\) at 120 W" % (SERIAL % 13), text), out[-4000:]
    assert not re.search(r"device [0-24-7] \(serial", text)
    assert "128 TFLOPS in its 120 W low-power mode" in text
    assert "back to 400 W with the vendor's tool (xpu-smi) and re-run. Nothing was changed." in text
    assert "changed=0" in out
