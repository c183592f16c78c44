"""Weights to many hosts on the sim fleet (fleet lane: needs the three hosts, kf-node-1
holding the verified model as the e2e leaves it). Model files are removed only on
kf-node-2 and kf-node-3; every test ends with the three hosts holding the complete,
verified model again (the serving containers use it).

- kf-node-2 and kf-node-3 fetch from kf-node-1's read-only share, never from the bundle;
  with the bound at 1 the second host waits a wave and the share never serves two at once;
  the files' sums are the manifest's; a re-run changes nothing and transfers nothing.
- The source dies mid-transfer (its share killed): with the origin fallback off both
  pullers fail naming the source and keep their partial files; the next run continues
  those files from where they end (Range), not from byte 0.
- The source dies mid-transfer with the fallback on: the pullers finish from the bundle.
- A puller goes off the network mid-transfer (SSH refused, its connections to the share
  reset): the other finishes, verified; the run's stats name the cut host unreachable; its
  partial file is kept, never put in place, and the next run continues it (Range) while
  the finished host transfers nothing."""

import json
import os
import subprocess
import time

import pytest
import yaml

from kunlun_fleet.sim.testing import INVENTORY, REPO, VENV_BIN, _env, refuse_port, ssh

pytestmark = [pytest.mark.sim, pytest.mark.slow]

PINS = yaml.safe_load(open(os.path.join(REPO, "roles/kunlun_stack/defaults/main.yml")))
DIRNAME = PINS["kunlun_stack_model"]["directory"]
MODEL = "/home/newdata/models/" + DIRNAME
PARTIAL = "/home/newdata/models/.%s.partial" % DIRNAME
PULLERS = (2, 3)
PEER_PORT = 8478  # model_peer_port's default
BIG = "tokenizer.json"  # the sim model's largest file (~54 KB): slow enough at 4 KB/s to kill mid-file


