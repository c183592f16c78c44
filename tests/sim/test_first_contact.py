"""First contact on the sim fleet (docs/cli.md, hostkeys and bootstrap), on a copy of the
sim inventory without its known_hosts: `kunlun-fleet hostkeys` finds three new keys (the
hosts' own, as ssh-keygen prints them), --accept records them and Ansible then reaches the
hosts with them; a tampered line is CHANGED, refused (exit 3) and the file left as it was.
Then (suite "bootstrap", on a scratch lane's host) a host reset with the password_only
fault (root has a password, not the key): a bootstrap before its key is known is refused,
Ansible with the key fails, `kunlun-fleet bootstrap` with the password installs the key and
a deploy user with sudo, Ansible with the key works, and a second bootstrap changes
nothing."""

import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

from kunlun_fleet.sim.config import host_address
from kunlun_fleet.sim.fleet import SIM_ROOT_PASSWORD
from kunlun_fleet.sim.testing import INVENTORY, REPO, VENV_BIN, _env, lane_host, recap, ssh

pytestmark = pytest.mark.sim

HOSTS = ["kf-node-1", "kf-node-2", "kf-node-3"]
# The bootstrap resets its host first: a scratch lane's own host in the suite runner (suite
# "bootstrap"), kf-node-3 of the shared fleet when run by hand.
BOOT_INDEX, BOOT_HOST = lane_host(3)


def copy_inventory(tmp_path):
    """The sim inventory in tmp_path/inv, without its .ssh/known_hosts, its connection
    settings pointing Ansible at the copy's known_hosts."""
    inv = tmp_path / "inv"
    shutil.copytree(INVENTORY, inv)
    known = inv / ".ssh" / "known_hosts"
    shutil.rmtree(known.parent, ignore_errors=True)  # hostkeys --accept makes it (0700)
    connection = inv / "group_vars" / "all" / "connection.yml"
    text = connection.read_text()
    assert os.path.join(INVENTORY, ".ssh", "known_hosts") in text
    connection.write_text(text.replace(os.path.join(INVENTORY, ".ssh", "known_hosts"), str(known)))
    return inv, known


def env():
    # No persistent SSH masters: every login in these tests is a real one (a master opened
    # earlier would let Ansible in without checking keys or credentials again).
    return dict(_env(), ANSIBLE_SSH_ARGS="-o ControlMaster=no -o ControlPath=none")


def kunlun_fleet(*args):
    return subprocess.run(
        [sys.executable, "-m", "kunlun_fleet.cli"] + [str(a) for a in args],
        cwd=REPO,
        env=env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=900,
    )


