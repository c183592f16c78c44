"""What the upgrade suites on the sim fleet share: the stacks they upgrade to, `kunlun-fleet
upgrade` as an operator runs it, and the readings of the fleet they compare before and after
(tests/upgrade/test_upgrade_sim.py, then tests/upgrade/test_promotion_sim.py, one suite)."""

import json
import os
import subprocess
from pathlib import Path

from kunlun_fleet import vault
from kunlun_fleet.sim.testing import INVENTORY, ssh

ROOT = Path(__file__).resolve().parents[2]
# The sim inventory's stacks (inventories/sim/group_vars/all/sim.yml): the validated one the
# fleet serves, the known-bad 2fda97b, and the candidates that differ below the line.
VALIDATED, KNOWN_BAD = "0.15.1-4885de2", "0.25.1-2fda97b"
CPU_SAMPLER, NUMERICS, GOOD = "0.15.1-b3f9d41", "0.15.1-e5a7c83", "0.15.1-7c1e0a2"
OTHER_XRE = "0.15.1-4885de2-xre27"
HOSTS = ["kf-node-1", "kf-node-2", "kf-node-3"]
# The steps of an upgrade whose canary failed the gate: the image ahead, the canary switched,
# measured, put back; nothing promoted.
ROLLED_BACK_STEPS = [("plan", "ok"), ("image", "ok"), ("canary", "ok"), ("measure", "failed"), ("restore", "ok")]
# The file whose kunlun_stack_stack line a promotion rewrites.
STACK_FILE = Path(INVENTORY) / "group_vars" / "all" / "sim.yml"


def upgrade(*args):
    """`kunlun-fleet upgrade -i INVENTORY ARGS`: (exit code, output, results.json, report dir)."""
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/kunlun-fleet"), "upgrade", "-i", INVENTORY, "--plain", *args],
        cwd=ROOT,
        env=dict(os.environ, ANSIBLE_NOCOLOR="1"),
        text=True,
        capture_output=True,
        timeout=1800,
    )
    out = proc.stdout + proc.stderr
    line = [x for x in out.splitlines() if x.startswith("upgrade ")][-1]
    report = Path(line.rsplit("report: ", 1)[1]).parent
    return proc.returncode, out, json.loads((report / "results.json").read_text()), report


def fleet_state():
    """What serving is on each host: the unit's image, the service's start, the current tag."""
    state = {}
    for i in (1, 2, 3):
        out = ssh(
            i,
            "cat /etc/kunlun-serve/image; systemctl show -P ActiveEnterTimestampMonotonic kunlun-serve.service; "
            "docker image inspect --format '{{.Id}}' kunlun-serving:current",
        ).stdout.split()
        state["kf-node-%d" % i] = out
    return state


def endpoint():
    data = json.loads((ROOT / "reports" / "acceptance.json").read_text())
    return data["fleet_url"], data["model"], vault.read_api_key(INVENTORY)


def ask(url, model, key):
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
    return client.completions.create(model=model, prompt="Hi", max_tokens=8).choices[0].text


def stack_of(index, ref):
    """The stack label of an image on a host (the image role writes it at build)."""
    return ssh(
        index, "docker image inspect --format '{{ index .Config.Labels \"org.kunlun-fleet.stack\" }}' %s" % ref
    ).stdout.strip()


def serving_images():
    """{host: sorted "tag image-ID" lines} of the serving images on each host."""
    return {
        i: sorted(ssh(i, "docker images --no-trunc --format '{{.Tag}} {{.ID}}' kunlun-serving").stdout.splitlines())
        for i in (1, 2, 3)
    }


def image_id(index, ref):
    return ssh(index, "docker image inspect --format '{{.Id}}' %s" % ref, check=False).stdout.strip()


def step_output(results, name):
    """The playbook output of one step of an upgrade (its runner directory under reports/runs)."""
    step = next(s for s in results["steps"] if s["name"] == name)
    run = step["message"].rsplit("run ", 1)[1]
    return (ROOT / "reports" / "runs" / run / "artifacts" / "stdout").read_text()
