"""site.yml end to end on the 3-host sim fleet, then the checks an operator would make."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from kunlun_fleet import vault
from kunlun_fleet.loadgen import Load
from kunlun_fleet.sim.testing import recap, sim, ssh

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.sim


def run_site(*extra):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", "inventories/sim", "site.yml", *extra],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=3600)
    return proc.returncode, proc.stdout + proc.stderr


def keep(name, text):
    """The run's output under reports/ (the recaps quoted in closing notes and reviews)."""
    (ROOT / "reports").mkdir(exist_ok=True)
    (ROOT / "reports" / name).write_text(text)


@pytest.fixture(scope="module")
def first_run(sim_fleet):
    """From bare hosts: reset all three, then the README's demo command."""
    for host in ("kf-node-1", "kf-node-2", "kf-node-3"):
        sim("sim-reset", host)
    proc = subprocess.run([str(ROOT / ".venv/bin/kunlun-fleet"), "demo"], cwd=ROOT, text=True,
                          capture_output=True, timeout=3600, env=dict(os.environ, ANSIBLE_FORCE_COLOR="0"))
    out = proc.stdout + proc.stderr
    keep("e2e-first-run.log", out)
    assert proc.returncode == 0, out[-6000:]
    assert "=== kunlun-fleet demo summary ===" in out and "site.yml: succeeded" in out, out[-3000:]
    return out


def test_first_run_reaches_every_host(first_run):
    hosts = recap(first_run)
    assert {"kf-node-1", "kf-node-2", "kf-node-3"} <= set(hosts), hosts
    assert all(h["failed"] == 0 and h["unreachable"] == 0 for h in hosts.values()), hosts


def test_second_run_changes_nothing(first_run):
    rc, out = run_site()
    keep("e2e-second-run.log", out)
    assert rc == 0, out[-6000:]
    changed = {h: r["changed"] for h, r in recap(out).items() if r["changed"]}
    assert changed == {}, "second run changed: %s\n%s" % (changed, out[-4000:])


def test_check_diff_changes_nothing(first_run):
    rc, out = run_site("--check", "--diff")
    assert rc == 0, out[-6000:]
    changed = {h: r["changed"] for h, r in recap(out).items() if r["changed"]}
    assert changed == {}, "check mode reports changes on a converged fleet: %s\n%s" % (changed, out[-4000:])


# ------------------------------------------------------------------ the fleet endpoint
# The tests below run after the two above, in file order, on the converged fleet; each
# leaves every host serving the current image again.

def ansible_playbook(playbook, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", "inventories/sim", playbook, *extra],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=3600)
    return proc.returncode, proc.stdout + proc.stderr


def endpoint():
    data = json.loads((ROOT / "reports" / "acceptance.json").read_text())
    return data["fleet_url"], data["model"], vault.read_api_key(str(ROOT / "inventories" / "sim"))


def unit_image(index):
    return ssh(index, "cat /etc/kunlun-serve/image").stdout.strip()


def image_id(index, ref):
    return ssh(index, "docker image inspect --format '{{.Id}}' %s" % ref).stdout.strip()


def test_acceptance_lines(first_run):
    lines = (ROOT / "reports" / "acceptance.txt").read_text().splitlines()
    assert [l.split()[1] for l in lines if l.startswith("PASS")][:3] == ["kf-node-1:", "kf-node-2:", "kf-node-3:"], lines
    assert any(l.startswith("PASS fleet endpoint") for l in lines), lines
    # Measured over the whole length asked for (ignore_eos), not up to the first end of sentence.
    assert all(l.endswith(", 128 tokens") for l in lines if l.startswith("PASS kf-node")), lines
    assert not [l for l in lines if l.startswith("FAIL")], lines
    # The demo ends with the lines and how to call the endpoint, never with the key.
    assert "fleet endpoint: http://" in first_run and "PASS fleet endpoint" in first_run
    assert endpoint()[2] not in first_run


def test_openai_client_streams_through_the_gateway(first_run):
    import openai

    url, model, key = endpoint()
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
    assert model in [m.id for m in client.models.list()]
    started = time.monotonic()
    stamps, text = [], ""
    stream = client.chat.completions.create(model=model, stream=True, max_tokens=48,
                                            messages=[{"role": "user", "content": "Say something about the sea."}])
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.monotonic() - started)
            text += chunk.choices[0].delta.content
    assert len(stamps) > 10 and text.strip(), (len(stamps), text)
    # Unbuffered: the first token arrives well before the last one.
    assert stamps[-1] - stamps[0] > 0.5, stamps
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="not-the-key", max_retries=0).models.list()


