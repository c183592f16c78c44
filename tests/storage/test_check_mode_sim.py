"""--check --diff of storage + engine on a fresh host with content changes nothing, and
announces the changes the real run then makes. That a second real run on such a host
changes nothing is the idempotence step of molecule/storage (home_content) and of
molecule/engine (an old data-root with content carried), not repeated here.

The suite's host (kf-node-2, or a scratch lane's) is reset with home_content and
docker_content. Snapshot (pvs/vgs/lvs, disks, findmnt, /etc/fstab, daemon.json, a
checksum list of /home, a listing of /var/lib/docker, images, units, packages) before and
after the check run must be identical. Per-task results come from the ansible.posix.json
callback.

Then, on the host the real run leaves (the volume mounted, the engine running on
/home/docker), the engine stage's refusals of bad input: each refused before any change,
with a message naming the item and the fix (the snapshot before == after)."""

import json

import pytest

from kunlun_fleet.sim.testing import sim
from storage_helpers import (
    HOST,
    NAME,
    SEED_TIMEOUT,
    refused_run as refused,
    sh,
    snapshot,
    stage,
    upload_tool,
    wait_seeded,
)

pytestmark = [pytest.mark.sim, pytest.mark.slow]

JSON = {"ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1"}

# Tasks the check run cannot announce, each with the reason check mode cannot remove.
# Handlers are not listed: a handler that the check run NOTIFIED counts as announced (its
# notifying task reported the change; the handler itself may be skipped in check mode,
# e.g. the engine's restart before its package is installed, or update-ca-certificates,
# a command). (The JSON callback names tasks "<role> : <name>".)
UNPREDICTABLE = {}


def changed_tasks(proc):
    """(changed task names, failed task names, names of the handlers that ran or were
    skipped: every handler in the results was notified, names of the tasks that ran and
    never reported a change)."""
    start = proc.stdout.find("{")
    assert start >= 0, proc.stdout[-3000:]
    result, _ = json.JSONDecoder().raw_decode(proc.stdout[start:])
    changed, failed, notified, ran = set(), set(), set(), set()
    for play in result["plays"]:
        for task in play["tasks"]:
            res = task["hosts"].get(NAME)
            if res is None:
                continue
            if res.get("changed"):
                changed.add(task["task"]["name"])
            if res.get("failed"):
                failed.add(task["task"]["name"])
            if not res.get("skipped"):
                ran.add(task["task"]["name"])
            if "/handlers/" in task["task"]["path"]:
                notified.add(task["task"]["name"])
    return changed, failed, notified, ran - changed


@pytest.fixture(scope="module")
def checked_then_run(_hosts_to_reset):
    """The host with content: storage and engine in --check --diff between two snapshots,
    then both for real (per-task results of each run)."""
    sim("sim-reset", str(HOST), "--fault", "home_content=1", "--fault", "docker_content=1")
    _hosts_to_reset.add(HOST)
    wait_seeded("/var/lib/kunlun-kit/home.manifest", "/var/lib/kunlun-kit/docker.manifest")
    upload_tool()
    found = {"before": snapshot(), "check": {}, "real": {}}
    for name in ("storage.yml", "engine.yml"):
        found["check"][name] = stage(name, "--check", "--diff", env=JSON)[0]
    found["after"] = snapshot()
    for name in ("storage.yml", "engine.yml"):
        found["real"][name] = stage(name, env=JSON)[0]
    return found


