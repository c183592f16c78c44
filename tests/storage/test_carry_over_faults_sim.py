"""SIGKILL at every phase of both carry-overs on a sim host, then re-run: nothing lost.

The suite's host (kf-node-2, or a scratch lane's) is reset with the kit's seeds
(home_content, docker_content), /home gets more content (tests/storage/host_tool.py
seed-home: 3000 small files, a 96 MiB file, 256 and 64 MiB sparse files, a 3-name
hard-link group, a FIFO, setuid/sticky modes, non-UTF-8 names, old and ns mtimes, a
default ACL, an owner without passwd entry) and a Docker engine that was there before
(images of one and two layers - whiteouts, an opaque directory -, a stopped container,
the seeded volume plus 64 MiB and 2000 files).

Then playbooks/storage.yml and playbooks/engine.yml run with --limit on that host, and each
run is interrupted at the next fault point; the carry-over must resume on the following
run. A fault point is recognised on the host from observable state only (the module's
journal phase in its state file, rsync processes, the module's open files, fstab, the
mount table, daemon.json), where the module is frozen (SIGSTOP), so the point is exact,
and then SIGKILLed - or ansible-playbook is SIGKILLed on the controller while the module
is frozen, and the orphaned module is let go. One host is reused along the chain: each
re-run goes through every phase again, so the next point is always ahead.

At the end: the checksum lists of /home (the new volume, and the old content seen
underneath through a bind mount of /) and of the Docker data (the carried copy and the
untouched old data-root) equal the lists taken before; the images are listed, the old
container runs from the layered image (whiteouts intact), a new container runs; /etc/fstab
has one /home line, by UUID. The points tried and their outcomes are printed (-s).
"""

import json
import os
import queue
import signal
import subprocess
import threading
import time

import pytest

from kunlun_fleet.sim import fleet
from kunlun_fleet.sim.testing import _env, REPO
from storage_helpers import (
    HOST,
    OLD_ENGINE,
    SEED_TIMEOUT,
    TOOL,
    docker_proof,
    docker_trees,
    sh,
    stage,
    stage_cmd,
    tree,
    tree_diff,
    upload_tool,
    wait_seeded,
)

pytestmark = [pytest.mark.sim, pytest.mark.slow]

HOME = dict(
    state="/var/lib/kunlun-fleet/carry-over/home.json",
    lock="/run/lock/kunlun-carry-over-home.lock",
    src="/home",
    target="/mnt/kunlun-carry-home",
)
DOCKER = dict(
    state="/var/lib/kunlun-fleet/carry-over/var-lib-docker.json",
    lock="/run/lock/kunlun-carry-over-var-lib-docker.lock",
    src="/var/lib/docker",
    target="/home/docker",
    daemon_json="/etc/docker/daemon.json",
)

# In the order a run reaches them (each re-run passes through all phases again). One point
# per state a kill can leave: a kill right after the copy and one during verification both
# leave the journal at 'copied' and nothing else changed (verification writes nothing), so
# only the latter is tried; dest mode's copy and verification are the same code as device
# mode's, so the engine's points are those where the engine role's own state differs.
HOME_POINTS = [
    ("during-copy", "module"),  # rsync running and written >8 MiB; rsync left running
    ("during-verify", "module"),  # journal 'copied': the module holds a file of the tree open to hash it
    ("after-verify", "module"),  # journal 'verified': fstab and mounts untouched
    ("switch-fstab", "module-tree"),  # fstab line written, before the mount at /home
    ("switch-mounted", "module"),  # /home mounted, journal not yet 'switched': the re-run finishes the switch
]
DOCKER_POINTS = [
    ("during-copy", "module"),  # the engine stopped, the copy half done, rsync left running in /home/docker
    # a re-run copies only what is missing: any rsync activity counts
    ("during-copy", "controller", "--min-written", "0"),  # the orphaned module then finishes
    ("after-verify", "module"),  # a verified copy (the module reports no change), daemon.json not yet written
    ("config-written", "controller"),  # daemon.json says /home/docker, engine not restarted
]

OUTCOMES = []


