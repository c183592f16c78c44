#!/usr/bin/env python3
"""Benchmark the image stage (prints figures; asserts nothing).

    scripts/bench_image.py fleet [-i inventories/sim] [--distribution registry|stream]
        In one run, against a fleet (the sim fleet by default), through the role with
        image_distribution as given (untags every kunlun-serving tag, :current included:
        not on a fleet whose serving others are testing; use `distribution` there):
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

    scripts/bench_image.py distribution [-i inventories/sim] [--image REF]
        Registry vs stream, 1 host vs several, with layers no host holds yet, on a fleet
        that may be serving (nothing it serves or tags is touched). On the builder, a bench
        copy of REF (default kunlun-serving:current) is made whose every layer gets one
        small extra file (same layer count, sizes and compressibility; all-new layer
        digests), then:
        a. push to the fleet registry (once per tag; the role does it on the builder);
        b. registry: parallel `docker pull` from the builder's registry on 1 host, on all
           non-builder hosts, and on every host including the builder (its local copy
           removed first); each pulled image ID checked equal to the builder's;
        c. stream: parallel `ssh builder docker save | ssh host docker load` through the
           controller, on 1 host and on all non-builder hosts.
        The bench image is removed everywhere afterwards and its blobs garbage-collected
        from the registry. Figures for scripts/bench_fleet.py: the lines starting "FIGURE".

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
from kunlun_fleet.bundle import load_pins as stack_pins

ROOT = Path(__file__).resolve().parents[1]
PINS = stack_pins()
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
        if getattr(self, "distribution", None):
            extra = ("-e", "image_distribution=%s" % self.distribution) + tuple(extra)
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
    f.distribution = args.distribution
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


# ------------------------------------------------------------------------------ distribution
# Run on the builder with its python3: a copy of an image whose every layer carries one
# more small file, so that no engine holds any of its layers (same count, sizes and
# compressibility as the original). Prints the new image ID.
FRESH_LAYERS = r"""
import hashlib, io, json, os, shutil, subprocess, sys, tarfile, tempfile
src, dst, nonce, scratch = sys.argv[1:5]
os.makedirs(scratch, exist_ok=True)
work = tempfile.mkdtemp(dir=scratch)
subprocess.run("docker save %s | tar -x -C %s" % (src, work), shell=True, check=True)
manifest = json.load(open(os.path.join(work, "manifest.json")))
m = manifest[0]
cfg = json.load(open(os.path.join(work, m["Config"])))
ids = []
for n, layer in enumerate(m["Layers"]):
    path = os.path.realpath(os.path.join(work, layer))
    with tarfile.open(path, "a") as t:
        data = ("%s %d\n" % (nonce, n)).encode()
        info = tarfile.TarInfo(".kf-bench-%d" % n)
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    ids.append("sha256:" + h.hexdigest())
cfg["rootfs"]["diff_ids"] = ids
raw = json.dumps(cfg).encode()
cid = hashlib.sha256(raw).hexdigest()
os.remove(os.path.join(work, m["Config"]))
open(os.path.join(work, cid + ".json"), "wb").write(raw)
m["Config"] = cid + ".json"
m["RepoTags"] = [dst]
json.dump(manifest, open(os.path.join(work, "manifest.json"), "w"))
if os.path.exists(os.path.join(work, "repositories")):
    os.remove(os.path.join(work, "repositories"))
subprocess.run("tar -C %s -c . | docker load >/dev/null" % work, shell=True, check=True)
shutil.rmtree(work)
print("sha256:" + cid)
"""


def cpu_ticks():
    """(busy, total) jiffies of this machine (the sim hosts share its cores)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def controller_tx():
    """Bytes this machine sent into the sim fleet's bridge (host-to-host traffic is switched
    inside the bridge and not counted): the controller's own share of a distribution."""
    path = Path("/sys/class/net/kfsim0/statistics/tx_bytes")
    return int(path.read_text()) if path.exists() else None


