"""The simulated fleet and its LVM kit, tested through the real interfaces: Ansible over
SSH with checked host keys, the stock community modules, real loop devices and XFS."""

import json
import os
import subprocess
import tempfile

import pytest

from kunlun_fleet.sim.testing import INVENTORY, ansible, playbook, sim, ssh

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


def test_lvg_lvol_filesystem_mount_give_writable_xfs(fresh_host):
    host = fresh_host(3)
    _, recap = playbook("lvm_xfs.yml", "-e", "target=kf-node-%d" % host)
    assert recap["kf-node-3"]["changed"] >= 4
    assert ssh(host, "findmnt -n -o FSTYPE /srv/kit-test").stdout.strip() == "xfs"
    assert ssh(host, "cat /srv/kit-test/hello.txt").stdout == "written through the kit\n"
    ssh(host, "dd if=/dev/urandom of=/srv/kit-test/blob bs=1M count=8 status=none && sync")
    attr = ssh(host, "lvs --noheadings -o lv_attr kitvg/kitlv").stdout.strip()
    assert attr[4] == "a" and attr[5] == "o"
    # Second run of the same playbook: nothing to do.
    _, recap = playbook("lvm_xfs.yml", "-e", "target=kf-node-%d" % host)
    assert recap["kf-node-3"]["changed"] == 0

    # Another host does not see this host's PV (LVM filter: only /dev/vd*).
    assert "kitvg" not in ssh(2, "pvs; vgs").stdout

    # The LV survives a container restart: the kit's boot unit re-attaches and remounts.
    from kunlun_fleet.sim import engine, fleet
    engine.docker("restart", "kf-sim-%d" % host, timeout=120)
    fleet.wait_ready(host)
    assert ssh(host, "findmnt -n -o FSTYPE /srv/kit-test").stdout.strip() == "xfs"
    assert ssh(host, "cat /srv/kit-test/hello.txt").stdout == "written through the kit\n"
    assert int(ssh(host, "stat -c %s /srv/kit-test/blob").stdout) == 8 << 20
    _, recap = playbook("lvm_xfs.yml", "-e", "target=kf-node-%d" % host)
    assert recap["kf-node-3"]["changed"] == 0


def test_lvextend_grows_device_and_filesystem(fresh_host):
    host = fresh_host(2)
    playbook("lvm_grow.yml", "-e", "target=kf-node-%d" % host, "-e", "lv_size=1t")
    assert int(ssh(host, "blockdev --getsize64 /dev/growvg/growlv").stdout) == T
    ssh(host, "echo before-grow > /srv/grow-test/marker")
    _, recap = playbook("lvm_grow.yml", "-e", "target=kf-node-%d" % host, "-e", "lv_size=2t")
    assert recap["kf-node-2"]["changed"] >= 2
    assert int(ssh(host, "blockdev --getsize64 /dev/growvg/growlv").stdout) == 2 * T
    fs_bytes = int(ssh(host, "df -B1 --output=size /srv/grow-test | tail -1").stdout)
    assert fs_bytes > 1.9 * T
    assert ssh(host, "cat /srv/grow-test/marker").stdout == "before-grow\n"
    # The plain LVM command line grows it too (another +1T, filesystem with -r).
    ssh(host, "lvextend -L +1T -r growvg/growlv")
    assert int(ssh(host, "blockdev --getsize64 /dev/growvg/growlv").stdout) == 3 * T
    assert int(ssh(host, "df -B1 --output=size /srv/grow-test | tail -1").stdout) > 2.9 * T


def test_new_lv_is_wiped(fresh_host):
    """A new LV over extents that held a filesystem starts without its signature."""
    host = fresh_host(2)
    ssh(host, "pvcreate -q /dev/vdb && vgcreate -q wvg /dev/vdb && lvcreate -q -y -n one -L 1G wvg "
              "&& mkfs.xfs -q /dev/wvg/one && lvremove -q -y wvg/one && lvcreate -q -y -n two -L 1G wvg")
    proc = ssh(host, "blkid -p /dev/wvg/two", check=False)
    assert "xfs" not in proc.stdout
    assert ssh(host, "readlink -f /dev/wvg/two").stdout.strip() == \
        ssh(host, "readlink -f /dev/mapper/wvg-two").stdout.strip()