def lines_of(stream, q):
    for line in iter(stream.readline, ""):
        q.put(line.rstrip("\n"))
    q.put(None)


def wait_lock_free(lock):
    """An orphaned module (its ansible-playbook was killed) finishes first."""
    sh("timeout 600 flock %s true" % lock)


def run_with_fault(playbook, where, point, victim, log_dir, *extra):
    args = list(extra) + [
        "--point",
        point,
        "--victim",
        victim,
        "--state",
        where["state"],
        "--lock",
        where["lock"],
        "--src",
        where["src"],
        "--target",
        where["target"],
    ]
    if "daemon_json" in where:
        args += ["--daemon-json", where["daemon_json"]]
    watcher = subprocess.Popen(
        fleet.ssh_cmd(HOST, "exec python3 %s watch %s" % (TOOL, " ".join(args))),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    q = queue.Queue()
    threading.Thread(target=lines_of, args=(watcher.stdout, q), daemon=True).start()
    assert q.get(timeout=30) == "READY"
    log = open(os.path.join(log_dir, "%s-%s-%s.log" % (playbook, point, victim)), "w")
    # The linear strategy here: the module then runs as its own process on the host, whose
    # pid the lock file names, so the watcher can freeze it (and, after 'verified', stop it
    # at its next system call: polling missed that window twice in CI).
    pb = subprocess.Popen(
        stage_cmd(playbook),
        cwd=REPO,
        env=dict(_env(), ANSIBLE_STRATEGY="linear"),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    hit = None
    started = time.time()
    try:
        while hit is None:
            try:
                line = q.get(timeout=0.5)
            except queue.Empty:
                line = ""
            if line is None:
                break
            if line.startswith("HIT "):
                hit = json.loads(line[4:])
            elif line.startswith("TIMEOUT"):
                break
            elif pb.poll() is not None and q.empty() and time.time() - started > 1:
                # give a last event a moment to arrive
                try:
                    line = q.get(timeout=2)
                except queue.Empty:
                    line = None
                if line and line.startswith("HIT "):
                    hit = json.loads(line[4:])
                break
        if hit is not None and victim == "controller":
            os.killpg(pb.pid, signal.SIGKILL)
            pb.wait(timeout=60)
            watcher.stdin.write("go\n")
            watcher.stdin.flush()
            assert q.get(timeout=30) == "RESUMED"
        rc = pb.wait(timeout=900)
    finally:
        if watcher.poll() is None:
            watcher.kill()
        watcher.wait(timeout=30)
        log.close()
    outcome = {
        "stage": playbook,
        "point": point,
        "victim": victim,
        "reached": hit is not None,
        "seen": hit,
        "playbook_rc": rc,
    }
    OUTCOMES.append(outcome)
    print("FAULT %s" % json.dumps(outcome, sort_keys=True))
    assert hit is not None, "fault point %s (%s) of %s never reached; see %s" % (point, victim, playbook, log.name)
    assert rc != 0, "the run went on although it was killed at %s" % point
    wait_lock_free(where["lock"])
    return hit


@pytest.fixture
def seeded_host(fresh_host):
    fresh_host(HOST, "home_content=1", "docker_content=1")
    wait_seeded("/var/lib/kunlun-kit/home.manifest", "/var/lib/kunlun-kit/docker.manifest")
    upload_tool()
    sh("python3 %s seed-home" % TOOL)
    sh(
        OLD_ENGINE
        + "\n"
        + r"""
python3 - <<'EOF'
import os, random
rng = random.Random(7)
d = "/var/lib/docker/volumes/kf-seed-data/_data"
with open(d + "/blob.bin", "wb") as fh:
    fh.write(rng.randbytes(64 << 20))
for i in range(2000):
    sub = "%s/small/%02d" % (d, i % 40)
    os.makedirs(sub, exist_ok=True)
    with open("%s/r%04d" % (sub, i), "wb") as fh:
        fh.write(rng.randbytes(rng.randint(0, 2048)))
EOF
""",
        timeout=SEED_TIMEOUT,
    )
    return HOST


def test_sigkill_at_every_phase_then_rerun_loses_nothing(seeded_host, tmp_path):
    t0 = time.time()
    home_before = tree("/home")
    assert len(home_before) > 3000 and "carol/bad-\\xff\\xfe-latin1-\\xe9" in home_before
    assert home_before["carol/vm-disk.img"]["sparse"] and home_before["alice/sparse.img"]["sparse"]
    assert home_before["carol/hl-one"]["nlink"] == 3
    proof_before = docker_proof()
    docker_before = docker_trees("/var/lib/docker")
    assert "kf-seed/layered:1" in proof_before["images"] and "whiteouts-ok" in proof_before["container"]

    for point, victim, *extra in HOME_POINTS:
        hit = run_with_fault("storage.yml", HOME, point, victim, str(tmp_path), *extra)
        if point == "switch-mounted":
            assert hit["src_mounted"], hit
    proc, rec = stage("storage.yml")
    assert proc.returncode == 0, proc.stdout[-5000:]
    print("FAULT storage.yml final run: %s" % rec)

    for point, victim, *extra in DOCKER_POINTS:
        run_with_fault("engine.yml", DOCKER, point, victim, str(tmp_path), *extra)
    proc, rec = stage("engine.yml")
    assert proc.returncode == 0, proc.stdout[-5000:]
    print("FAULT engine.yml final run: %s" % rec)

    # /home: the new volume and, underneath it, the old content: both as before.
    state = sh(
        "findmnt -rn -o SOURCE,FSTYPE /home; awk '$2 == \"/home\"' /etc/fstab; "
        "blkid -p -o value -s UUID /dev/data/home; "
        'python3 -c \'import json; print(json.load(open("/home/.kunlun-carry-over.json"))["phase"])\'; '
        "findmnt -rn /mnt/kunlun-carry-home || echo staging-gone; pgrep -x rsync || echo no-rsync"
    ).stdout
    lines = state.splitlines()
    uuid = lines[2]
    assert lines[0].endswith(" xfs"), state
    assert lines[1] == "UUID=%s /home xfs defaults,nofail,x-systemd.device-timeout=20s 0 0" % uuid, state
    assert lines[3] == "switched" and "staging-gone" in state and "no-rsync" in state, state
    home_after = tree("/home", "newdata", ".kunlun-carry-over.json", "docker")
    assert home_after == home_before, tree_diff(home_before, home_after)
    sh("mkdir -p /mnt/kf-root && (findmnt -rn /mnt/kf-root >/dev/null || mount --bind / /mnt/kf-root)")
    try:
        underneath = tree("/mnt/kf-root/home")
    finally:
        sh("umount /mnt/kf-root && rmdir /mnt/kf-root")
    assert underneath == home_before, tree_diff(home_before, underneath)

    # Docker: the carried layers, image metadata and volume equal the old ones, the old
    # data-root is untouched, and the engine on /home/docker runs the images.
    assert sh("docker info --format '{{.DockerRootDir}} {{.Driver}}'").stdout.strip() == "/home/docker overlay2"
    carried = docker_trees("/home/docker")
    assert carried == docker_before, tree_diff(docker_before, carried)
    old = docker_trees("/var/lib/docker")
    assert old == docker_before, tree_diff(docker_before, old)
    proof = docker_proof()
    assert proof["images"] == proof_before["images"], (proof_before, proof)
    assert "hello from a layer" in proof["container"] and "whiteouts-ok" in proof["container"], proof
    assert proof["run"] == "runs" and proof["volume"] == "/home/docker/volumes/kf-seed-data/_data", proof

    print("FAULT SUMMARY (%d points, %.0f s):" % (len(OUTCOMES), time.time() - t0))
    for o in OUTCOMES:
        print(
            "  %-11s %-15s %-12s reached=%s rc=%s seen=%s"
            % (o["stage"], o["point"], o["victim"], o["reached"], o["playbook_rc"], o["seen"])
        )
    assert sum(1 for o in OUTCOMES if o["stage"] == "storage.yml") == len(HOME_POINTS)
    assert sum(1 for o in OUTCOMES if o["stage"] == "engine.yml") == len(DOCKER_POINTS)
