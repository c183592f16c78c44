"""`kunlun-fleet status --collect DIR` on the served 3-host sim fleet (suite "bench-sim",
lane "fleet", beside test_status_sim.py): per host the raw outputs the product parses, in
DIR/<host>/ with an index.json, the serials of the sim's xpu-smi masked (none of the real
ones left in any file), nothing changed on the hosts; then `kunlun-fleet conformance DIR`
finds every file the product's parsers read ok against the sim kit's reference outputs
(tests/fixtures/conformance/sim/) and exits 0."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from kunlun_fleet.sim.testing import ssh

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.sim, pytest.mark.slow]
HOSTS = ("kf-node-1", "kf-node-2", "kf-node-3")
# What the product parses and the sim hosts all have (the kit's xpu-smi, lspci, lsmod; the
# engine's docker; the data volume at /home).
EXPECTED_FILES = (
    "xpu-smi.txt",
    "xpu-smi-q.txt",
    "xpu-smi-L.txt",
    "lspci-Dn.txt",
    "lsmod.txt",
    "findmnt.json",
    "blkid.txt",
    "lsblk.txt",
    "docker-info.json",
    "os-release.txt",
    "uname-a.txt",
    "proc_self_mountinfo.txt",
)
UNTOUCHED = (
    "stat -c '%n %Y %s' /etc/systemd/system/kunlun-serve.service /etc/kunlun-serve/serve.env "
    "/etc/ansible/facts.d/xpu.fact; systemctl show --property InvocationID --value kunlun-serve.service"
)


def kunlun_fleet(*args, timeout=600):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [str(ROOT / ".venv/bin/kunlun-fleet"), *args],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def real_serials(i):
    """The serial numbers the sim's xpu-smi prints on host i."""
    out = ssh(i, "xpu-smi -q").stdout
    return re.findall(r"(?m)^\s*Serial Number\s*:\s*(\S+)\s*$", out)


def test_collect_then_conformance(sim_fleet, tmp_path):
    before = {i: ssh(i, UNTOUCHED).stdout for i in (1, 2, 3)}
    serials = {i: real_serials(i) for i in (1, 2, 3)}
    assert all(serials.values()), serials
    out = tmp_path / "collected"
    proc = kunlun_fleet("status", "-i", "inventories/sim", "--json", "--collect", str(out))
    doc = json.loads(proc.stdout)
    assert proc.returncode in (0, 2), (proc.returncode, proc.stderr[-3000:])
    assert all(r["reachable"] for r in doc["hosts"]), [(r["host"], r.get("error")) for r in doc["hosts"]]
    assert sorted(doc["collected"]["files"]) == list(HOSTS), doc.get("collected")
    for i, host in enumerate(HOSTS, 1):
        host_dir = out / host
        index = json.loads((host_dir / "index.json").read_text())
        assert index["error"] is None and index["mount_point"] == "/home", index
        listed = dict((c["file"], c) for c in index["commands"] if c["file"])
        for name in EXPECTED_FILES:
            assert name in listed and (host_dir / name).is_file(), (host, name, index["commands"])
            assert listed[name]["rc"] == 0, (host, name, listed[name])
        for c in index["commands"]:
            assert c["file"] or c["missing"], (host, c)
        everything = "\n".join(p.read_text(errors="replace") for p in host_dir.iterdir())
        for serial in set(s for values in serials.values() for s in values):
            assert serial not in everything, (host, serial)
        assert re.search(r"Serial Number\s*:\s*SERIAL-0001", (host_dir / "xpu-smi-q.txt").read_text())
        assert index["masked"]["serial"] >= len(serials[i])
    # Nothing was written or changed on the hosts.
    assert {i: ssh(i, UNTOUCHED).stdout for i in (1, 2, 3)} == before

    check = kunlun_fleet("conformance", str(out), "--json", timeout=120)
    report = json.loads(check.stdout)
    bad = [
        (h, f["file"], f["verdict"], f["reason"])
        for h, d in report["hosts"].items()
        for f in d["files"]
        if f["verdict"] not in ("ok", "missing")
    ]
    assert check.returncode == 0 and not bad, (check.returncode, bad, check.stderr[-2000:])
    assert sorted(report["hosts"]) == list(HOSTS)
