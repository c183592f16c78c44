"""Helpers of the storage/engine sim suites: stage playbooks on the lane's host only (kf-node-2
of the shared fleet, or a scratch lane's host: kunlun_fleet.sim.testing.lane_host), the host
tool (tests/storage/host_tool.py, uploaded over SSH), snapshots and a pre-existing Docker
engine holding images."""

import json
import os
import subprocess
import time

from kunlun_fleet.sim import fleet
from kunlun_fleet.sim.testing import INVENTORY, REPO, VENV_BIN, _env, lane_host, recap, ssh

HOST, NAME = lane_host(2)
TOOL = "/root/kf-host-tool.py"
HERE = os.path.dirname(os.path.abspath(__file__))

# What the storage and engine roles may change, in one text (pvs/vgs/lvs, block devices,
# mounts, fstab, the /home tree with checksums, daemon.json, data-roots, drop-ins, packages).
SNAPSHOT = r"""
set -uo pipefail
echo "== pvs/vgs/lvs"; pvs --noheadings 2>&1; vgs --noheadings 2>&1; lvs --noheadings 2>&1
echo "== disks"; for d in /dev/vd?; do echo "$d $(blkid -p -o export $d 2>&1 | tr '\n' ' ')"; done
echo "== lsblk"; lsblk -rno NAME,SIZE,FSTYPE,MOUNTPOINT /dev/vd? 2>&1
echo "== mounts"; findmnt -rn -o TARGET,SOURCE,FSTYPE,OPTIONS | grep -E '^(/home|/mnt|/var/lib/docker)' ; true
echo "== fstab"; sha256sum /etc/fstab; cat /etc/fstab
echo "== /home"; python3 %(tool)s list /home | sha256sum
echo "== /var/lib/docker"; find /var/lib/docker -printf '%%y %%m %%s %%T@ %%p\n' 2>/dev/null | LC_ALL=C sort | sha256sum
echo "== daemon.json"; sha256sum /etc/docker/daemon.json 2>&1; cat /etc/docker/daemon.json 2>&1
ls -la /home/docker 2>&1 | head -3
ls /etc/systemd/system/docker.service.d 2>&1
echo "== images"; docker images --format '{{.Repository}}:{{.Tag}} {{.ID}}' 2>&1 | sort
echo "== units"; systemctl is-active docker.service docker.socket 2>&1
dpkg-query -W -f '${Package} ${Status}\n' docker.io lvm2 xfsprogs rsync 2>&1
echo "== state"; ls -la /var/lib/kunlun-fleet/carry-over 2>&1; ls /mnt 2>&1
exit 0
""" % {"tool": TOOL}


def sh(command, check=True, timeout=120):
    return ssh(HOST, command, check=check, timeout=timeout)


# Seeding an old engine (Debian's docker.io installed and started, images built) on a host
# at a scratch lane's low CPU weight took more than 120 s in two runs on a busy machine.
SEED_TIMEOUT = 900


def upload_tool():
    with open(os.path.join(HERE, "host_tool.py"), "rb") as fh:
        data = fh.read()
    proc = subprocess.run(
        fleet.ssh_cmd(HOST, "cat > %s && chmod 0755 %s" % (TOOL, TOOL)),
        input=data,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def tree(root, *skip):
    """{path: record} of the host tool's checksum list of root."""
    args = " ".join("--skip %s" % s for s in skip)
    out = sh("python3 %s list %s %s" % (TOOL, root, args)).stdout
    recs = [json.loads(line) for line in out.splitlines() if line.strip()]
    return {r["path"]: r for r in recs}


def tree_diff(before, after, limit=15):
    diffs = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a != b:
            if a is None:
                diffs.append("%s: new" % path)
            elif b is None:
                diffs.append("%s: LOST" % path)
            else:
                diffs.append(
                    "%s: %s" % (path, {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)})
                )
    return diffs[:limit] + (["... %d more" % (len(diffs) - limit)] if len(diffs) > limit else [])


def snapshot():
    return sh(SNAPSHOT).stdout


