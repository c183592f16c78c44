#!/usr/bin/env python3
"""Weights distribution on the sim fleet: wall time to 1 and to 3 hosts, from the controller
only (model_peer_enabled: false) and with peers, and the bytes that left the controller
(the sim bridge's transmit counter on this machine: the weights and Ansible's own traffic).

Not a test (prints figures). Runs playbooks/model.yml with model_root in a separate tree
(/home/newdata/bench-models) so the served model is never touched, from the sim bundle's
model or from a copy of it with one extra shard of --extra-mib MiB (a bigger model):

    .venv/bin/python scripts/bench_weights.py [--extra-mib 256]
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kunlun_fleet.sim.config import NETWORK_BRIDGE  # noqa: E402
from kunlun_fleet.sim.testing import INVENTORY, REPO, VENV_BIN, _env, recap, ssh  # noqa: E402

ROOT = "/home/newdata/bench-models"
SIM_BUNDLE = "/var/lib/kunlun-sim/bundle"


def tx():
    with open("/sys/class/net/%s/statistics/tx_bytes" % NETWORK_BRIDGE) as handle:
        return int(handle.read())


def bundle(extra_mib, directory):
    if not extra_mib:
        return SIM_BUNDLE, None
    tmp = tempfile.mkdtemp(prefix="kf-bench-bundle-")
    src = os.path.join(SIM_BUNDLE, "models", directory)
    dst = os.path.join(tmp, "models", directory)
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "model-extra.safetensors"), "wb") as handle:
        for _ in range(extra_mib):
            handle.write(os.urandom(1024 * 1024))
    lines = []
    for name in sorted(os.listdir(dst)):
        with open(os.path.join(dst, name), "rb") as handle:
            lines.append("%s  %s\n" % (hashlib.sha256(handle.read()).hexdigest(), name))
    with open(os.path.join(tmp, "models", directory + ".sha256"), "w") as handle:
        handle.write("".join(lines))
    return tmp, tmp


def run(bundle_dir, hosts, peers):
    for index in (1, 2, 3):
        ssh(index, "rm -rf %s" % ROOT)
    extra = {"model_root": ROOT, "kunlun_stack_bundle_dir": bundle_dir, "model_peer_enabled": peers}
    argv = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", INVENTORY, "playbooks/model.yml", "-e", json.dumps(extra),
            "--limit", ",".join("kf-node-%d" % i for i in hosts)]
    before, start = tx(), time.time()
    proc = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True)
    wall, sent = time.time() - start, tx() - before
    if proc.returncode != 0:
        raise SystemExit("model.yml failed:\n%s" % proc.stdout[-4000:])
    return wall, sent, recap(proc.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra-mib", type=int, default=0)
    args = parser.parse_args()
    import yaml
    directory = yaml.safe_load(open(os.path.join(REPO, "roles/kunlun_stack/defaults/main.yml")))[
        "kunlun_stack_model"]["directory"]
    bundle_dir, tmp = bundle(args.extra_mib, directory)
    model_dir = os.path.join(bundle_dir, "models", directory)
    size = sum(os.path.getsize(os.path.join(model_dir, n)) for n in os.listdir(model_dir))
    print("model: %d files, %d bytes (%.1f MiB)" % (len(os.listdir(model_dir)), size, size / 1048576.0))
    print("%-8s %-16s %8s %16s %10s" % ("hosts", "source", "wall s", "controller bytes", "x model"))
    try:
        for hosts in ((2,), (1, 2, 3)):
            for peers in (False, True):
                wall, sent, _ = run(bundle_dir, hosts, peers)
                print("%-8d %-16s %8.1f %16d %10.2f" % (len(hosts), "peers" if peers else "controller only", wall,
                                                         sent, sent / float(size)))
        wall, sent, _ = run(bundle_dir, (1, 2, 3), True)
        wall2, sent2, rec = run_again(bundle_dir)
        print("re-run (3 hosts, nothing to do): %.1f s, %d bytes, changed=%s" % (
            wall2, sent2, sorted(set(h["changed"] for h in rec.values()))))
    finally:
        for index in (1, 2, 3):
            ssh(index, "rm -rf %s" % ROOT, check=False)
        if tmp:
            shutil.rmtree(tmp)


def run_again(bundle_dir):
    extra = {"model_root": ROOT, "kunlun_stack_bundle_dir": bundle_dir}
    argv = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", INVENTORY, "playbooks/model.yml", "-e", json.dumps(extra)]
    before, start = tx(), time.time()
    proc = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True)
    return time.time() - start, tx() - before, recap(proc.stdout)


if __name__ == "__main__":
    main()
