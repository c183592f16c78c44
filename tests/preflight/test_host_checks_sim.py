"""Preflight's host checks on a sim host with fault switches (real SSH, real tools)."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from kunlun_fleet.sim.testing import INVENTORY, lane_host

ROOT = Path(__file__).resolve().parents[2]
# The suite's host: a scratch lane's, or kf-node-1 of the shared fleet.
INDEX, HOST = lane_host(1)
pytestmark = pytest.mark.sim


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


def test_xpu_smi_reports_seven_of_eight(fresh_host):
    fresh_host(INDEX, "xpu_devices=7", "xpu_old_driver=5.0.21.26")
    rc, out = preflight()
    assert rc != 0
    assert "%s: xpu-smi reports 7 devices where 8 are expected" % HOST in out, out[-4000:]
    assert "changed=0" in out


def test_data_disk_holding_a_filesystem(fresh_host):
    fresh_host(INDEX, "disk_has_fs=1")
    rc, out = preflight()
    assert rc != 0
    assert "%s: /dev/vdb holds ext4" % HOST in out, out[-4000:]
    assert "nothing was changed" in out


def test_fresh_host_passes(fresh_host):
    fresh_host(INDEX)
    rc, out = preflight()
    assert rc == 0, out[-4000:]
    assert "/dev/vdb: empty" in out


# The kit's serials: 02K, six hex digits of the host, then 0010 + the card's index.
SERIAL = r"02K[0-9A-F]{6}%04d"


def test_a_card_in_the_low_power_mode_is_refused_or_warned_about(fresh_host):
    """One host, card 3 capped at 120 W: refused by default, naming the card and the fix;
    with kunlun_stack_require_full_power false, a warning and the run goes on."""
    fresh_host(INDEX, "xpu_power_cap=3:120", "xpu_old_driver=5.0.21.26")
    rc, out = preflight()
    text = said(out)
    assert rc != 0
    assert "%s: 1 of 8 cards is capped below the full 400 W: device 3 (serial" % HOST in text, out[-4000:]
    assert re.search(r"device 3 \(serial %s\) at 120 W" % (SERIAL % 13), text), out[-4000:]
    assert not re.search(r"device [0-24-7] \(serial", text)
    assert "128 TFLOPS in its 120 W low-power mode" in text
    assert "back to 400 W with the vendor's tool (xpu-smi) and re-run. Nothing was changed." in text
    assert "changed=0" in out
    rc, out = preflight("-e", '{"kunlun_stack_require_full_power": false}')
    text = said(out)
    assert rc == 0, out[-4000:]
    assert re.search(
        r"WARNING %s: 1 of 8 cards is capped below the full 400 W: device 3 \(serial %s\) at 120 W\."
        % (HOST, SERIAL % 13),
        text,
    ), out[-4000:]
    assert (
        "set the card's power limit back to 400 W with the vendor's tool (xpu-smi) and re-run. "
        "kunlun_stack_require_full_power is false, so the run goes on at reduced throughput."
    ) in text
    assert "changed=0" in out
