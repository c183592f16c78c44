"""A serving host whose data disk is gone at boot (docs/storage.md, "A data disk that
fails"): it comes up reachable over SSH instead of stopping in emergency mode, serves
nothing, writes nothing under /home on its root disk, and `kunlun-fleet status` names the
volume that is missing and its fstab line; with the disk back, the next boot brings it all
back, serving.

The suite's host (kf-node-2, or a scratch lane's) is reset and taken through the stages up to
serve (`kunlun-fleet deploy --only ...`: the volume built with nofail and a bounded device
wait, Docker, the driver, the image, the model, kunlun-serve). The kit then takes its data
disk away from the next boot on (`kunlun-kit-disk detach`: a disk that failed or was pulled
while the host was down; the volume group misses its physical volume and the LV does not
activate) and the host is restarted, its mounts brought up by systemd as at a boot
(kunlun_fleet/sim/README.md, "A data disk that fails"). The sim inventory's device wait is
20 s (storage_mount_device_timeout; 90 s at the default). The unit tier proves the fstab
options and what each unit requires: tests/unit/test_data_volume_boot.py; the alert:
tests/unit/test_monitoring_rules.py (KunlunDataVolumeNotMounted)."""

import json
import os
import subprocess
import time

import pytest

from kunlun_fleet.sim import config, engine, fleet
from kunlun_fleet.sim.testing import INVENTORY, REPO, VENV_BIN, _env
from storage_helpers import HOST, NAME, sh

pytestmark = [pytest.mark.sim, pytest.mark.slow]

STAGES = "preflight,storage,engine,driver,image,model,serve"


def kunlun_fleet(*args, timeout=1800):
    return subprocess.run(
        [os.path.join(VENV_BIN, "kunlun-fleet"), *args],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def status_row():
    proc = kunlun_fleet("status", "-i", INVENTORY, "--limit", NAME, "--json", timeout=600)
    start = proc.stdout.find("{")
    assert start >= 0, proc.stdout[-3000:]
    doc, _ = json.JSONDecoder().raw_decode(proc.stdout[start:])
    (row,) = [r for r in doc["hosts"] if r["host"] == NAME]
    return proc.returncode, row


def boot():
    """A restart of the host's container: systemd shuts down, then boots (the kit's LVM
    activation, the fstab mounts); returns once SSH answers and the boot is done."""
    engine.docker("restart", config.container_name(HOST), timeout=180)
    state = fleet.wait_ready(HOST)
    assert state in ("running", "degraded"), state
    return state


def test_a_host_without_its_data_disk_boots_reachable_serves_nothing_and_says_why(fresh_host):
    fresh_host(HOST)
    proc = kunlun_fleet("deploy", "-i", INVENTORY, "--limit", NAME, "--only", STAGES, "--plain")
    assert proc.returncode == 0, proc.stdout[-6000:]
    line = sh("awk '$2 == \"/home\"' /etc/fstab").stdout.strip()
    assert line.split()[3].split(",")[-2:] == ["nofail", "x-systemd.device-timeout=20s"], line
    assert sh("systemctl is-active docker.service kunlun-serve.service").stdout.split() == ["active", "active"]

    # The disk is gone at the next boot: the volume group misses its only physical volume.
    sh("kunlun-kit-disk detach")
    boot()
    # Reachable (this very command runs over SSH); the mount given up after its device wait,
    # and nothing that lives on the volume started.
    seen = sh(
        "findmnt -n /home || echo 'not mounted'; vgs --noheadings 2>&1 | grep -c data || true; "
        "systemctl is-active home.mount docker.service kunlun-serve.service kunlun-registry.service; "
        "journalctl -b --no-pager -u docker.service | grep -c \"start failed with result 'dependency'\"; "
        "ls -A /home",
        check=False,
    ).stdout.split("\n")
    assert seen[0] == "not mounted" and seen[1] == "0", seen
    assert seen[2:6] == ["inactive"] * 4, seen
    assert int(seen[6]) >= 1, seen
    # /home on the root disk is as the carry-over left it underneath the volume: empty.
    assert seen[7:] == [""], seen

    code, row = status_row()
    assert code == 2, row
    assert row["reasons"][0] == (
        "data volume not mounted at /home (fstab: %s): its device did not appear at boot, a data disk failed or "
        "missing? Check pvs, lvs -a -o +devices, journalctl -b -u home.mount" % line
    ), row["reasons"]
    assert "kunlun-serve.service is inactive" in row["reasons"], row["reasons"]
    # The status's docker calls (socket activation) started nothing either: still no engine,
    # nothing written on the root disk.
    assert sh("systemctl is-active docker.service; ls -A /home", check=False).stdout == "inactive\n"

    # The disk is back: the next boot mounts the volume and everything on it comes back.
    sh("kunlun-kit-disk attach")
    boot()
    # vllm listens once its engine is up (http or https: the worker's TLS is not this test's).
    deadline = time.monotonic() + 600
    while sh("ss -Hltn 'sport = :8000' | grep -q .", check=False).returncode != 0:
        assert time.monotonic() < deadline, sh("systemctl status kunlun-serve --no-pager", check=False).stdout
        time.sleep(2)
    assert sh("findmnt -n -o FSTYPE /home").stdout.strip() == "xfs"
    code, row = status_row()
    assert row["volume"]["mounted"] is True and row["service"]["active"] == "active", row
    assert row["image"]["state"] == "current", row
    assert not [r for r in row["reasons"] if "data volume" in r or "kunlun-serve" in r], row["reasons"]