def test_check_diff_changes_nothing_and_predicts_the_real_run(checked_then_run):
    predicted, handlers = set(), set()
    for name, proc in checked_then_run["check"].items():
        changed, failed, notified, _ = changed_tasks(proc)
        assert proc.returncode == 0 and not failed, (name, failed, proc.stdout[-3000:])
        assert changed, "check mode of %s announced no change on a fresh host" % name
        predicted |= changed | notified
        handlers |= notified
    before, after = checked_then_run["before"], checked_then_run["after"]
    assert after == before, "check mode changed the host:\n%s" % "\n".join(
        sorted(set(before.splitlines()) ^ set(after.splitlines()))
    )

    made, unchanged = set(), set()
    for name, proc in checked_then_run["real"].items():
        changed, failed, _, ran_unchanged = changed_tasks(proc)
        assert proc.returncode == 0 and not failed, (name, failed, proc.stdout[-3000:])
        made |= changed
        unchanged |= ran_unchanged
    print("check mode announced: %s" % sorted(predicted))
    print("real run changed:     %s" % sorted(made))
    unannounced = made - predicted - set(UNPREDICTABLE)
    assert not unannounced, "the real run changed tasks check mode did not announce: %s" % sorted(unannounced)
    # the carry-overs, the volume and the engine's configuration are among them
    for task in (
        "storage : Build | Carry the content of the mount point onto the volume, verify, then mount it there",
        "storage : Build | Volume group on the data disks (PVs are only ever added)",
        "engine : Engine | Copy the old data-root to the new one and verify it (the old one is kept)",
        "engine : Engine | daemon.json with the project's keys merged in (the operator's keys kept)",
    ):
        assert task in predicted and task in made, task
    # What check mode announced and the real run did not change may only be what a real run
    # never runs as such (check mode's own "(check mode)" stand-ins) or a handler (notified by
    # a task that changed; what the handler reports itself, a daemon reload no change, is not
    # an announcement): a task that ran for real and found nothing to change, but was
    # announced as a change, is a lie.
    over = predicted - made
    print("announced but not changed: %s" % sorted(over))
    lies = (over - handlers) & (unchanged - made)
    assert not lies, "check mode announced changes the real run found already made: %s" % sorted(lies)


def test_engine_refuses_outside_root_and_invalid_daemon_json(checked_then_run):
    for name, proc in checked_then_run["real"].items():
        assert proc.returncode == 0, "the real run of %s failed: the host is not converged\n%s" % (
            name,
            proc.stdout[-3000:],
        )
    # 5. a data-root outside the data volume (the first check, before anything else)
    for root in ("/srv/docker", "/home", "/home2/docker"):
        refused(
            "engine.yml",
            ["engine_data_root %s is outside the data volume /home" % root, "Fix"],
            "-e",
            "engine_data_root=%s" % root,
        )

    # 6. an invalid daemon.json is refused, not overwritten (byte-identical)
    bad = '{\n  "registry-mirrors": ["https://mirror.example"],\n  "debug": true,\n'
    sh("printf '%%s' '%s' > /etc/docker/daemon.json" % bad)
    digest = sh("sha256sum /etc/docker/daemon.json").stdout
    msg = refused(
        "engine.yml", ["/etc/docker/daemon.json is not valid JSON", "refusing to overwrite it", "python3 -m json.tool"]
    )
    assert sh("sha256sum /etc/docker/daemon.json").stdout == digest
    assert sh("cat /etc/docker/daemon.json").stdout == bad, msg[-2000:]
    sh("printf '%s' '[1, 2]' > /etc/docker/daemon.json")
    refused("engine.yml", ["valid JSON but not an object"])

    # 7. a data-root in use whose images are on another storage driver (vfs) than the one the
    # role configures (overlay2): moving it would lose them from view; refused, whether the
    # running engine or only the data-root on disk tells the driver. The engine the real run
    # installed, restarted on vfs with the default data-root (/var/lib/docker, which holds the
    # kit's volume, carried and left as it was).
    sh("printf '%s' '{\"storage-driver\": \"vfs\"}' > /etc/docker/daemon.json")
    driver = sh(
        "systemctl restart docker.service && "
        "rm -rf /tmp/kf-img && mkdir -p /tmp/kf-img && echo hi > /tmp/kf-img/hello && "
        "tar -C /tmp/kf-img -c . | docker import - kf-seed/tiny:1 >/dev/null && "
        "docker info --format '{{.Driver}} {{.DockerRootDir}}'",
        timeout=SEED_TIMEOUT,
    ).stdout.split()
    assert driver == ["vfs", "/var/lib/docker"], driver
    refused(
        "engine.yml",
        [
            "data-root /var/lib/docker holds images or containers of the storage driver vfs",
            "the running engine uses vfs",
            "configured for overlay2",
            "storage-driver",
            "docker save",
        ],
    )
    sh("systemctl stop docker.socket docker.service && printf '%s' '{}' > /etc/docker/daemon.json")
    refused(
        "engine.yml",
        ["data-root /var/lib/docker holds images or containers of the storage driver vfs", "configured for overlay2"],
    )
