#!/usr/bin/env python3
"""Fleet-scale figures in one run (prints figures; asserts nothing).

    scripts/bench_fleet.py [-i inventories/sim] [--skip site,noop,image,weights] [--strategies mitogen_linear,linear]

1. site: `site.yml` from bare hosts (every serving host reset with `sim-reset`), then an
   unchanged re-run: wall time of each, the ratio, and the changed count of the re-run
   (must be 0). Run once per strategy named with --site-strategies (default: the one
   ansible.cfg sets), because the strategy is the largest lever on a re-run.
2. noop: a play of 20 `ansible.builtin.ping` tasks on 1, 3, 6 and 12 hosts (as many as the
   inventory has), per strategy: wall time per host-task, i.e. what Ansible itself costs
   per task before any module does work.
3. image: `scripts/bench_image.py distribution`: a copy of the serving image with every
   layer new, to 1, 2 and 3 hosts from the builder's registry and by the old stream
   through the controller, and the bytes the controller sent.
4. weights: `scripts/bench_weights.py`: the model (plus one extra shard, --weights-extra-mib)
   to 1 and 3 hosts, controller only and from peers, and the bytes the controller sent.

Needs .venv, the sim fleet (`kunlun-fleet sim-up 3`, or more hosts for the noop figures),
and for `site` a fleet you can reset. Figures go to stdout and reports/bench-fleet.json.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kunlun_fleet import vault  # noqa: E402


def env(strategy=None):
    e = vault.vault_env(str(INVENTORY), dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
                                             ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"))
    if strategy:
        e["ANSIBLE_STRATEGY"] = strategy
    return e


def playbook(path, *extra, strategy=None, check=True):
    start = time.monotonic()
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(INVENTORY), str(path), *extra],
                          cwd=ROOT, env=env(strategy), capture_output=True, text=True)
    took = time.monotonic() - start
    out = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        sys.stderr.write(out[-5000:])
        raise SystemExit("%s failed (rc %d); the figures above are complete, the rest are not" % (path, proc.returncode))
    return took, out


def recap(out):
    hosts = {}
    for m in re.finditer(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)", out, re.M):
        hosts[m.group(1)] = {"ok": int(m.group(2)), "changed": int(m.group(3)), "skipped": int(m.group(6))}
    return hosts


def _by_number(names):
    return sorted(names, key=lambda h: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", h)])


def serving_hosts():
    data = yaml.safe_load((INVENTORY / "hosts.yml").read_text())["all"]["children"]
    return _by_number(data["xpu_servers"]["hosts"])


def all_hosts():
    """Every host of the inventory (a dedicated gateway host too): a ping costs the same."""
    data = yaml.safe_load((INVENTORY / "hosts.yml").read_text())["all"]["children"]
    return _by_number({h for group in data.values() for h in (group.get("hosts") or {})})


def sim(*args):
    proc = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "kunlun_fleet.sim", *args], cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit("sim %s failed:\n%s" % (" ".join(args), proc.stdout + proc.stderr))


# --------------------------------------------------------------------------- site
def bench_site(strategies, figures):
    for strategy in strategies:
        for host in serving_hosts():
            sim("sim-reset", host)
        first, out1 = playbook(ROOT / "site.yml", strategy=strategy)
        again, out2 = playbook(ROOT / "site.yml", strategy=strategy)
        changed = sum(h["changed"] for h in recap(out2).values())
        tasks = max((h["ok"] + h["skipped"]) for h in recap(out2).values())
        figures["site"][strategy] = {"first_s": round(first, 1), "rerun_s": round(again, 1),
                                     "ratio": round(again / first, 3), "rerun_changed": changed,
                                     "rerun_tasks_busiest_host": tasks}
        print("site.yml [%s]: first run from bare %.1f s, unchanged re-run %.1f s (%.0f%%), "
              "re-run changed=%d, %d tasks on the busiest host"
              % (strategy, first, again, 100 * again / first, changed, tasks))


# --------------------------------------------------------------------------- noop
NOOP_TASKS = 20


def bench_noop(strategies, figures):
    hosts = all_hosts()
    sizes = [n for n in (1, 3, 6, 12) if n <= len(hosts)]
    with tempfile.NamedTemporaryFile("w", suffix=".yml", prefix="bench-noop-",
                                     delete=False) as f:
        yaml.safe_dump([{"name": "no-op", "hosts": "all", "gather_facts": False,
                         "tasks": [{"name": "ping %d" % i, "ansible.builtin.ping": None} for i in range(NOOP_TASKS)]}], f)
        path = f.name
    try:
        for strategy in strategies:
            for n in sizes:
                # One warm-up run: SSH control masters and Mitogen's interpreters exist in
                # a real run after its first task; the figure is the steady per-task cost.
                playbook(path, "--limit", ",".join(hosts[:n]), strategy=strategy)
                took, _ = playbook(path, "--limit", ",".join(hosts[:n]), strategy=strategy)
                per = took / (NOOP_TASKS * n)
                figures["noop"].setdefault(strategy, {})[n] = {"wall_s": round(took, 2), "per_host_task_ms": round(per * 1000, 1),
                                                              "per_task_ms": round(took / NOOP_TASKS * 1000, 1)}
                print("no-op play [%s], %2d host(s) x %d ping tasks: %.1f s, %.0f ms per host-task, %.0f ms per task"
                      % (strategy, n, NOOP_TASKS, took, per * 1000, took / NOOP_TASKS * 1000))
    finally:
        os.unlink(path)


# --------------------------------------------------------------------------- image / weights
def delegate(name, script, *args):
    """Run another bench script of scripts/ and keep its output lines as the figures."""
    proc = subprocess.run([str(ROOT / ".venv/bin/python"), str(ROOT / "scripts" / script), *args],
                          cwd=ROOT, capture_output=True, text=True, env=env())
    print(proc.stdout, end="")
    if proc.returncode != 0:
        print("%s: scripts/%s failed:\n%s" % (name, script, (proc.stdout + proc.stderr)[-3000:]))
    return proc.stdout.splitlines()


def bench_image(figures):
    # A bench copy of the serving image with every layer new, pulled by 1, 2 and 3 hosts
    # from the builder's registry and streamed the old way; the served image is untouched.
    figures["image"] = delegate("image", "bench_image.py", "distribution", "-i", str(INVENTORY))


def bench_weights(figures, extra_mib):
    # model_root in a separate tree (the served model is untouched), to 1 and 3 hosts,
    # controller only and with peers, and the bytes that left the controller.
    figures["weights"] = delegate("weights", "bench_weights.py", "--extra-mib", str(extra_mib))


def main(argv=None):
    global INVENTORY
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-i", "--inventory", default=str(ROOT / "inventories/sim"))
    parser.add_argument("--skip", default="", help="comma-separated: site,noop,image,weights")
    parser.add_argument("--strategies", default="mitogen_linear,linear", help="for the no-op play")
    parser.add_argument("--weights-extra-mib", type=int, default=256,
                        help="one extra shard of this size in the bench model (a bigger model than the sim's)")
    parser.add_argument("--site-strategies", default="mitogen_linear", help="for site.yml first run and re-run")
    args = parser.parse_args(argv)
    INVENTORY = Path(args.inventory).resolve()
    skip = set(filter(None, args.skip.split(",")))
    figures = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "site": {}, "noop": {}}
    print(json.dumps({"started": figures["started"], "inventory": str(INVENTORY), "hosts": len(serving_hosts())}))
    if "noop" not in skip:
        bench_noop(args.strategies.split(","), figures)
    if "site" not in skip:
        bench_site(args.site_strategies.split(","), figures)
    if "image" not in skip:
        bench_image(figures)
    if "weights" not in skip:
        bench_weights(figures, args.weights_extra_mib)
    (ROOT / "reports").mkdir(exist_ok=True)
    (ROOT / "reports" / "bench-fleet.json").write_text(json.dumps(figures, indent=2) + "\n")
    print("figures: reports/bench-fleet.json")


INVENTORY = ROOT / "inventories/sim"

if __name__ == "__main__":
    main()
