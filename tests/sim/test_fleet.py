"""The simulated fleet as a whole, tested through the real interfaces: Ansible over SSH
with checked host keys, the inventory sim-up writes, sim-up's idempotence and its refusals.
(The LVM kit's tests reset a host each: tests/sim/test_kit_lvm.py, in a host's lane.)"""

import os
import subprocess
import tempfile

import pytest

from kunlun_fleet.sim import fleet
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
        cmd = [
            a if not a.startswith("UserKnownHostsFile=") else "UserKnownHostsFile=" + empty.name
            for a in fleet.ssh_cmd(1, "true")
        ]
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


def cpu_weight(container):
    """(the container's cgroup parent, the CPU weight it runs at): the parent group's
    cpu.shares for a beside fleet's host, docker's own group and weight otherwise."""
    from kunlun_fleet.sim import engine

    parent, _, shares = (
        engine.docker("inspect", "--format", "{{.HostConfig.CgroupParent}}|{{.HostConfig.CpuShares}}", container)
        .stdout.strip()
        .partition("|")
    )
    if parent.startswith("/"):
        from kunlun_fleet.sim import cpu_groups

        if cpu_groups.version() == 2:
            with open(os.path.join(cpu_groups.ROOT, parent.lstrip("/"), "cpu.weight")) as fh:
                weight = int(fh.read())
            # In v1 terms when it is the weight the beside group was asked for.
            beside = cpu_groups.weight_v2(fleet.BESIDE_CPU_SHARES)
            return parent, fleet.BESIDE_CPU_SHARES if weight == beside else weight
        with open(os.path.join(cpu_groups.ROOT, "cpu", parent.lstrip("/"), "cpu.shares")) as fh:
            return parent, int(fh.read())
    return parent, int(shares) or 1024


def shared_hosts():
    """{container name: id} of the shared fleet's three hosts (another fleet may be
    coming up beside them: the large lane runs at the same time)."""
    from kunlun_fleet.sim import engine

    out = engine.docker(
        "ps", "-a", "--no-trunc", "--filter", "label=org.kunlun-fleet.sim", "--format", "{{.Names}} {{.ID}}"
    ).stdout
    return {
        n: i
        for n, i in (line.split() for line in out.splitlines() if line.strip())
        if n in ("kf-sim-1", "kf-sim-2", "kf-sim-3")
    }


def test_sim_up_again_changes_nothing(sim_fleet):
    before = shared_hosts()
    proc = sim("sim-up", "3")
    assert shared_hosts() == before and len(before) == 3
    assert "(0 (re)created)" in proc.stdout


def test_a_second_fleet_lives_beside_the_shared_one(sim_fleet, tmp_path):
    """Another inventory is another fleet on its own range of hosts: the shared fleet's
    sim-up leaves it alone, a range that takes the shared fleet's hosts is refused before
    anything changes, and sim-down --inventory removes that fleet only."""
    other = str(tmp_path / "other")
    before = shared_hosts()
    try:
        proc = sim("sim-up", "1", "--first", "41", "--inventory", other)
        assert "inventory %s" % other in proc.stdout
        hosts = open(os.path.join(other, "hosts.yml")).read()
        assert "kf-node-41:" in hosts and "kf-node-1:" not in hosts
        assert "kf-node-41" not in open(os.path.join(INVENTORY, "hosts.yml")).read()
        # Reached with the other inventory's known_hosts, through the same helpers.
        assert ssh(41, "hostname").stdout.strip() == "kf-node-41"
        # It yields the CPU to the shared fleet: its hosts in a CPU group of their own, beside
        # docker's, at a lower weight (docker's own group is at the default 1024).
        assert cpu_weight("kf-sim-41") == (fleet.BESIDE_CGROUP, fleet.BESIDE_CPU_SHARES)
        assert fleet.BESIDE_CPU_SHARES < 1024 and cpu_weight("kf-sim-1")[1] == 1024
        proc = sim("sim-up", "3")
        assert "(0 (re)created)" in proc.stdout and "removing kf-node-41" not in proc.stdout
        assert ssh(41, "true").returncode == 0
        # kf-node-2..3: both the shared fleet's (kf-node-4 on may be a scratch lane's host).
        proc = sim("sim-up", "2", "--first", "2", "--inventory", other, check=False)
        assert proc.returncode != 0
        assert "kf-node-2, kf-node-3 belong(s) to the sim fleet of inventory %s" % INVENTORY in proc.stdout, proc.stdout
        assert "sim-down --inventory" in proc.stdout
        assert ssh(41, "true").returncode == 0  # refused before anything changed
    finally:
        sim("sim-down", "--inventory", other)
    assert not os.path.exists(os.path.join(other, "hosts.yml"))
    assert ssh(41, "true", check=False).returncode != 0
    assert shared_hosts() == before
    assert ansible("all", "-m", "ansible.builtin.ping").returncode == 0


def test_kernel_headers_present_without_fault(sim_fleet):
    proc = ssh(1, "make -s -C /lib/modules/$(uname -r)/build kernelrelease")
    assert proc.stdout.strip() == os.uname().release


def test_bad_fault_is_refused_before_anything_changes(sim_fleet):
    proc = sim("sim-up", "3", "--fault", "nohost-xpu_devices", check=False)
    assert proc.returncode != 0
    assert "HOST:NAME=VALUE" in proc.stdout
    proc = sim("sim-up", "3", "--fault", "kf-node-9:xpu_devices=7", check=False)
    assert proc.returncode != 0 and "names kf-node-9, which is not in this fleet" in proc.stdout