def ansible(inv, pattern, *args, **extra_env):
    return subprocess.run(
        [os.path.join(VENV_BIN, "ansible"), "-i", str(inv), pattern] + list(args),
        cwd=REPO,
        env=dict(env(), **extra_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )


def statuses(stdout):
    """{host: (fingerprint, status)} from hostkeys' table."""
    rows = {}
    for line in stdout.splitlines():
        fields = line.split()
        if fields and fields[0] in HOSTS:
            rows[fields[0]] = (fields[3], fields[4])
    return rows


def own_fingerprint(index):
    """The host's ed25519 key as ssh-keygen prints it on the host itself."""
    return ssh(index, "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1]


def test_hostkeys_new_accepted_known_and_a_changed_key(sim_fleet, tmp_path):
    inv, known = copy_inventory(tmp_path)

    proc = kunlun_fleet("hostkeys", "-i", inv)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # new keys, not accepted yet
    rows = statuses(proc.stdout)
    assert {h: s for h, (_, s) in rows.items()} == {h: "new" for h in HOSTS}
    for index, host in enumerate(HOSTS, 1):
        assert rows[host][0] == own_fingerprint(index)
    assert "3 new host key(s), not accepted yet" in proc.stdout and not known.exists()
    assert "note: Ansible does not read" not in proc.stderr

    proc = kunlun_fleet("hostkeys", "-i", inv, "--accept")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {h: s for h, (_, s) in statuses(proc.stdout).items()} == {h: "accepted" for h in HOSTS}
    lines = known.read_text().splitlines()
    assert sorted(line.split()[0] for line in lines) == [host_address(i) for i in (1, 2, 3)]
    assert stat.S_IMODE(known.stat().st_mode) == 0o600 and stat.S_IMODE(known.parent.stat().st_mode) == 0o700

    proc = kunlun_fleet("hostkeys", "-i", inv)
    assert proc.returncode == 0 and {s for _, s in statuses(proc.stdout).values()} == {"known"}
    # OpenSSH (Ansible's ssh, StrictHostKeyChecking=yes) reads what was written.
    proc = ansible(inv, "all", "-m", "ansible.builtin.ping")
    assert proc.returncode == 0 and all("%s | SUCCESS" % h in proc.stdout for h in HOSTS), proc.stdout

    # A bootstrap of a host that already takes the key changes nothing (the key logs in
    # before any password is tried: a wrong one does not matter).
    password = tmp_path / "password"
    password.write_text("not-the-password-0\n")
    os.chmod(password, 0o600)
    proc = kunlun_fleet("bootstrap", "-i", inv, "--limit", "kf-node-1", "--password-file", password, "--plain")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert recap(proc.stdout)["kf-node-1"]["changed"] == 0 and "key login root@kf-node-1: ok" in proc.stdout
    assert "not-the-password-0" not in proc.stdout + proc.stderr

    # kf-node-2's line holds another host's key: CHANGED, refused, the file untouched.
    by_address = {line.split()[0]: line for line in lines}
    first, second = by_address[host_address(1)].split(), by_address[host_address(2)].split()
    tampered = " ".join(second[:2] + first[2:3])
    known.write_text("".join((tampered if line == by_address[host_address(2)] else line) + "\n" for line in lines))
    before = known.read_bytes()
    for extra in ([], ["--accept"]):
        proc = kunlun_fleet("hostkeys", "-i", inv, *extra)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        rows = statuses(proc.stdout)
        assert rows["kf-node-2"][1] == "CHANGED" and rows["kf-node-1"][1] == rows["kf-node-3"][1] == "known"
        assert "REFUSED kf-node-2" in proc.stderr
        assert own_fingerprint(2) in proc.stderr and own_fingerprint(1) in proc.stderr  # offered, recorded
        assert "ssh-keygen -R %s -f %s" % (host_address(2), known) in proc.stderr
        assert known.read_bytes() == before


def test_bootstrap_a_password_only_host(fresh_host, tmp_path):
    fresh_host(BOOT_INDEX, "password_only=1")
    inv, known = copy_inventory(tmp_path)
    password = tmp_path / "password"
    password.write_text(SIM_ROOT_PASSWORD + "\n")
    os.chmod(password, 0o600)
    bootstrap = ["bootstrap", "-i", inv, "--limit", BOOT_HOST, "--password-file", password, "--plain"]

    # No password goes to a host whose key is not known.
    proc = kunlun_fleet(*bootstrap)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert (
        "not known yet" in proc.stderr
        and "kunlun-fleet hostkeys -i %s --limit %s --accept" % (inv, BOOT_HOST) in proc.stderr
    )
    proc = kunlun_fleet("hostkeys", "-i", inv, "--limit", BOOT_HOST, "--accept")
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # The host has no key of ours: Ansible cannot log in (OpenSSH's own words with Ansible's
    # ssh connection; Mitogen's would say it in its own).
    proc = ansible(inv, BOOT_HOST, "-m", "ansible.builtin.ping", ANSIBLE_STRATEGY="linear")
    assert proc.returncode != 0 and "UNREACHABLE" in proc.stdout and "Permission denied" in proc.stdout

    proc = kunlun_fleet(*bootstrap, "--deploy-user", "kfdeploy")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert recap(proc.stdout)[BOOT_HOST]["changed"] >= 3  # root's key, the user, its key, sudo
    assert "key login root@%s: ok" % BOOT_HOST in proc.stdout and "key login kfdeploy@%s: ok" % BOOT_HOST in proc.stdout
    assert SIM_ROOT_PASSWORD not in output
    run_dir = re.search(r"^report: (.*)/summary\.md$", proc.stdout, re.M).group(1)
    run_dir = run_dir if os.path.isabs(run_dir) else os.path.join(REPO, run_dir)
    for base, _, files in os.walk(run_dir):
        for name in files:
            with open(os.path.join(base, name), errors="replace") as handle:
                assert SIM_ROOT_PASSWORD not in handle.read(), os.path.join(base, name)

    # With the key: root, and the deploy user with sudo (no password).
    proc = ansible(inv, BOOT_HOST, "-m", "ansible.builtin.ping")
    assert proc.returncode == 0 and "%s | SUCCESS" % BOOT_HOST in proc.stdout, proc.stdout
    proc = ansible(inv, BOOT_HOST, "-u", "kfdeploy", "-b", "-m", "ansible.builtin.command", "-a", "id -un")
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "root", proc.stdout
    mode = ssh(
        BOOT_INDEX, "stat -c %a /etc/sudoers.d/kunlun-fleet-kfdeploy && visudo -cf /etc/sudoers.d/kunlun-fleet-kfdeploy"
    )
    assert mode.stdout.split()[0] == "440"

    # Again: nothing changes.
    proc = kunlun_fleet(*bootstrap, "--deploy-user", "kfdeploy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert recap(proc.stdout)[BOOT_HOST]["changed"] == 0 and recap(proc.stdout)[BOOT_HOST]["failed"] == 0
