"""--check --diff of storage + engine on a fresh host with content changes nothing, and
announces the changes the real run then makes; the second real run changes nothing.

The suite's host (kf-node-2, or a scratch lane's) is reset with home_content and
docker_content. Snapshot (pvs/vgs/lvs, disks, findmnt, /etc/fstab, daemon.json, a
checksum list of /home, a listing of /var/lib/docker, images, units, packages) before and
after the check run must be identical. Per-task results come from the ansible.posix.json
callback."""

import json

import pytest

from storage_helpers import HOST, NAME, snapshot, stage, upload_tool, wait_seeded

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


def test_check_diff_changes_nothing_and_predicts_the_real_run(fresh_host):
    fresh_host(HOST, "home_content=1", "docker_content=1")
    wait_seeded("/var/lib/kunlun-kit/home.manifest", "/var/lib/kunlun-kit/docker.manifest")
    upload_tool()
    before = snapshot()
    predicted, handlers = set(), set()
    for name in ("storage.yml", "engine.yml"):
        proc, rec = stage(name, "--check", "--diff", env=JSON)
        changed, failed, notified, _ = changed_tasks(proc)
        assert proc.returncode == 0 and not failed, (name, failed, proc.stdout[-3000:])
        assert changed, "check mode of %s announced no change on a fresh host" % name
        predicted |= changed | notified
        handlers |= notified
    after = snapshot()
    assert after == before, "check mode changed the host:\n%s" % "\n".join(
        sorted(set(before.splitlines()) ^ set(after.splitlines()))
    )

    made, unchanged = set(), set()
    for name in ("storage.yml", "engine.yml"):
        proc, rec = stage(name, env=JSON)
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

    for name in ("storage.yml", "engine.yml"):
        proc, rec = stage(name)
        assert proc.returncode == 0 and rec["changed"] == 0, (name, rec, proc.stdout[-3000:])