def started_at(index):
    return ssh(index, "systemctl show -P ActiveEnterTimestampMonotonic kunlun-serve.service").stdout.strip()


def test_rolling_restart_under_load_loses_nothing(first_run):
    before = {i: started_at(i) for i in (1, 2, 3)}
    with Load(*endpoint()) as load:
        time.sleep(5)
        rc, out = ansible_playbook("playbooks/serve.yml", "-e", '{"serve_extra_env": {"KF_E2E_ROLL": "1"}}')
        time.sleep(5)
    assert rc == 0, out[-6000:]
    print("rolling restart under load: %s" % load.summary())
    keep("e2e-rollout-under-load.json", json.dumps(dict(load.summary(), lost=load.failed[:20]), indent=2))
    assert load.failed == [], load.failed[:5]
    assert load.ok > 20, load.ok
    after = {i: started_at(i) for i in (1, 2, 3)}
    assert all(after[i] != before[i] for i in before), (before, after)
    # One host at a time: the canary first, then batches of one (50% of 3 hosts).
    assert out.count("TASK [serve : Restart | (Re)start kunlun-serve]") == 3, out[-3000:]


def test_rollback_playbook_serves_previous_then_current_again(first_run):
    # A "previous" image: the current one with another label (another image ID).
    for i in (1, 2, 3):
        ssh(i, "printf 'FROM kunlun-serving:current\\nLABEL kf.e2e=previous\\n' | docker build -q -t kunlun-serving:previous -")
    previous = {i: image_id(i, "kunlun-serving:previous") for i in (1, 2, 3)}
    current = {i: image_id(i, "kunlun-serving:current") for i in (1, 2, 3)}
    rc, out = ansible_playbook("playbooks/rollback.yml")
    assert rc == 0, out[-6000:]
    assert {i: unit_image(i) for i in (1, 2, 3)} == previous
    url, model, key = endpoint()
    assert ask(url, model, key)
    rc, out = ansible_playbook("playbooks/serve.yml")
    assert rc == 0, out[-6000:]
    assert {i: unit_image(i) for i in (1, 2, 3)} == current


def ask(url, model, key):
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=2, timeout=120)
    return client.completions.create(model=model, prompt="Hi", max_tokens=8).choices[0].text


def test_broken_image_is_rolled_back_and_the_fleet_answers(first_run):
    # A broken image on every host: vllm's API server module is gone, the server never starts.
    for i in (1, 2, 3):
        ssh(i, "printf 'FROM kunlun-serving:current\\nRUN rm -rf /opt/vllm_kunlun/lib/python3*/site-packages/vllm/entrypoints\\n'"
               " | docker build -q -t kunlun-serving:broken -")
    good = unit_image(1)
    others = {i: started_at(i) for i in (2, 3)}
    rc, out = ansible_playbook("playbooks/serve.yml", "-e", "serve_image_tag=broken")
    assert rc != 0, out[-4000:]
    assert "kf-node-1 failed readiness on kunlun-serving:broken" in out, out[-4000:]
    assert "It is back on %s" % good in out, out[-4000:]
    # The canary went back to its image and serves; the rollout stopped before the others.
    assert unit_image(1) == good
    assert ssh(1, "systemctl is-active kunlun-serve.service").stdout.strip() == "active"
    assert {i: started_at(i) for i in (2, 3)} == others
    url, model, key = endpoint()
    assert ask(url, model, key)
    for i in (1, 2, 3):
        ssh(i, "docker image rm kunlun-serving:broken")
