"""Preflight's host checks on a sim host with fault switches (real SSH, real tools)."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOST = "kf-node-1"
pytestmark = pytest.mark.sim


def preflight():
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", "inventories/sim",
                           "playbooks/preflight.yml", "--limit", HOST], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr


def test_xpu_smi_reports_seven_of_eight(fresh_host):
    fresh_host(1, "xpu_devices=7", "xpu_old_driver=5.0.21.26")
    rc, out = preflight()
    assert rc != 0
    assert "%s: xpu-smi reports 7 devices where 8 are expected" % HOST in out, out[-4000:]
    assert "changed=0" in out


def test_data_disk_holding_a_filesystem(fresh_host):
    fresh_host(1, "disk_has_fs=1")
    rc, out = preflight()
    assert rc != 0
    assert "%s: /dev/vdb holds ext4" % HOST in out, out[-4000:]
    assert "nothing was changed" in out


def test_fresh_host_passes(fresh_host):
    fresh_host(1)
    rc, out = preflight()
    assert rc == 0, out[-4000:]
    assert "/dev/vdb: empty" in out