def run_model(*extra, background=False):
    argv = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", INVENTORY, "playbooks/model.yml", *extra]
    env = dict(_env(), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    if background:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    return proc.returncode, parse(proc.stdout, proc.stderr)


def parse(stdout, stderr=""):
    """The json callback's document (the timing callbacks print around it)."""
    try:
        start = stdout.index('{\n    "custom_stats"')
        return json.JSONDecoder().raw_decode(stdout[start:])[0]
    except ValueError as exc:
        raise AssertionError(
            "no JSON from ansible-playbook: %s\n%s\n%s" % (exc, stdout[-3000:], stderr[-3000:])
        ) from exc


def results(run, task_part):
    """{host: result} of the tasks whose name contains task_part (last one wins)."""
    found = {}
    for play in run["plays"]:
        for task in play["tasks"]:
            if task_part in task["task"]["name"]:
                for host, res in task["hosts"].items():
                    if not res.get("skipped"):
                        found[host] = res
    return found


def changed(run):
    return dict((h, s["changed"]) for h, s in run["stats"].items())


def remove_model_files():
    for index in PULLERS:
        ssh(index, "rm -rf %s/* %s" % (MODEL, PARTIAL))


def all_verified():
    """Whether every host holds the complete model, every file's sum the manifest's."""
    for index in (1, 2, 3):
        proc = ssh(index, "cd %s && sha256sum --check --strict ../%s.sha256" % (MODEL, DIRNAME), check=False)
        if proc.returncode != 0 or proc.stdout.count(": OK") != 7:
            return False
    return True


def assert_all_verified():
    for index in (1, 2, 3):
        out = ssh(index, "cd %s && sha256sum --check --strict ../%s.sha256" % (MODEL, DIRNAME)).stdout
        assert out.count(": OK") == 7, out


def wait_partial(index, at_least, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = ssh(index, "stat -c %%s %s/%s 2>/dev/null || echo 0" % (PARTIAL, BIG), check=False).stdout.strip()
        if out.isdigit() and int(out) >= at_least:
            return int(out)
        time.sleep(0.3)
    raise AssertionError("kf-node-%d never had %d bytes of %s in its partial directory" % (index, at_least, BIG))


@pytest.fixture()
def restore(sim_fleet):
    """Every host holds the verified model again after the test: each test's last run puts
    it back when the test passes; a run of the stage only where it did not (a failed test)."""
    yield
    if not all_verified():
        rc, run = run_model()
        assert rc == 0, json.dumps(run.get("stats"))
        assert_all_verified()


def test_peers_bound_one_then_rerun_transfers_nothing(restore):
    remove_model_files()
    rc, run = run_model("-e", "model_peer_max_transfers_per_source=1")
    assert rc == 0, json.dumps(run["stats"])
    fetched = results(run, "Fetch the missing files")
    assert sorted(fetched) == ["kf-node-2", "kf-node-3"]
    for host in fetched:
        assert set(f["source"] for f in fetched[host]["fetched"]) == {"kf-node-1"}
        assert len(fetched[host]["fetched"]) == 7 and fetched[host]["failures"] == []
    assert results(run, "Copy the files from the controller's bundle") == {}  # the controller sent no weights
    plan = results(run, "Plan the sources")["kf-node-1"]
    assert [w["pullers"] for w in plan["waves"]] == [["kf-node-2"], ["kf-node-3"]]
    stats = results(run, "Stop the shares")
    assert stats["kf-node-1"]["stats"]["peak"] == 1 and stats["kf-node-1"]["stats"]["max_transfers"] == 1
    assert_all_verified()
    for index in (1, 2, 3):  # every share stopped, also kf-node-2's (a wave-2 source no puller needed)
        assert ssh(index, "systemctl is-active kunlun-model-share.service", check=False).stdout.strip() != "active"
    rc, again = run_model()
    assert rc == 0 and set(changed(again).values()) == {0}, changed(again)
    assert results(again, "Fetch the missing files") == {} and results(again, "Start the read-only share") == {}


def test_dead_source_no_fallback_fails_then_next_run_resumes(restore):
    remove_model_files()
    proc = run_model(
        "-e",
        "model_peer_rate_limit=4000",
        "-e",
        json.dumps({"model_peer_fallback_to_origin": False}),
        "-e",
        "model_peer_timeout=5",
        background=True,
    )
    try:
        for index in PULLERS:
            wait_partial(index, 8000)
        ssh(1, "systemctl kill --signal=KILL kunlun-model-share.service")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    run = parse(out, err)
    assert proc.returncode != 0
    failed = results(run, "No fallback allowed")
    assert sorted(failed) == ["kf-node-2", "kf-node-3"]
    for res in failed.values():
        assert "could not fetch %s from any source: kf-node-1 (http://172.31.250.11:8478/" % BIG in res["msg"], res
        assert "is kept; the next run continues it" in res["msg"]
    kept = dict((i, int(ssh(i, "stat -c %%s %s/%s" % (PARTIAL, BIG)).stdout)) for i in PULLERS)
    for index in PULLERS:
        assert ssh(index, "test -e %s/%s" % (MODEL, BIG), check=False).returncode != 0  # never half in place
    rc, resumed = run_model()
    assert rc == 0, json.dumps(resumed["stats"])
    for host, res in results(resumed, "Fetch the missing files").items():
        big = [f for f in res["fetched"] if f["path"] == BIG][0]
        assert big["resumed_from"] == kept[int(host[-1])] > 0, big
    assert_all_verified()


def test_dead_source_falls_back_to_the_bundle(restore):
    remove_model_files()
    proc = run_model("-e", "model_peer_rate_limit=4000", "-e", "model_peer_timeout=5", background=True)
    try:
        wait_partial(2, 8000)
        ssh(1, "systemctl kill --signal=KILL kunlun-model-share.service")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    run = parse(out, err)
    assert proc.returncode == 0, json.dumps(run["stats"])
    told = results(run, "Every peer source failed")
    assert sorted(told) == ["kf-node-2", "kf-node-3"]
    assert all(
        "kf-node-1 (http://172.31.250.11:8478/" in r["msg"] and "Falling back to the origin" in r["msg"]
        for r in told.values()
    )
    copied = results(run, "Copy the files from the controller's bundle")
    assert sorted(copied) == ["kf-node-2", "kf-node-3"]
    assert_all_verified()
    for index in PULLERS:  # no partial file left behind for files now in place
        assert ssh(index, "find %s -type f | wc -l" % PARTIAL).stdout.strip() == "0"


def wait_closed(index, path, timeout=180):
    """Until no process of sim host ``index`` has ``path`` open (its /proc, read through
    the sim engine, which works while the host's SSH is refused)."""
    from kunlun_fleet.sim import config, engine

    probe = "ls -l /proc/[0-9]*/fd 2>/dev/null | grep -c -F -- %s || true" % path
    deadline = time.monotonic() + timeout
    while True:
        held = engine.docker("exec", config.container_name(index), "sh", "-c", probe).stdout.strip()
        if held == "0":
            return
        assert time.monotonic() < deadline, "%s is still open on kf-node-%d after %d s" % (path, index, timeout)
        time.sleep(1)


def _cut_off(index, on):
    """Take a sim host off the network as a dead link would: SSH refused (Ansible loses
    it) and its own connections to the peers' shares reset (its transfer stops where it is)."""
    refuse_port(index, 22, on)
    refuse_port(index, PEER_PORT, on, chain="OUTPUT")


def test_host_unreachable_mid_distribution_others_finish_next_run_resumes(restore):
    remove_model_files()
    proc = run_model("-e", "model_peer_rate_limit=4000", "-e", "model_peer_timeout=5", background=True)
    cut = False
    try:
        wait_partial(3, 8000)
        _cut_off(3, True)
        cut = True
        out, err = proc.communicate(timeout=300)
        run = parse(out, err)
        assert proc.returncode != 0
        # the report names the host; the other one finished from the peer, verified
        assert run["stats"]["kf-node-3"]["unreachable"] >= 1, run["stats"]
        assert run["stats"]["kf-node-2"]["unreachable"] == 0 and run["stats"]["kf-node-2"]["failures"] == 0, run[
            "stats"
        ]
        fetched = results(run, "Fetch the missing files")
        assert len(fetched["kf-node-2"]["fetched"]) == 7 and fetched["kf-node-2"]["failures"] == []
        out2 = ssh(2, "cd %s && sha256sum --check --strict ../%s.sha256" % (MODEL, DIRNAME)).stdout
        assert out2.count(": OK") == 7, out2
        # the cut host's fetch (left running by the lost connection) gives up after
        # model_peer_timeout, no source being reachable from it: wait until no process on
        # the host holds its partial file open any more (through the sim engine: SSH is cut)
        wait_closed(3, "%s/%s" % (PARTIAL, BIG))
    finally:
        if proc.poll() is None:
            proc.kill()
        if cut:
            _cut_off(3, False)
        from kunlun_fleet.sim import fleet

        fleet.drop_control_masters([3])
    # nothing half-written in place on the cut host; its partial file is kept
    assert ssh(3, "test -e %s/%s" % (MODEL, BIG), check=False).returncode != 0
    kept = int(ssh(3, "stat -c %%s %s/%s" % (PARTIAL, BIG)).stdout)
    assert kept >= 8000
    # the next run resumes it from where it ended; the finished host transfers nothing
    rc, resumed = run_model()
    assert rc == 0, json.dumps(resumed["stats"])
    fetched = results(resumed, "Fetch the missing files")
    assert sorted(fetched) == ["kf-node-3"], sorted(fetched)
    big = [f for f in fetched["kf-node-3"]["fetched"] if f["path"] == BIG][0]
    assert big["resumed_from"] == kept, (big, kept)
    assert_all_verified()
