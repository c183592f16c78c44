#!/usr/bin/env python3
"""Benchmark the carry_over module against a plain `rsync -aHAXS` of the same tree.

Prints figures; asserts nothing. Needs root (loop devices, mkfs.xfs, mount) and rsync,
xfsprogs, acl, attr. Everything lives in a scratch directory under /tmp and is removed
afterwards: two loop-backed XFS volumes of the same size, one seeded source tree.

    sudo .venv/bin/python scripts/bench_carry_over.py --small 20000 --big-mb 1024

The module run is the whole carry-over as a user gets it (ansible-playbook start-up,
scan, room check, rsync, verification of every entry with sha256 of every file, mount
switch, fstab line, journal); its phases are reported from the journal's history. The
plain rsync is the copy alone.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sh(*argv):
    return subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True).stdout


def seed(root, small, small_max, big_mb, sparse_gib, links, rng):
    files = 0
    for i in range(small):
        d = root / ("u%03d/d%03d" % (i % 50, i % 211))
        d.mkdir(parents=True, exist_ok=True)
        (d / ("f%07d" % i)).write_bytes(rng.randbytes(rng.randint(0, small_max)))
        files += 1
    big = root / "big"
    big.mkdir()
    for i in range(big_mb // 16):
        (big / ("blob%04d" % i)).write_bytes(rng.randbytes(16 << 20))
        files += 1
    if sparse_gib:
        with open(root / "big/sparse.img", "wb") as f:
            f.truncate(sparse_gib << 30)
            for k in range(16):
                f.seek(k * ((sparse_gib << 30) // 16))
                f.write(rng.randbytes(1 << 20))
        files += 1
    hl = root / "links"
    hl.mkdir()
    for i in range(links):
        (hl / ("a%d" % i)).write_text(str(i))
        os.link(hl / ("a%d" % i), hl / ("b%d" % i))
        os.symlink("a%d" % i, hl / ("s%d" % i))
    (root / "odd name\nwith newline ü").write_text("odd")
    sh("setfacl", "-m", "u:1234:rw", root / "odd name\nwith newline ü")
    return files + 2 * links + 1


def tree_bytes(root):
    total = 0
    for dp, dn, fn in os.walk(root):
        for n in fn:
            total += os.lstat(os.path.join(dp, n)).st_size
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=20000, help="number of small files (default 20000)")
    ap.add_argument("--small-max", type=int, default=16384, help="max size of a small file in bytes")
    ap.add_argument("--big-mb", type=int, default=512, help="MiB of large (16 MiB) random files")
    ap.add_argument("--sparse-gib", type=int, default=4, help="apparent GiB of one sparse file (16 MiB of data)")
    ap.add_argument("--links", type=int, default=200, help="hard-link pairs (and as many symlinks)")
    ap.add_argument("--volume", default="8G", help="size of each scratch XFS volume")
    ap.add_argument("--drop-caches", action="store_true",
                    help="drop the page cache before each run (affects the whole machine)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (loop devices, mount)")
    for tool in ("rsync", "mkfs.xfs", "losetup", "setfacl"):
        if not shutil.which(tool):
            sys.exit("%s missing: apt-get install rsync xfsprogs acl attr" % tool)

    base = Path(tempfile.mkdtemp(prefix="kf-bench-", dir="/tmp"))
    loops, mounts = [], []
    try:
        src = base / "home"
        src.mkdir()
        t0 = time.time()
        entries = seed(src, args.small, args.small_max, args.big_mb, args.sparse_gib, args.links,
                       random.Random(7))
        nbytes = tree_bytes(src)
        print("seeded %s: %d files, %.1f MiB apparent, in %.1fs"
              % (src, entries, nbytes / 2**20, time.time() - t0))
        devs = []
        for name in ("a.img", "b.img"):
            sh("truncate", "-s", args.volume, base / name)
            dev = sh("losetup", "-f", "--show", base / name).strip()
            loops.append(dev)
            sh("mkfs.xfs", "-q", "-f", "-n", "ftype=1", dev)
            devs.append(dev)

        # plain rsync
        plain = base / "plain"
        plain.mkdir()
        sh("mount", devs[1], plain)
        mounts.append(plain)
        os.sync()  # the seed's dirty pages are not charged to the first run
        if args.drop_caches:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
        t0 = time.time()
        sh("rsync", "-aHAXS", "--numeric-ids", str(src) + "/", str(plain) + "/")
        os.sync()
        t_rsync = time.time() - t0

        # the module, through ansible-playbook as a user runs it
        pb = base / "carry.yml"
        params = dict(src=str(src), device=devs[0], staging=str(base / "stage"), fstab=str(base / "fstab"),
                      state_dir=str(base / "state"))
        (base / "fstab").write_text("")
        pb.write_text(textwrap.dedent("""\
            - name: Bench
              hosts: localhost
              connection: local
              gather_facts: false
              tasks:
                - name: Carry
                  carry_over: %s
            """) % json.dumps(params))
        os.sync()  # the plain copy's dirty pages are not charged to the module
        if args.drop_caches:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
        t0 = time.time()
        p = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", "localhost,", "-e",
                            "ansible_python_interpreter=/usr/bin/python3", str(pb)],
                           cwd=ROOT, env=env, capture_output=True, text=True)
        os.sync()
        t_module = time.time() - t0
        mounts.append(src)
        if p.returncode != 0:
            print(p.stdout[-3000:], p.stderr[-3000:])
            sys.exit("the carry-over failed")
        journal = json.loads((src / ".kunlun-carry-over.json").read_text())
        at = {h["phase"]: h["at"] for h in journal["history"]}

        def ts(s):
            return time.mktime(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ"))

        mib = nbytes / 2**20
        print()
        print("%-34s %9s %12s %10s" % ("", "seconds", "files/s", "MB/s"))
        print("%-34s %9.1f %12.0f %10.1f" % ("plain rsync -aHAXS", t_rsync, entries / t_rsync, mib / t_rsync))
        print("%-34s %9.1f %12.0f %10.1f" % ("carry_over (copy+verify+switch)", t_module, entries / t_module,
                                              mib / t_module))
        if "copied" in at and "verified" in at:
            copy_s = ts(at["copied"]) - ts(at["copying"])
            ver_s = ts(at["verified"]) - ts(at["copied"])
            print("  journal: copy %ds, verify %ds (1 s resolution); the rest is ansible start-up, "
                  "scan and switch" % (copy_s, ver_s))
        print("overhead of carry_over vs plain rsync: x%.2f" % (t_module / t_rsync))
        print("MB/s counts apparent bytes (the sparse file's holes included: %d GiB)" % args.sparse_gib)
    finally:
        if not args.keep:
            for m in reversed(mounts):
                subprocess.run(["umount", "-l", str(m)], capture_output=True)
            for dev in loops:
                subprocess.run(["losetup", "-d", dev], capture_output=True)
            shutil.rmtree(base, ignore_errors=True)
        else:
            print("kept", base)


if __name__ == "__main__":
    main()
