"""Command line of the simulated fleet.

``register(subparsers)`` adds sim-up, sim-down, sim-status, sim-reset, sim-engine and demo
to the ``kunlun-fleet`` CLI; ``python -m kunlun_fleet.sim <cmd>`` runs them standalone.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from .config import INVENTORY_DIR, REPO_ROOT, SimError


def _cmd_up(args):
    from . import fleet

    fleet.up(
        args.count,
        args.fault or (),
        rebuild=args.rebuild,
        refresh=args.refresh,
        first=args.first,
        inventory=args.inventory,
    )
    _build_bundle()
    _print_status()
    return 0


def _cmd_down(args):
    from . import fleet

    if args.inventory:
        if args.purge:
            raise SimError(
                "sim-down --inventory DIR removes one fleet; --purge (images and engine data) "
                "is for the whole sim: drop one of the two"
            )
        fleet.down_fleet(args.inventory)
    else:
        fleet.down(purge=args.purge)
    return 0


def _cmd_reset(args):
    from . import fleet

    fleet.reset(args.host, args.fault or ())
    return 0


def _cmd_engine(args):
    from . import engine
    from .config import DOCKER_HOST

    engine.ensure_engine()
    print("export DOCKER_HOST=%s DOCKER_API_VERSION=%s" % (DOCKER_HOST, engine.DOCKER_API_VERSION))
    return 0


def _print_status(as_json=False):
    from . import fleet

    info = fleet.status()
    if as_json:
        print(json.dumps(info, indent=2))
        return
    print("engine: %s" % info["engine"])
    if info.get("image"):
        print("image:  %s" % info["image"])
    if not info["hosts"]:
        print("no sim hosts (run `kunlun-fleet sim-up 3`)")
        return
    print(
        "%-10s %-10s %-15s %-8s %-9s %-4s %-9s %s"
        % ("HOST", "CONTAINER", "ADDRESS", "STATE", "SYSTEMD", "SSH", "IMAGE", "DISK / KIT LOOPS / FAULTS")
    )
    for row in info["hosts"]:
        print(
            "%-10s %-10s %-15s %-8s %-9s %-4s %-9s %s"
            % (
                row["host"],
                row["container"],
                row["address"],
                row["state"],
                row["systemd"],
                row["ssh"],
                row["image"].split(" ")[0],
                row["disk"],
            )
        )
        if row["kit_loops"]:
            print("%65s LV loops: %s" % ("", " ".join(row["kit_loops"])))
        if row["faults"]:
            print("%65s faults: %s" % ("", " ".join("%s=%s" % kv for kv in sorted(row["faults"].items()))))
    for inventory in sorted({row["inventory"] for row in info["hosts"]}):
        names = [row["host"] for row in info["hosts"] if row["inventory"] == inventory]
        print("inventory: %s (%s)" % (inventory, ", ".join(names)))


def _cmd_status(args):
    _print_status(args.json)
    return 0


def _build_bundle():
    """The sim bundle (stand-in vendor artifacts) where the sim inventory points."""
    from .config import BUNDLE_DIR, log

    try:
        from . import bundle
    except ImportError as exc:
        log("note: no sim bundle builder (%s); site.yml will find no bundle" % exc)
        return
    try:
        # The base image archive too: the image stage loads it from the bundle (no
        # registry is reachable from the sim hosts).
        bundle.build(BUNDLE_DIR, with_base_image=True, log=log)
        bundle.build_site_stack_bundles(BUNDLE_DIR, log=log)
    except (NotImplementedError, RuntimeError, OSError) as exc:
        log("note: the sim bundle could not be built: %s" % exc)


def _cmd_demo(args):
    """sim-up 3, `kunlun-fleet deploy -i inventories/sim`, then a summary of what was done."""
    from . import fleet

    extra = list(args.ansible_args or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    started = time.time()
    fleet.up(args.count, args.fault or (), refresh=True)
    up_time = time.time() - started
    _build_bundle()
    playbook = os.path.join(REPO_ROOT, "site.yml")
    # The operator's own command (kunlun_fleet/runner/): the live per-host view on a
    # terminal, ansible-playbook's output otherwise, and a run report under reports/runs/.
    kunlun_fleet = os.path.join(os.path.dirname(sys.executable), "kunlun-fleet")
    shown = ["kunlun-fleet", "deploy", "-i", INVENTORY_DIR] + extra
    if os.path.exists(kunlun_fleet):
        cmd = [kunlun_fleet] + shown[1:]
    else:
        cmd = [sys.executable, "-c", "import sys; from kunlun_fleet.cli import main; sys.exit(main())"] + shown[1:]
    print("\n$ %s" % " ".join(shown), flush=True)
    from kunlun_fleet import vault

    env = dict(vault.vault_env(INVENTORY_DIR), ANSIBLE_CONFIG=os.path.join(REPO_ROOT, "ansible.cfg"))
    play_started = time.time()
    if not os.path.exists(playbook):
        print("site.yml not found at %s" % playbook)
        rc = 1
    else:
        rc = subprocess.call(cmd, cwd=REPO_ROOT, env=env)
    play_time = time.time() - play_started
    print("\n=== kunlun-fleet demo summary ===")
    print("sim fleet: %d hosts up in %.1f s" % (args.count, up_time))
    _print_status()
    print("site.yml: %s in %.1f s (rc=%d)" % ("succeeded" if rc == 0 else "FAILED", play_time, rc))
    _print_endpoint(os.path.join(REPO_ROOT, "reports"))
    return rc


def _print_endpoint(report_dir):
    """The acceptance lines and how to call the fleet endpoint (the key itself is not printed)."""
    lines = os.path.join(report_dir, "acceptance.txt")
    figures = os.path.join(report_dir, "acceptance.json")
    if not (os.path.exists(lines) and os.path.exists(figures)):
        return
    print("acceptance (%s):" % lines)
    with open(lines) as handle:
        for line in handle.read().splitlines():
            print("  " + line)
    with open(figures) as handle:
        data = json.load(handle)
    url, model = data.get("fleet_url"), data.get("model")
    if not url:
        return
    print("fleet endpoint: %s/v1 (model %s), OpenAI-compatible; call it with the fleet's API key:" % (url, model))
    print('  export OPENAI_API_KEY="$(.venv/bin/kunlun-fleet api-key -i inventories/sim --show)"')
    print(
        '  curl -sN %s/v1/chat/completions -H "Authorization: Bearer $OPENAI_API_KEY" \\\n'
        "       -H 'Content-Type: application/json' \\\n"
        '       -d \'{"model": "%s", "stream": true, "messages": [{"role": "user", "content": "Hello"}]}\''
        % (url, model)
    )


def _guarded(func):
    """Subcommand entry: a SimError becomes a one-line message and exit status 1."""

    def run(args):
        try:
            return func(args)
        except SimError as exc:
            sys.stderr.write("error: %s\n" % exc)
            return 1
        except KeyboardInterrupt:
            sys.stderr.write("interrupted\n")
            return 130

    run.__name__ = func.__name__
    return run


def register(subparsers):
    """Add the sim-fleet subcommands to an argparse subparsers object. Each sets
    ``func`` (one argument, the parsed namespace; returns the exit status)."""
    p = subparsers.add_parser("sim-up", help="bring up N simulated P800 hosts (idempotent)")
    p.add_argument("count", type=int, nargs="?", default=3, help="number of hosts (default 3)")
    p.add_argument(
        "--fault",
        action="append",
        metavar="HOST:NAME=VALUE",
        help="fault switch for a host, e.g. kf-node-2:xpu_devices=7 (repeatable)",
    )
    p.add_argument("--rebuild", action="store_true", help="rebuild the sim-host image")
    p.add_argument(
        "--refresh", action="store_true", help="recreate hosts that run an older image than the current kit's"
    )
    p.add_argument(
        "--first",
        type=int,
        default=1,
        metavar="K",
        help="index of the fleet's first host (default 1): hosts kf-node-K..K+N-1",
    )
    p.add_argument(
        "--inventory",
        default=INVENTORY_DIR,
        metavar="DIR",
        help="the fleet's inventory directory (default inventories/sim); another directory "
        "is another fleet beside it, on its own range of hosts",
    )
    p.set_defaults(func=_guarded(_cmd_up))

    p = subparsers.add_parser("sim-down", help="remove the sim hosts, their disks, network and rules")
    p.add_argument("--purge", action="store_true", help="also remove the images and the engine's data")
    p.add_argument(
        "--inventory", metavar="DIR", help="remove only the fleet of this inventory (the engine and other fleets stay)"
    )
    p.set_defaults(func=_guarded(_cmd_down))

    p = subparsers.add_parser("sim-status", help="show the sim hosts")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_guarded(_cmd_status))

    p = subparsers.add_parser("sim-reset", help="recreate sim hosts with fresh disks (side by side)")
    p.add_argument("host", nargs="+", help="kf-node-N, kf-sim-N or N")
    p.add_argument(
        "--fault",
        action="append",
        metavar="[HOST:]NAME=VALUE",
        help="fault switch for every host named, or for HOST only (repeatable)",
    )
    p.set_defaults(func=_guarded(_cmd_reset))

    p = subparsers.add_parser("sim-engine", help="start the sim fleet's Docker engine; print its DOCKER_HOST")
    p.set_defaults(func=_guarded(_cmd_engine))

    p = subparsers.add_parser("demo", help="bring up 3 sim hosts and deploy site.yml to them (kunlun-fleet deploy)")
    p.add_argument("--count", type=int, default=3, help="number of hosts (default 3)")
    p.add_argument("--fault", action="append", metavar="HOST:NAME=VALUE", help="fault switch (repeatable)")
    p.add_argument(
        "ansible_args",
        nargs=argparse.REMAINDER,
        help="extra arguments of kunlun-fleet deploy, ansible-playbook's included (after --)",
    )
    p.set_defaults(func=_guarded(_cmd_demo))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kunlun_fleet.sim", description="kunlun-fleet simulated P800 fleet")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    register(sub)
    args = parser.parse_args(argv)
    return args.func(args)
