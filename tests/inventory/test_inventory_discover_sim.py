"""`kunlun-fleet inventory` against the served 3-host sim fleet's real disks (suite "bench-sim",
lane "fleet", read-only beside the status tests): an inventory written from a CSV of the
three hosts, discovery refused until their SSH keys are known (hostkeys accepts the keys
sim-up recorded from the hosts themselves), then each host's data disks written from what it
reports, compared with what the host's own tools say, read independently over SSH (blkid,
pvs, lvs, findmnt; not lsblk, which inside the sim's containers reads the machine's sysfs):
/dev/vdb a physical volume of the volume group of the volume mounted at /home, so "ours";
data/home listed, any other volume adopted with no disk listed. Nothing on the hosts
changes: their disks, volumes, mounts and fstab read the same before and after, and the
discovery's run reports show check mode and no change. Unit tests of the rules and
refusals: tests/unit/test_inventory_gen.py, tests/unit/test_data_disk_candidates.py."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from kunlun_fleet.sim import config
from kunlun_fleet.sim.testing import ssh

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.sim, pytest.mark.slow]
INDEXES = (1, 2, 3)
# What the storage stage reads and would change, as the hosts' own tools print it.
UNTOUCHED = (
    "pvs --noheadings -o pv_name,vg_name,pv_uuid; vgs --noheadings -o vg_name,vg_uuid,vg_seqno; "
    "lvs --noheadings -o vg_name,lv_name,lv_uuid,lv_size; findmnt -n -o SOURCE,FSTYPE,OPTIONS /home; "
    "md5sum /etc/fstab; wipefs --no-act --noheadings /dev/vdb; ls -la --time-style=+%s /dev/disk/by-id 2>&1 || true"
)


def kunlun_fleet(*args, timeout=300):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [str(ROOT / ".venv/bin/kunlun-fleet"), *[str(a) for a in args]],
        cwd=str(ROOT),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def what_the_host_says(i):
    """/dev/vdb and /home as the host's own tools read them (not the module): vdb's signature
    type and volume group, its by-id links, and the logical volume mounted at /home (by device
    number), if any."""
    out = ssh(
        i,
        "echo type=$(blkid -p -o value -s TYPE /dev/vdb || true); "
        "echo vg=$(pvs --noheadings -o vg_name /dev/vdb 2>/dev/null | tr -d ' '); "
        "echo home=$(findmnt -n -o MAJ:MIN /home | tr -d ' '); "
        "for p in $(lvs --noheadings -o lv_path); do d=$(stat -L -c '%t:%T' $p); "
        'echo "lv=$p $((0x${d%:*})):$((0x${d#*:}))"; done; '
        'for l in /dev/disk/by-id/*; do [ "$(readlink -f $l)" = /dev/vdb ] && echo link=$l; done; true',
    ).stdout
    said = {"lvs": [], "links": []}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key == "lv":
            path, devno = value.split()
            said["lvs"].append((path, devno))
        elif key == "link":
            said["links"].append(value)
        else:
            said[key] = value
    home_lv = [p for p, devno in said["lvs"] if said["home"] and devno == said["home"]]
    said["home_lv"] = tuple(home_lv[0].split("/")[2:4]) if home_lv else None  # /dev/VG/LV
    return said


def expected(said):
    """(state, storage_data_disks names allowed, adopted) by the storage stage's rules."""
    vg = said["home_lv"][0] if said["home_lv"] else "data"
    if not said["type"]:
        state = "empty"
    elif said["type"] == "LVM2_member" and said["vg"] == vg:
        state = "ours"
    else:
        state = "foreign"
    adopt = bool(said["home_lv"]) and said["home_lv"] != ("data", "home")
    listed = not adopt and state in ("empty", "ours")
    return state, listed, adopt