def stage(name, *args, check=False, env=None):
    """ansible-playbook playbooks/<name> --limit NAME; returns (proc, recap of the host)."""
    proc = subprocess.run(
        [
            os.path.join(VENV_BIN, "ansible-playbook"),
            "-i",
            INVENTORY,
            os.path.join(REPO, "playbooks", name),
            "--limit",
            NAME,
        ]
        + list(args),
        cwd=REPO,
        env=dict(_env(), **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if check and proc.returncode != 0:
        raise AssertionError("ansible-playbook %s failed:\n%s" % (name, proc.stdout[-6000:]))
    return proc, recap(proc.stdout).get(NAME, {})


def refused_run(playbook, words, *args):
    """The stage refuses: rc != 0, failed, nothing changed (recap and snapshot), every word
    in the output, "nothing was changed" among them; returns the output."""
    before = snapshot()
    proc, rec = stage(playbook, *args)
    after = snapshot()
    assert proc.returncode != 0 and rec.get("failed") == 1, proc.stdout[-3000:]
    assert rec.get("changed") == 0, "a refused run reported changes: %s\n%s" % (rec, proc.stdout[-3000:])
    msg = proc.stdout
    missing = [w for w in words if w not in msg]
    assert not missing, "the message lacks %s:\n%s" % (missing, msg[-3000:])
    assert "nothing was changed" in msg, msg[-3000:]
    assert after == before, "the host changed:\n%s" % "\n".join(
        sorted(set(before.splitlines()) ^ set(after.splitlines()))
    )
    return msg


def stage_cmd(name, *args):
    return [
        os.path.join(VENV_BIN, "ansible-playbook"),
        "-i",
        INVENTORY,
        os.path.join(REPO, "playbooks", name),
        "--limit",
        NAME,
    ] + list(args)


def wait_seeded(*manifests, timeout=120):
    deadline = time.time() + timeout
    while True:
        proc = sh(" && ".join("test -f %s" % m for m in manifests), check=False)
        if proc.returncode == 0:
            return
        if time.time() > deadline:
            raise AssertionError("the kit did not seed %s" % ", ".join(manifests))
        time.sleep(1)


# A Docker engine that was there before kunlun-fleet: /var/lib/docker its own filesystem
# (overlay2 cannot sit on the sim host's overlay root; real servers often have it on its
# own filesystem too), the kit's seeded volume moved onto it, two images (one of two
# layers: a whiteout and an opaque directory) and a stopped container.
OLD_ENGINE = r"""
set -euo pipefail
if ! findmnt -rn /var/lib/docker >/dev/null; then
  cp -a /var/lib/docker /root/kf-docker-seed
  mount -t tmpfs -o mode=0710,size=1g kf-old-docker /var/lib/docker
  cp -a /root/kf-docker-seed/. /var/lib/docker/
  rm -rf /root/kf-docker-seed
fi
export DEBIAN_FRONTEND=noninteractive
apt-cache show docker.io >/dev/null 2>&1 || apt-get update -qq
apt-get install -y -qq docker.io >/dev/null
systemctl start docker
rm -rf /tmp/kf-img && mkdir -p /tmp/kf-img/bin
cp /usr/bin/dash /tmp/kf-img/bin/sh
for b in rm cat mkdir; do cp /usr/bin/$b /tmp/kf-img/bin/; done
for lib in $(ldd /usr/bin/dash /usr/bin/rm /usr/bin/cat /usr/bin/mkdir | grep -o '/[^ ]*\.so[^ ]*' | sort -u); do
  mkdir -p /tmp/kf-img$(dirname $lib) && cp -L $lib /tmp/kf-img$lib
done
tar -C /tmp/kf-img -c . | docker import - kf-seed/tiny:1 >/dev/null
mkdir -p /tmp/kf-build
cat > /tmp/kf-build/Dockerfile <<'EOF'
FROM kf-seed/tiny:1
RUN ["/bin/sh", "-c", "echo hello from a layer > /hello && mkdir -p /d/sub && echo x > /d/sub/x && echo gone > /gone"]
RUN ["/bin/sh", "-c", "rm /gone && rm -r /d && mkdir /d && echo new > /d/y"]
EOF
DOCKER_BUILDKIT=0 docker build -q --network none -t kf-seed/layered:1 /tmp/kf-build >/dev/null
docker create --name kf-seed-ctr --network none kf-seed/layered:1 \
  /bin/sh -c 'cat /hello /d/y; test ! -e /gone && test ! -e /d/sub && echo whiteouts-ok' >/dev/null
docker images --format '{{.Repository}}:{{.Tag}} {{.ID}}' | sort
"""

# The parts of a data-root an idle engine does not rewrite: image layers, image metadata,
# the seeded volume.
DOCKER_STABLE = ("overlay2", "image", "volumes/kf-seed-data")


def docker_trees(root):
    """What an engine does not rewrite: its runtime state (a container's work and merged
    directories, the mounts record, backingFsBlockDev) is left out."""
    out = {}
    for sub in DOCKER_STABLE:
        for path, rec in tree(root + "/" + sub).items():
            full = sub + "/" + path
            parts = full.split("/")
            if (
                "work" in parts
                or "merged" in parts
                or full.startswith("image/overlay2/layerdb/mounts")
                or full == "overlay2/backingFsBlockDev"
            ):
                continue
            out[full] = rec
    return out


def docker_proof():
    """Images listed, the layered one runnable from its stopped container (whiteouts kept)."""
    images = sh("docker images --format '{{.Repository}}:{{.Tag}} {{.ID}}' | sort").stdout
    run = sh("docker start -a kf-seed-ctr", check=False)
    fresh = sh("docker run --rm --network none kf-seed/tiny:1 /bin/sh -c 'echo runs'", check=False)
    vol = sh("docker volume inspect --format '{{.Mountpoint}}' kf-seed-data", check=False)
    return {
        "images": images,
        "container": run.stdout.strip(),
        "run": fresh.stdout.strip(),
        "volume": vol.stdout.strip(),
    }