def test_kit_faults_shape_the_host(fresh_host):
    host = fresh_host(2, "disk_has_fs=1", "home_content=1", "docker_content=1", "no_kernel_headers=1")
    assert ssh(host, "blkid -o value -s TYPE /dev/vdb").stdout.strip() == "ext4"
    assert ssh(host, "cat /home/alice/notes.txt | head -1").stdout == "alice's notes\n"
    blocks, bsize, size = ssh(host, "stat -c '%b %B %s' /home/alice/sparse.img").stdout.split()
    assert int(size) == 2 << 30
    assert int(blocks) * int(bsize) < 1 << 20
    assert ssh(host, "stat -c %h /home/bob/data.bin").stdout.strip() == "2"
    assert "user:bob:r--" in ssh(host, "getfacl -p /home/alice/shared.txt").stdout
    assert ssh(host, "test -s /var/lib/kunlun-kit/home.manifest && echo yes").stdout.strip() == "yes"
    assert ssh(host, "cat /var/lib/docker/volumes/kf-seed-data/_data/hello.txt").stdout.startswith("data")
    proc = ssh(host, "test -e /usr/src/linux-headers-$(uname -r) || echo absent")
    assert proc.stdout.strip() == "absent"
    status = json.loads(sim("sim-status", "--json").stdout)
    row = [r for r in status["hosts"] if r["host"] == "kf-node-2"][0]
    assert row["faults"]["disk_has_fs"] == "1"


def test_kernel_headers_present_without_fault(sim_fleet):
    proc = ssh(1, "make -s -C /lib/modules/$(uname -r)/build kernelrelease")
    assert proc.stdout.strip() == os.uname().release


def test_bad_fault_is_refused_before_anything_changes(sim_fleet):
    proc = sim("sim-up", "3", "--fault", "nohost-xpu_devices", check=False)
    assert proc.returncode != 0
    assert "HOST:NAME=VALUE" in proc.stdout
    proc = sim("sim-up", "3", "--fault", "kf-node-9:xpu_devices=7", check=False)
    assert proc.returncode != 0 and "names host 9" in proc.stdout


def test_reports_match_lvm_but_show_activation(fresh_host):
    """lvs/vgs through the kit print exactly what LVM prints, except the state and open
    characters of lv_attr, which show the kit's activation."""
    host = fresh_host(1)
    ssh(host, "pvcreate -q /dev/vdb && vgcreate -q data /dev/vdb && lvcreate -q -y -n home -L 2T data "
              "&& lvcreate -q -y -n other-lv -L 1G data && lvchange -q -an data/other-lv")
    for args in ("", "--noheadings --options vg_name,lv_name,lv_size --units g data/home",
                 "-a -o lv_name,size,lv_attr --units m --separator ';'", "--reportformat json",
                 "--nameprefixes --noheadings -o lv_name,lv_attr", "--segments -o +devices",
                 "-o lv_name,lv_attr,lv_uuid"):
        real = ssh(host, "lvm lvs %s 2>/dev/null" % args).stdout
        kit = ssh(host, "lvs %s" % args).stdout
        expected = real.replace("-wi-XX----", "-wi-a-----", 1).replace("-wi-XX----", "-wi-------")
        assert kit == expected, "lvs %s" % args
    assert ssh(host, "vgs --noheadings -o lv_name,lv_attr --separator ';' data").stdout.split() == \
        ["home;-wi-a-----", "other-lv;-wi-------"]


def test_lv_in_use_is_not_deactivated_or_removed(fresh_host):
    host = fresh_host(1)
    ssh(host, "pvcreate -q /dev/vdb && vgcreate -q data /dev/vdb && lvcreate -q -y -n home -L 1G data "
              "&& mkfs.xfs -q /dev/data/home && mkdir -p /mnt/h && mount /dev/data/home /mnt/h")
    proc = ssh(host, "vgchange -an data", check=False)
    assert proc.returncode != 0 and "in use" in proc.stderr
    proc = ssh(host, "lvremove -y data/home", check=False)
    assert proc.returncode != 0 and "in use" in proc.stderr
    assert ssh(host, "lvs --noheadings -o lv_attr data/home").stdout.strip()[4:6] == "ao"
    ssh(host, "umount /mnt/h && vgchange -an data")
    assert ssh(host, "lvs --noheadings -o lv_attr data/home").stdout.strip()[4:6] == "--"
    assert ssh(host, "test -e /dev/data/home || echo gone").stdout.strip() == "gone"
    ssh(host, "vgchange -ay data && lvremove -y data/home")
    assert ssh(host, "lvs --noheadings data").stdout.strip() == ""
