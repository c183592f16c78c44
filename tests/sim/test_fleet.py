"""The simulated fleet as a whole, tested through the real interfaces: Ansible over SSH
with checked host keys, the inventory sim-up writes, sim-up's idempotence and its refusals.
(The LVM kit's tests reset a host each: tests/sim/test_kit_lvm.py, in a host's lane.)"""

import os
import subprocess
import tempfile

import pytest

from kunlun_fleet.sim.testing import INVENTORY, ansible, sim, ssh

pytestmark = pytest.mark.sim

T = 1 << 40


def test_ping_over_ssh_with_checked_host_keys(sim_fleet):
    proc = ansible("all", "-m", "ansible.builtin.ping")
    for host in ("kf-node-1", "kf-node-2", "kf-node-3"):
        assert "%s | SUCCESS" % host in proc.stdout
    with open(os.path.join(INVENTORY, "group_vars", "all", "connection.yml")) as fh:
        connection = fh.read()
    assert "StrictHostKeyChecking=no" not in connection
    assert "UserKnownHostsFile=%s" % os.path.join(INVENTORY, ".ssh", "known_hosts") in connection


def test_unknown_host_key_is_refused(sim_fleet):
    """Host key checking is really on: with an empty known_hosts the same SSH fails."""
    from kunlun_fleet.sim import fleet
    with tempfile.NamedTemporaryFile("w") as empty:
        cmd = [a if not a.startswith("UserKnownHostsFile=") else "UserKnownHostsFile=" + empty.name
               for a in fleet.ssh_cmd(1, "true")]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode != 0
    assert "Host key verification failed" in proc.stderr


def test_inventory_groups_and_disks(sim_fleet):
    proc = ansible("xpu_servers", "--list-hosts")
    assert "kf-node-3" in proc.stdout
    proc = ansible("kf-node-2", "-m", "ansible.builtin.debug", "-a", "var=storage_data_disks")
    assert "/dev/vdb" in proc.stdout
    size = ssh(2, "blockdev --getsize64 /dev/vdb").stdout.strip()
    assert int(size) == 14 * T


def test_sim_up_again_changes_nothing(sim_fleet):
    from kunlun_fleet.sim import engine
    before = engine.docker("ps", "-q", "--no-trunc", "--filter", "label=org.kunlun-fleet.sim").stdout.split()
    proc = sim("sim-up", "3")
    after = engine.docker("ps", "-q", "--no-trunc", "--filter", "label=org.kunlun-fleet.sim").stdout.split()
    assert sorted(before) == sorted(after)
    assert "(0 (re)created)" in proc.stdout


def test_kernel_headers_present_without_fault(sim_fleet):
    proc = ssh(1, "make -s -C /lib/modules/$(uname -r)/build kernelrelease")
    assert proc.stdout.strip() == os.uname().release


def test_bad_fault_is_refused_before_anything_changes(sim_fleet):
    proc = sim("sim-up", "3", "--fault", "nohost-xpu_devices", check=False)
    assert proc.returncode != 0
    assert "HOST:NAME=VALUE" in proc.stdout
    proc = sim("sim-up", "3", "--fault", "kf-node-9:xpu_devices=7", check=False)
    assert proc.returncode != 0 and "names host 9" in proc.stdout
