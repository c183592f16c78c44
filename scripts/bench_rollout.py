#!/usr/bin/env python3
"""Benchmark the serve rollout on a served fleet (prints figures; asserts nothing).

    scripts/bench_rollout.py [-i inventories/sim] [--clients 8]

In one run, against a fleet that site.yml has served (the sim fleet by default):
  1. unchanged rollout: playbooks/serve.yml on the converged fleet (wall time, changed);
  2. rolling restart under load: serve.yml with a changed environment, so every host is
     drained, restarted, gated on readiness and put back, while clients keep sending
     requests through the fleet endpoint (wall time, requests ok and lost, output tok/s);
  3. the same environment rolled back out, under the same load.
The endpoint, model and key come from reports/acceptance.json and the inventory's vault.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kunlun_fleet import vault  # noqa: E402 (path set just above)
from kunlun_fleet.loadgen import Load  # noqa: E402


def recap_changed(text):
    import re

    return sum(int(m) for m in re.findall(r"changed=(\d+)", text.split("PLAY RECAP")[-1].split("TASKS RECAP")[0]))


def serve(inventory, *extra):
    env = vault.vault_env(inventory, dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1"))
    started = time.monotonic()
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", inventory, "playbooks/serve.yml", *extra],
                          cwd=ROOT, env=env, text=True, capture_output=True)
    return proc.returncode, time.monotonic() - started, recap_changed(proc.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--inventory", default=str(ROOT / "inventories/sim"))
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    report = json.loads((ROOT / "reports/acceptance.json").read_text())
    endpoint = (report["fleet_url"], report["model"], vault.read_api_key(args.inventory))

    rc, wall, changed = serve(args.inventory)
    print("unchanged rollout:          rc=%d  wall %.1f s  changed=%d" % (rc, wall, changed))
    for label, env in (("rolling restart under load", '{"serve_extra_env": {"KF_BENCH_ROLL": "1"}}'),
                       ("rolled back out under load", '{"serve_extra_env": {}}')):
        with Load(*endpoint, clients=args.clients) as load:
            time.sleep(3)
            rc, wall, changed = serve(args.inventory, "-e", env)
            time.sleep(3)
        s = load.summary()
        print("%-27s rc=%d  wall %.1f s  changed=%d  requests ok %d, lost %d  output %.1f tok/s over %.1f s"
              % (label + ":", rc, wall, changed, s["requests_ok"], s["requests_failed"], s["output_tok_s"], s["wall_s"]))
        for failure in load.failed[:5]:
            print("   lost: %s" % failure)


if __name__ == "__main__":
    main()