def parallel(jobs):
    """Run {name: shell command} at once; returns (wall seconds, {name: CompletedProcess}).
    Prints the machine's mean busy cores meanwhile: on a shared machine the pulls'
    decompression and extraction compete for the same cores."""
    import concurrent.futures
    busy0, total0 = cpu_ticks()
    tx0 = controller_tx()
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {name: pool.submit(sh, cmd) for name, cmd in jobs.items()}
        results = {name: fut.result() for name, fut in futures.items()}
    wall = time.monotonic() - start
    busy1, total1 = cpu_ticks()
    cores = os.cpu_count() or 1
    tx1 = controller_tx()
    # printed by the caller after its FIGURE line (the figure these conditions belong to)
    parallel.note = "   (meanwhile: machine busy %.2f of %d cores; the controller sent %s into the fleet's network)" % (
        cores * (busy1 - busy0) / max(total1 - total0, 1), cores,
        "%.0f MiB" % ((tx1 - tx0) / 2**20) if tx0 is not None else "? (no kfsim0 bridge)")
    return wall, results


def distribution(args):
    f = Fleet(args.inventory)
    others = [h for h in f.targets if h != f.builder]
    addr = f.host_vars(f.builder).get("ansible_host", f.builder)
    registry = "%s:%d" % (addr, args.port)
    nonce = "%d" % time.time()
    bench = "kunlun-bench:%s" % nonce
    remote = "%s/%s" % (registry, bench)
    print("fleet: builder %s (registry %s), other hosts %s" % (f.builder, registry, ", ".join(others)))
    if f.run(f.builder, "test -s /etc/docker/certs.d/%s/client.key" % registry).returncode != 0:
        raise SystemExit("no fleet registry at %s: run playbooks/image.yml (image_distribution: registry) first" % registry)
    t, proc = timed(lambda: sh("%s -- python3 - %s %s %s /home/kf-bench-scratch" % (
        f.ssh(f.builder), shlex.quote(args.image), bench, nonce), input=FRESH_LAYERS))
    if proc.returncode != 0:
        raise SystemExit("making the bench image failed: %s" % proc.stderr[-2000:])
    bench_id = proc.stdout.strip().splitlines()[-1]
    size = int(f.run(f.builder, "docker image inspect --format '{{.Size}}' %s" % bench).stdout.strip() or 0)
    layers = f.run(f.builder, "docker image inspect --format '{{len .RootFS.Layers}}' %s" % bench).stdout.strip()
    print("bench image %s (%s, %s layers, %.0f MiB, all layers new), made in %.1f s"
          % (bench, bench_id[:19], layers, size / 2**20, t))
    figures = {}
    try:
        t, proc = timed(lambda: f.run(f.builder, "docker tag %s %s && docker push %s >/dev/null && docker rmi %s >/dev/null"
                                      % (bench, remote, remote, remote)))
        if proc.returncode != 0:
            raise SystemExit("push failed: %s" % proc.stderr[-2000:])
        figures["registry_push_s"] = t
        print("FIGURE registry push (builder -> its registry, once per tag): %.1f s" % t)

        def drop(hosts, name):
            for host in hosts:
                f.run(host, "docker rmi %s %s >/dev/null 2>&1; true" % (name, remote))

        def ids(hosts, name):
            return {h: f.run(h, "docker image inspect --format '{{.Id}}' %s" % name).stdout.strip() for h in hosts}

        sets = [("1 host", others[:1]), ("%d hosts" % len(others), others)]
        for label, hosts in sets:
            if len(hosts) < 1 or (label != "1 host" and len(hosts) == 1):
                continue
            drop(hosts, bench)
            t, res = parallel({h: "%s -- docker pull -q %s" % (f.ssh(h), remote) for h in hosts})
            bad = {h: r.stderr.strip()[-300:] for h, r in res.items() if r.returncode != 0}
            same = set(ids(hosts, remote).values()) == {bench_id}
            figures["registry_%d" % len(hosts)] = t
            print("FIGURE registry pull to %s (%s): %.1f s, %.0f MiB/s per host; image IDs equal the builder's: %s%s"
                  % (label, ", ".join(hosts), t, size / 2**20 / t, same, " FAILED %s" % bad if bad else ""))
            print(parallel.note)
            drop(hosts, bench)
            t, res = parallel({h: "set -o pipefail; %s -- docker save %s | %s -- docker load -q"
                               % (f.ssh(f.builder), bench, f.ssh(h)) for h in hosts})
            bad = {h: r.stderr.strip()[-300:] for h, r in res.items() if r.returncode != 0}
            same = set(ids(hosts, bench).values()) == {bench_id}
            figures["stream_%d" % len(hosts)] = t
            print("FIGURE stream to %s (%s): %.1f s, %.0f MiB/s per host; image IDs equal the builder's: %s%s"
                  % (label, ", ".join(hosts), t, size / 2**20 / t, same, " FAILED %s" % bad if bad else ""))
            print(parallel.note)
            drop(hosts, bench)
        # a pull cut short (the client killed part-way), then resumed: the layers already
        # on the engine are not fetched again ("Already exists")
        host = others[0]
        drop([host], bench)
        cut_after = figures["registry_1"] * 0.5
        try:
            sh("%s -- docker pull %s" % (f.ssh(host), remote), timeout=cut_after)
        except subprocess.TimeoutExpired:
            pass
        have = f.run(host, "docker image inspect %s >/dev/null 2>&1 && echo whole || echo partial").stdout.strip()
        t, proc = timed(lambda: sh("%s -- docker pull %s" % (f.ssh(host), remote)))
        reused = proc.stdout.count("Already exists")
        figures["registry_resume_s"] = t
        print("FIGURE pull cut after %.1f s on %s (image %s), resumed: %.1f s, %s of %s layers reused (Already exists); "
              "image ID equals the builder's: %s" % (cut_after, host, have, t, reused, layers,
                                                     ids([host], remote)[host] == bench_id))
        drop([host], bench)
        every = [f.builder] + others
        drop(every, bench)
        t, res = parallel({h: "%s -- docker pull -q %s" % (f.ssh(h), remote) for h in every})
        bad = {h: r.stderr.strip()[-300:] for h, r in res.items() if r.returncode != 0}
        same = set(ids(every, remote).values()) == {bench_id}
        figures["registry_%d" % len(every)] = t
        print("FIGURE registry pull to %d hosts, builder included (%s): %.1f s; image IDs equal: %s%s"
              % (len(every), ", ".join(every), t, same, " FAILED %s" % bad if bad else ""))
        print(parallel.note)
        one = figures.get("registry_1")
        if one:
            for key in sorted(figures):
                if key.startswith(("registry_", "stream_")) and key != "registry_push_s":
                    print("   %s / registry_1 = %.2f" % (key, figures[key] / one))
        print(json.dumps({"figures": figures, "image_mib": round(size / 2**20), "layers": layers}))
    finally:
        drop_all = [f.builder] + others
        for host in drop_all:
            f.run(host, "docker rmi %s %s >/dev/null 2>&1; true" % (bench, remote))
        # the bench tag out of the registry, its blobs garbage-collected (nothing else is pushed meanwhile)
        f.run(f.builder, "rm -rf /home/docker-registry/docker/registry/v2/repositories/kunlun-bench /home/kf-bench-scratch; "
              "runuser -u docker-registry -- docker-registry garbage-collect /etc/kunlun-registry/config.yml >/dev/null")


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
    p.add_argument("--distribution", choices=["registry", "stream"], default="registry")
    p = sub.add_parser("distribution")
    p.add_argument("-i", "--inventory", default=str(ROOT / "inventories/sim"))
    p.add_argument("--image", default="kunlun-serving:current")
    p.add_argument("--port", type=int, default=5000)
    p = sub.add_parser("local")
    p.add_argument("--image")
    args = parser.parse_args(argv)
    print(json.dumps({"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    {"fleet": fleet, "distribution": distribution, "local": local}[args.mode](args)


if __name__ == "__main__":
    main()
