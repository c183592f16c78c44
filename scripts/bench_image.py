#!/usr/bin/env python3
"""Benchmark the image stage (prints figures; asserts nothing).

    scripts/bench_image.py fleet [-i inventories/sim] [--runs 1]
        In one run, against a fleet (the sim fleet by default):
        1. first build: the serving tag removed everywhere, then playbooks/image.yml
           (build on the builder + proof + streaming to every other serving host);
        2. unchanged re-run: the same playbook again (must build and send nothing);
        3. distribution to 1 host: the tag removed on one non-builder host, re-run;
        4. distribution to all non-builder hosts: removed on each, re-run.
        Then the raw mechanisms between the builder and one host, same image:
        a. stream:   ssh builder docker save | ssh host docker load   (what the role does)
        b. relay:    docker save to a file, fetch it to the controller, copy it to the host,
                     docker load (Ansible's fetch/copy way; needs disk on all three)
        c. stream with gzip -1 on both ends.

    scripts/bench_image.py local [--image REF]
        Without a fleet: docker save throughput of an image on the sim engine, and gzip -1's
        ratio and throughput on that stream (figures for the mechanism choice when no host
        is free; load rates need a second engine: use `fleet`).

Needs: .venv (ansible), the sim fleet for `fleet` (kunlun-fleet sim-up 3), the base
image in the bundle (python -m kunlun_fleet.sim.bundle build --with-base-image).
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PINS = yaml.safe_load((ROOT / "roles/kunlun_stack/defaults/main.yml").read_text())
SIM_HOME = os.environ.get("KUNLUN_SIM_HOME", "/var/lib/kunlun-sim")


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True,
                          executable="/bin/bash" if isinstance(cmd, str) else None, **kw)


def timed(fn):
    start = time.monotonic()
    result = fn()
    return time.monotonic() - start, result


# ------------------------------------------------------------------------------ fleet
class Fleet:
    def __init__(self, inventory):
        self.inventory = Path(inventory)
        hosts = yaml.safe_load((self.inventory / "hosts.yml").read_text())["all"]["children"]
        self.builder = sorted(hosts["image_builders"]["hosts"])[0]
        self.targets = sorted(hosts["xpu_servers"]["hosts"])
        conn = {}
        # How to reach the hosts; vault.yml (the API key, encrypted) is not needed here.
        for f in sorted((self.inventory / "group_vars" / "all").glob("*.yml")):
            if f.name != "vault.yml":
                conn.update(yaml.safe_load(f.read_text()) or {})
        self.conn = conn

    def host_vars(self, host):
        path = self.inventory / "host_vars" / ("%s.yml" % host)
        data = dict(self.conn)
        if path.exists():
            data.update(yaml.safe_load(path.read_text()) or {})
        return data

    def ssh(self, host):
        hv = self.host_vars(host)
        parts = ["ssh", "-o", "BatchMode=yes"] + shlex.split(hv.get("ansible_ssh_common_args", ""))
        if hv.get("ansible_ssh_private_key_file"):
            parts += ["-i", hv["ansible_ssh_private_key_file"]]
        parts += ["-p", str(hv.get("ansible_port", 22)), "-l", str(hv.get("ansible_user", "root")),
                  str(hv.get("ansible_host", host))]
        return " ".join(shlex.quote(p) for p in parts)

    def run(self, host, command):
        return sh("%s -- %s" % (self.ssh(host), shlex.quote(command)))

    def playbook(self, *extra):
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(self.inventory),
                               str(ROOT / "playbooks/image.yml"), *extra],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
            raise SystemExit("playbooks/image.yml failed; figures above are incomplete")
        return proc.stdout

    def serving_images(self, host):
        out = self.run(host, "docker images --format '{{.Repository}}:{{.Tag}}' kunlun-serving").stdout
        return [line for line in out.split() if line]

    def drop(self, host, keep_builder=True):
        for ref in self.serving_images(host):
            self.run(host, "docker rmi -f %s" % shlex.quote(ref))


def changed_count(output):
    total = 0
    for line in output.splitlines():
        if " changed=" in line and " : ok=" in line:
            total += int(line.split(" changed=")[1].split()[0])
    return total


def fleet(args):
    f = Fleet(args.inventory)
    others = [h for h in f.targets if h != f.builder]
    print("fleet: builder %s, serving hosts %s" % (f.builder, ", ".join(f.targets)))
    for host in f.targets + [f.builder]:
        f.drop(host)
    t, out = timed(f.playbook)
    print("1. first build + proof + distribution to %d host(s): %.1f s (changed tasks: %d)"
          % (len(others), t, changed_count(out)))
    t, out = timed(f.playbook)
    print("2. unchanged re-run: %.1f s (changed tasks: %d)" % (t, changed_count(out)))
    ref = [r for r in f.serving_images(f.builder) if not r.endswith((":current", ":previous"))][0]
    size = int(f.run(f.builder, "docker image inspect --format '{{.Size}}' %s" % ref).stdout.strip() or 0)
    print("   image %s: %.0f MiB" % (ref, size / 2**20))
    if others:
        f.run(others[0], "docker rmi -f %s" % ref)
        t, _ = timed(f.playbook)
        print("3. distribution to 1 host (%s): %.1f s" % (others[0], t))
        for host in others:
            f.run(host, "docker rmi -f %s" % ref)
        t, _ = timed(f.playbook)
        print("4. distribution to %d hosts in parallel: %.1f s" % (len(others), t))
        host = others[0]
        mechanisms = {
            "a. stream (save | ssh | load)": "set -o pipefail; %s -- docker save %s | %s -- docker load"
            % (f.ssh(f.builder), ref, f.ssh(host)),
            "c. stream with gzip -1": "set -o pipefail; %s -- 'docker save %s | gzip -1' | %s -- 'gunzip | docker load'"
            % (f.ssh(f.builder), ref, f.ssh(host)),
        }
        with tempfile.TemporaryDirectory(prefix="bench-image-") as tmp:
            mechanisms["b. relay (save file, fetch, copy, load)"] = (
                "set -e; {b} -- docker save -o /tmp/bench.tar {r}; {b} -- cat /tmp/bench.tar > {t}/x.tar; "
                "{b} -- rm /tmp/bench.tar; {h} -- 'cat > /tmp/bench.tar' < {t}/x.tar; "
                "{h} -- 'docker load -i /tmp/bench.tar && rm /tmp/bench.tar'".format(
                    b=f.ssh(f.builder), h=f.ssh(host), r=ref, t=tmp))
            for name, cmd in mechanisms.items():
                f.run(host, "docker rmi -f %s" % ref)
                t, proc = timed(lambda: sh(cmd))
                state = "ok" if proc.returncode == 0 else "FAILED: %s" % proc.stderr.strip()[-200:]
                print("   %s: %.1f s, %.0f MiB/s (%s)" % (name, t, size / 2**20 / t if t else 0, state))
        t, _ = timed(f.playbook)
        print("   (re-tagged by a final run: %.1f s)" % t)


# ------------------------------------------------------------------------------ local
def local(args):
    env = dict(os.environ, DOCKER_HOST="unix://%s/docker.sock" % SIM_HOME, DOCKER_API_VERSION="1.41")
    ref = args.image or PINS["kunlun_stack_base_image"]
    size = int(subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", ref], env=env,
                              capture_output=True, text=True).stdout.strip() or 0)
    if not size:
        raise SystemExit("%s is not on the sim engine" % ref)
    print("image %s: %.0f MiB (engine %s)" % (ref, size / 2**20, env["DOCKER_HOST"]))
    t, _ = timed(lambda: sh("docker save %s > /dev/null" % shlex.quote(ref), env=env))
    print("docker save to /dev/null: %.1f s, %.0f MiB/s" % (t, size / 2**20 / t))
    t, proc = timed(lambda: sh("set -o pipefail; docker save %s | gzip -1 | wc -c" % shlex.quote(ref), env=env))
    packed = int(proc.stdout.strip() or 0)
    print("docker save | gzip -1: %.1f s, %.0f MiB/s of input, ratio %.2f" % (t, size / 2**20 / t, size / max(packed, 1)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("fleet")
    p.add_argument("-i", "--inventory", default=str(ROOT / "inventories/sim"))
    p = sub.add_parser("local")
    p.add_argument("--image")
    args = parser.parse_args(argv)
    print(json.dumps({"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    (fleet if args.mode == "fleet" else local)(args)


if __name__ == "__main__":
    main()
