"""The image stage's distribution on the three sim hosts the e2e left converged and serving
(fleet lane, beside molecule-image; it needs the whole fleet, not one host):

- the source dies as both hosts pull (the builder's registry port refused, open
  connections reset): both fail naming the builder, its registry and the fix, nothing is
  tagged and :current is untouched; then, the registry back, a host cut off (SSH
  refused) while the image is distributed: the other host finishes with the builder's
  image ID, the recap names the cut host as unreachable, and the next run gives it the
  tag (only to it) with the builder's image ID;
- image_distribution: stream still works (the builder cannot run a registry).

Nothing serving is stopped: only the tag of the build (kunlun-serving:<hash>) is removed
from the pulling hosts' engines, never :current, which every host keeps with the image it
serves (the running container holds its image by ID).
"""

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from kunlun_fleet.sim.testing import recap, refuse_port

pytestmark = [pytest.mark.sim, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "inventories" / "sim"
BUILDER, PULLERS = 1, (2, 3)
REGISTRY = "172.31.250.11:5000"


def ssh(index, command, check=True):
    from kunlun_fleet.sim import fleet

    proc = subprocess.run(fleet.ssh_cmd(index, command), capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, "kf-node-%d: %r failed: %s%s" % (index, command, proc.stdout, proc.stderr)
    return proc.stdout.strip()


def env():
    from kunlun_fleet.cli import ansible_env

    return dict(ansible_env(str(INVENTORY)), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")


def play_cmd(*extra):
    return [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(INVENTORY), str(ROOT / "playbooks/image.yml"), *extra]


def play(*extra):
    proc = subprocess.run(play_cmd(*extra), cwd=ROOT, env=env(), capture_output=True, text=True, timeout=1800)
    return proc.returncode, proc.stdout + proc.stderr


def image_ids(index):
    """{tag: image ID} of kunlun-serving on a host."""
    out = ssh(index, "docker images --no-trunc --format '{{.Tag}} {{.ID}}' kunlun-serving")
    return dict(line.split() for line in out.splitlines() if line.strip())


def build_tag(ids):
    """The inputs' hash (16 hex digits); current, previous and the stack's name are moving tags."""
    tags = [t for t in ids if re.fullmatch(r"[0-9a-f]{16}", t)]
    assert len(tags) == 1, ids
    return tags[0]


def distributed():
    """Whether every host holds the builder's one build tag, with the builder's image ID,
    beside its :current: the fleet as the image stage leaves it."""
    ids = image_ids(BUILDER)
    tags = [t for t in ids if re.fullmatch(r"[0-9a-f]{16}", t)]
    hosts = [ids] + [image_ids(i) for i in PULLERS]
    return len(tags) == 1 and all(h.get(tags[0]) == ids[tags[0]] and "current" in h for h in hosts)


@pytest.fixture(scope="module")
def converged(sim_fleet):
    """The fleet as the image stage leaves it (registry distribution); the builder's tag and ID.
    molecule/image's converge, just before in the fleet lane, leaves it so: the stage runs
    here only when the fleet is not (this file run alone), and the tests' own runs below prove
    the stage."""
    if not distributed():
        rc, out = play()
        assert rc == 0, out[-6000:]
    ids = image_ids(BUILDER)
    tag = build_tag(ids)
    serving = {i: image_ids(i)["current"] for i in (1, 2, 3)}
    yield tag, ids[tag]
    # every host ends holding :current with the image it held before (and the build tag)
    for i in (1, 2, 3):
        assert image_ids(i).get("current") == serving[i], "kf-node-%d lost its :current tag" % i


def registry_log_since(stamp):
    return ssh(BUILDER, "journalctl -u kunlun-registry --since '%s' --no-pager -o cat" % stamp)


# The registry's binding and its refusal of a client without the fleet's certificate:
# molecule/image's verify. An unchanged re-run that pushes and pulls nothing (the registry's
# log read): the e2e's second run (tests/e2e/test_site.py::test_second_run_changes_nothing).


def test_source_dies_as_hosts_pull_then_a_host_drops_mid_distribution_each_resumed(converged, tmp_path):
    """Two faults, each resumed by the next run (one story, to spend one distribution less):
    the builder's registry dies as both hosts pull from it, then kf-node-3 is cut off while
    the image is distributed again."""
    tag, builder_id = converged
    serving = {i: image_ids(i)["current"] for i in PULLERS}
    for i in PULLERS:
        ssh(i, "docker rmi kunlun-serving:%s" % tag)

    # 1. The source is gone as the hosts pull (its port refused, open connections reset):
    # both pullers fail, naming the builder, its registry and the fix; nothing is tagged,
    # and :current (what they serve) is untouched. (A serving host keeps the image's
    # layers for its container, so its pull fetches the manifest, not blobs: what a dead
    # source does to a half-fetched layer is the engine's part, which keeps none.)
    log = tmp_path / "image-source-dies.log"
    dead = False
    try:
        with open(log, "w") as sink:
            proc = subprocess.Popen(
                play_cmd(),
                cwd=ROOT,
                env=dict(env(), ANSIBLE_CALLBACK_RESULT_FORMAT="json"),
                stdout=sink,
                stderr=subprocess.STDOUT,
                text=True,
            )
            deadline = time.monotonic() + 600
            # the hosts are about to pull: the builder pushed (or found) its tag
            while "TASK [image : Distribute | Does this host hold the tag?]" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-6000:]
                time.sleep(0.1)
            refuse_port(BUILDER, 5000, True)
            dead = True
            proc.wait(timeout=1800)
        out = log.read_text()
        hosts = recap(out)
        assert proc.returncode != 0, out[-6000:]
        # The builder failed nothing of its own; the run then stopped for every host after the
        # stage (two hosts left out, over the 3-host fleet's failure budget of none), a
        # controller task run for kf-node-1 (docs/failures.md).
        assert "fatal: [kf-node-1]:" not in out and hosts["kf-node-1"]["unreachable"] == 0, hosts
        assert "after image: 2 host(s) left out (kf-node-2, kf-node-3), budget 0 of 3 serving hosts" in out, out[-6000:]
        for i in PULLERS:
            name = "kf-node-%d" % i
            assert hosts[name]["failed"] == 1 and hosts[name]["unreachable"] == 0, hosts
            after = out.split("TASK [image : Distribute | The pull failed", 1)[1]
            at = after.find("fatal: [%s]: FAILED! => " % name)
            assert at >= 0, out[-6000:]
            rest = after[at:].split("=> ", 1)[1]
            text = json.JSONDecoder().raw_decode(rest)[0]["msg"]
            assert text.startswith(
                "%s could not pull %s/kunlun-serving:%s from the registry on the builder kf-node-1:"
                % (name, REGISTRY, tag)
            ), text
            assert "Fix: make kf-node-1 and its registry (kunlun-registry.service on %s) reachable" % REGISTRY in text
            ids = image_ids(i)
            assert tag not in ids and ids.get("current") == serving[i], ids
            refs = ssh(i, "docker images --format '{{.Repository}}:{{.Tag}}'")
            assert REGISTRY not in refs, refs
    finally:
        if dead:
            refuse_port(BUILDER, 5000, False)

    # 2. The registry is back; kf-node-3 is cut off while the image is distributed.
    log = tmp_path / "image-cut.log"
    cut = False
    try:
        with open(log, "w") as sink:
            proc = subprocess.Popen(play_cmd(), cwd=ROOT, env=env(), stdout=sink, stderr=subprocess.STDOUT, text=True)
            # the distribution is under way: the builder has pushed or found its tag
            deadline = time.monotonic() + 600
            while "TASK [image : Registry trust |" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-6000:]
                time.sleep(0.2)
            refuse_port(3, 22, True)
            cut = True
            proc.wait(timeout=1800)
        out = log.read_text()
        hosts = recap(out)
        assert proc.returncode != 0, out[-6000:]
        assert hosts["kf-node-3"]["unreachable"] == 1, hosts
        assert hosts["kf-node-2"]["unreachable"] == 0 and hosts["kf-node-2"]["failed"] == 0, hosts
        assert "UNREACHABLE" in out and "kf-node-3" in out.split("PLAY RECAP")[-1]
    finally:
        if cut:
            refuse_port(3, 22, False)
        from kunlun_fleet.sim import fleet

        fleet.drop_control_masters([3])
    # the other host finished (resuming the pull the dead source broke): the builder's
    # image under the build tag and :current
    ids2 = image_ids(2)
    assert ids2.get(tag) == builder_id and ids2.get("current") == builder_id, ids2
    assert tag not in image_ids(3)
    # 3. The next run resumes only what is missing: kf-node-3 pulls, nobody else changes
    stamp = ssh(BUILDER, "date '+%Y-%m-%d %H:%M:%S'")
    time.sleep(1)
    rc, out = play()
    assert rc == 0, out[-6000:]
    hosts = recap(out)
    assert (
        hosts["kf-node-3"]["changed"] > 0 and hosts["kf-node-2"]["changed"] == 0 and hosts["kf-node-1"]["changed"] == 0
    ), hosts
    assert re.search(r"changed: \[kf-node-3\]", out.split("Distribute | Pull the image")[1].split("TASK [")[0])
    assert image_ids(3).get(tag) == builder_id
    # the engines' pulls (user agent docker/...; the builder's read-only look is Python's)
    pulls = re.findall(
        r'^(\S+) - - \[[^]]*\] "(?:GET|HEAD) /v2/kunlun-serving/manifests/[^" ]+ [^"]*" \d+ \d+ "[^"]*" "docker/',
        registry_log_since(stamp),
        re.M,
    )
    assert pulls and set(pulls) == {"172.31.250.13"}, pulls


def test_stream_option_still_distributes(converged):
    tag, builder_id = converged
    ssh(2, "docker rmi kunlun-serving:%s" % tag)
    rc, out = play("-e", "image_distribution=stream")
    assert rc == 0, out[-6000:]
    assert re.search(
        r"changed: \[kf-node-2 -> localhost\]", out.split("Distribute | Stream the image")[1].split("TASK [")[0]
    )
    assert image_ids(2).get(tag) == builder_id
    hosts = recap(out)
    assert hosts["kf-node-3"]["changed"] == 0 and hosts["kf-node-1"]["changed"] == 0, hosts