def test_inventory_from_a_csv_then_each_hosts_disks(sim_fleet, tmp_path):
    before = {i: ssh(i, UNTOUCHED).stdout for i in INDEXES}
    site = tmp_path / "site-sim"
    lines = ["name,address,role"] + [
        "%s,%s,%s"
        % (
            config.host_name(i),
            config.host_address(i),
            "xpu_server;image_builder;gateway;monitoring" if i == 1 else "xpu_server",
        )
        for i in INDEXES
    ]
    (tmp_path / "hosts.csv").write_text("\n".join(lines) + "\n")

    proc = kunlun_fleet("inventory", "-i", site, "--csv", tmp_path / "hosts.csv", "--yes")
    assert proc.returncode == 0, proc.stderr
    hosts = yaml.safe_load((site / "hosts.yml").read_text())["all"]["children"]
    assert list(hosts["xpu_servers"]["hosts"]) == ["kf-node-1", "kf-node-2", "kf-node-3"]
    assert hosts["xpu_servers"]["hosts"]["kf-node-2"] == {"ansible_host": config.host_address(2)}

    # The operator's edit of the copied connection settings: the sim hosts' login key.
    connection = site / "group_vars" / "all" / "connection.yml"
    connection.write_text(connection.read_text() + "ansible_ssh_private_key_file: %s\n" % config.SSH_KEY)

    # No key known yet: discovery does not log in, and says which command makes them known.
    proc = kunlun_fleet("inventory", "-i", site, "--discover", "--yes")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "kunlun-fleet hostkeys -i %s --limit kf-node-1,kf-node-2,kf-node-3 --accept" % site in proc.stderr
    assert not (site / "host_vars").exists()

    # First contact; the keys are the ones sim-up recorded from the hosts themselves.
    accepted = kunlun_fleet("hostkeys", "-i", site, "--accept", "--json")
    assert accepted.returncode == 0, accepted.stderr
    recorded = kunlun_fleet(
        "hostkeys", "-i", config.INVENTORY_DIR, "--limit", "kf-node-1,kf-node-2,kf-node-3", "--json"
    )
    assert recorded.returncode == 0, recorded.stderr
    prints = {h["host"]: h["fingerprint"] for h in json.loads(recorded.stdout)["hosts"]}
    assert {h["host"]: h["fingerprint"] for h in json.loads(accepted.stdout)["hosts"]} == prints

    proc = kunlun_fleet("inventory", "-i", site, "--discover", "--yes")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    table = proc.stdout
    for i in INDEXES:
        host = config.host_name(i)
        said = what_the_host_says(i)
        state, listed, adopt = expected(said)
        text = (site / "host_vars" / ("%s.yml" % host)).read_text()
        disks = yaml.safe_load(text)["storage_data_disks"]
        names = ["/dev/vdb"] + said["links"]
        rows = [line.split() for line in table.splitlines() if line.startswith(host + " ")]
        assert any(r[1] in names and r[4] == state for r in rows), (host, said, table)
        if listed:
            assert len(disks) == 1 and disks[0] in names, (host, said, text)
            if said["home_lv"]:
                assert "(the volume at /home)" in text, text
        else:
            assert disks == [], (host, said, text)
        if adopt:
            assert "# /home is the LVM volume %s/%s" % said["home_lv"] in text, text
        if state == "foreign":
            assert "# storage_take_disks:" in text and "\nstorage_take_disks" not in text, text

    # Again: the same disks, nothing to change.
    again = kunlun_fleet("inventory", "-i", site, "--discover", "--yes")
    assert again.returncode == 0 and "nothing to change" in again.stdout, (again.stdout, again.stderr)

    # The generated inventory reads as Ansible reads it, with the disks.
    listed = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-inventory"), "-i", str(site), "--list"],
        cwd=str(ROOT),
        env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    hostvars = json.loads(listed.stdout)["_meta"]["hostvars"]
    assert all("storage_data_disks" in hostvars[config.host_name(i)] for i in INDEXES)

    # Read-only: the discovery ran in check mode and changed nothing; the hosts say the same.
    summaries = [
        json.loads(p.read_text()) for p in (ROOT / "reports" / "runs").glob("*-inventory-discover/summary.json")
    ]
    mine = [s for s in summaries if os.path.realpath(s.get("inventory") or "") == os.path.realpath(site)]
    assert len(mine) == 2, [s.get("inventory") for s in summaries]
    for summary in mine:
        assert summary["check_mode"] is True and summary["exit_code"] == 0, summary
        assert sorted(summary["hosts"]) == ["kf-node-1", "kf-node-2", "kf-node-3"], summary["hosts"]
        assert all(h["changed"] == 0 for h in summary["hosts"].values()), summary["hosts"]
    assert {i: ssh(i, UNTOUCHED).stdout for i in INDEXES} == before
