#!/usr/bin/env python3
"""Print how long the simulated fleet takes to come up, and Ansible's reach over it.

  cold     `sim-up 3` after `sim-down --purge`: no image, no debootstrap cache, no engine
           data (machine packages stay installed)
  warm     `sim-up 3` after `sim-down`: cached image, engine stopped, no hosts
  verify   `sim-up 3` with 3 healthy hosts (checks only)
  ping     `ansible -i inventories/sim all -m ping` over the 3 hosts
  facts    `ansible -i inventories/sim all -m setup` (full fact gathering)

Figures only, no assertions. It tears the fleet down twice: do not run it while someone
uses the sim hosts. Usage: .venv/bin/python scripts/bench_sim_up.py [--skip-cold]
"""

import argparse
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def timed(label, cmd, env=None):
    start = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    took = time.time() - start
    if proc.returncode != 0:
        print("%-8s FAILED (rc=%d) after %.1f s\n%s" % (label, proc.returncode, took, proc.stdout[-3000:]))
        sys.exit(1)
    return took


def sim(*args):
    return [sys.executable, "-m", "kunlun_fleet.sim"] + list(args)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-cold", action="store_true", help="keep the image cache (no purge)")
    parser.add_argument("--repeat", type=int, default=3, help="ping/facts repetitions (default 3)")
    args = parser.parse_args()
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_DEPRECATION_WARNINGS="False")
    rows = []
    if not args.skip_cold:
        timed("purge", sim("sim-down", "--purge"))
        rows.append(("cold sim-up 3", timed("cold", sim("sim-up", "3"))))
    timed("down", sim("sim-down"))
    rows.append(("warm sim-up 3", timed("warm", sim("sim-up", "3"))))
    rows.append(("verify sim-up 3", timed("verify", sim("sim-up", "3"))))
    inventory = os.path.join(REPO, "inventories", "sim")
    for i in range(args.repeat):
        rows.append(("ansible ping #%d" % (i + 1),
                     timed("ping", [os.path.join(BIN, "ansible"), "-i", inventory, "all", "-m", "ansible.builtin.ping"], env)))
    for i in range(args.repeat):
        rows.append(("ansible setup #%d" % (i + 1),
                     timed("facts", [os.path.join(BIN, "ansible"), "-i", inventory, "all", "-m", "ansible.builtin.setup"], env)))
    print("\nsim fleet timings (3 hosts, %s, %d cores)" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                          os.cpu_count()))
    for label, took in rows:
        print("  %-20s %7.1f s" % (label, took))
    return 0


if __name__ == "__main__":
    sys.exit(main())
