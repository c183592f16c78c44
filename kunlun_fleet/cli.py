"""kunlun-fleet's command line: thin wrappers around the playbooks and the sim fleet.

  kunlun-fleet deploy -i INVENTORY [ansible-playbook args]   site.yml
  kunlun-fleet stage NAME -i INVENTORY [args]                playbooks/NAME.yml
  kunlun-fleet bundle-check DIR                              verify an offline bundle
  kunlun-fleet api-key -i INVENTORY [--show]                 make the fleet's API key once (ansible-vault)
  kunlun-fleet bench -i INVENTORY [--concurrency 1,64,...] [--duration S | --requests N] [--check]
                                                             playbooks/bench.yml: load sweep and report
  kunlun-fleet plan [--concurrency N] [--output-tok-s T] [--ttft-p99 2s] [--results FILE]
                                                             hosts needed, from the latest bench results
  kunlun-fleet sim-up N | sim-down | sim-status | sim-reset HOST | demo
"""

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module_utils():
    """The project's module_utils, importable by the controller as plain modules."""
    path = str(ROOT / "module_utils")
    if path not in sys.path:
        sys.path.insert(0, path)


def ansible_env(inventory=None):
    """Environment for ansible commands run from the CLI: this checkout's ansible.cfg and,
    when the inventory has one, its vault password file (the fleet's API key)."""
    from kunlun_fleet import vault

    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    return vault.vault_env(inventory, env) if inventory and os.path.isdir(inventory) else env


def _inventory_arg(args):
    for i, arg in enumerate(args):
        if arg in ("-i", "--inventory") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--inventory="):
            return arg.split("=", 1)[1]
    return None


def ansible_bin(name):
    """The ansible command of the venv the CLI runs from (falls back to PATH)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def run_playbook(playbook, args):
    cmd = [ansible_bin("ansible-playbook"), str(ROOT / playbook)] + list(args)
    os.chdir(ROOT)
    os.execvpe(cmd[0], cmd, ansible_env(_inventory_arg(args)))


def cmd_deploy(ns, rest):
    run_playbook("site.yml", rest)


def cmd_stage(ns, rest):
    playbook = Path("playbooks") / ("%s.yml" % ns.name)
    if not (ROOT / playbook).exists():
        stages = sorted(p.stem for p in (ROOT / "playbooks").glob("*.yml"))
        sys.exit("no stage %r; stages: %s" % (ns.name, ", ".join(stages)))
    run_playbook(playbook, rest)


def cmd_bundle_check(ns, rest):
    import yaml

    _module_utils()
    from bundle_manifest import check_bundle  # noqa: E402 (path set just above)

    stack = yaml.safe_load((ROOT / "roles/kunlun_stack/defaults/main.yml").read_text())
    required = [stack["kunlun_stack_driver"]["artifact"]]
    required += [c["artifact"] for c in stack["kunlun_stack_components"].values() if c.get("artifact")]
    required += [stack["kunlun_stack_model"]["manifest"]]
    if not ns.no_base_image:
        required.append(stack["kunlun_stack_base_image_archive"])
    problems = check_bundle(ns.bundle_dir, required, str(ROOT / ".cache/bundle-sums.json"))
    for path, state, fix in problems:
        print("BAD  %s: %s. Fix: %s" % (path, state, fix))
    if problems:
        sys.exit(1)
    print("bundle %s: every file matches MANIFEST.sha256 and every pinned artifact is present" % ns.bundle_dir)


def cmd_api_key(ns):
    from kunlun_fleet import vault

    if ns.show:
        print(vault.read_api_key(ns.inventory, ns.vault_password_file))
        return 0
    created, path = vault.ensure_api_key(ns.inventory, ns.vault_password_file)
    pw = ns.vault_password_file or vault.paths(ns.inventory)[0]
    print("%s the fleet's API key in %s (ansible-vault, password file %s). Print it with "
          "`kunlun-fleet api-key -i %s --show`." % ("made" if created else "kept", path, pw, ns.inventory))
    return 0


def _int_list(text):
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("a comma-separated list of integers, got %r" % text)
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("concurrency values must be 1 or more, got %r" % text)
    return values


def cmd_bench(ns, rest):
    """playbooks/bench.yml on the inventory, with the sweep's settings as extra vars; then
    the report's path."""
    import json
    import subprocess
    import time

    extra = {}
    if ns.concurrency:
        extra["bench_concurrency"] = ns.concurrency
    if ns.host_concurrency:
        extra["bench_host_concurrency"] = ns.host_concurrency
    if ns.duration is not None:
        extra["bench_duration"] = ns.duration
        extra["bench_requests"] = 0
    if ns.requests is not None:
        extra["bench_requests"] = ns.requests
    if ns.no_long:
        extra["bench_long_enabled"] = False
    cmd = [ansible_bin("ansible-playbook"), str(ROOT / "playbooks/bench.yml"), "-i", ns.inventory]
    if extra:
        cmd += ["-e", json.dumps(extra)]
    if ns.check:
        cmd.append("--check")
    cmd += list(rest)
    started = time.time()
    rc = subprocess.call(cmd, cwd=str(ROOT), env=ansible_env(ns.inventory))
    if ns.check:
        print("check mode: the bench measured nothing and wrote no report")
        return rc
    runs = sorted(p for p in (ROOT / "reports").glob("bench-*") if p.stat().st_mtime >= started - 1)
    if runs:
        print("report: %s" % (runs[-1] / "report.html"))
    return rc


def cmd_plan(ns):
    from kunlun_fleet.bench import plan, results

    path = ns.results or results.latest(str(ROOT / "reports"))
    if not path or not os.path.exists(path):
        sys.exit("no bench results (reports/bench-*/results.json): run `kunlun-fleet bench -i INVENTORY` first")
    res = results.load(path)
    curve = plan.per_host_curve(res)
    ttft = plan.parse_seconds(ns.ttft_p99) if ns.ttft_p99 else None
    if not ns.concurrency and not ns.output_tok_s:
        sys.exit("give --concurrency N and/or --output-tok-s T (and optionally --ttft-p99 2s)")
    answer = plan.hosts_needed(curve, concurrency=ns.concurrency, output_tok_s=ns.output_tok_s, ttft_p99_s=ttft)
    print("from %s (%s host(s) measured directly)" % (path, len((res.get("meta") or {}).get("hosts") or [])))
    print(plan.describe(answer))
    print("assumption: " + plan.ASSUMPTION)
    print("per-host curve: " + ", ".join("%d concurrent: %.0f tok/s, TTFT p99 %.2f s" % r for r in curve))
    return 0 if answer.get("hosts") else 1


def build_parser():
    parser = argparse.ArgumentParser(prog="kunlun-fleet", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("deploy", help="run site.yml (extra arguments go to ansible-playbook)")
    p.set_defaults(func=cmd_deploy)
    p = sub.add_parser("stage", help="run one stage's playbook")
    p.add_argument("name")
    p.set_defaults(func=cmd_stage)
    p = sub.add_parser("bundle-check", help="verify an offline bundle against its manifest and the pins")
    p.add_argument("bundle_dir")
    p.add_argument("--no-base-image", action="store_true",
                   help="the base image comes from a registry, not from the bundle")
    p.set_defaults(func=cmd_bundle_check)
    p = sub.add_parser("api-key", help="make the fleet's API key once, into INVENTORY/group_vars/all/vault.yml")
    p.add_argument("-i", "--inventory", required=True, help="the inventory directory")
    p.add_argument("--vault-password-file", help="default: INVENTORY/.vault-password (made when missing)")
    p.add_argument("--show", action="store_true", help="print the key (for a client); nothing else does")
    p.set_defaults(func=cmd_api_key)
    p = sub.add_parser("bench", help="the load sweep, counters and report (playbooks/bench.yml; loads the fleet)")
    p.add_argument("-i", "--inventory", required=True, help="the inventory directory")
    p.add_argument("--concurrency", type=_int_list, help="sweep through the fleet endpoint, e.g. 1,64,256,1024,2048")
    p.add_argument("--host-concurrency", type=_int_list, help="sweep per host (default: --concurrency)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--duration", type=float, help="seconds of requests per sweep point")
    when.add_argument("--requests", type=int, help="requests per sweep point")
    p.add_argument("--no-long", action="store_true", help="skip the long-context point")
    p.add_argument("--check", action="store_true", help="check mode: measures nothing, says so")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("plan", help="hosts needed for a load, from the latest bench results")
    p.add_argument("--concurrency", type=int, help="concurrent requests to serve")
    p.add_argument("--output-tok-s", type=float, help="output tokens per second to serve")
    p.add_argument("--ttft-p99", help="TTFT p99 limit, e.g. 2s or 500ms")
    p.add_argument("--results", help="a results.json (default: the latest reports/bench-*/results.json)")
    p.set_defaults(func=cmd_plan)
    try:  # the sim tooling is optional for operators of real fleets
        from kunlun_fleet.sim import bundle as sim_bundle, cli as sim_cli
    except ImportError:
        sim_bundle = sim_cli = None
    for extension in (sim_cli, sim_bundle):
        if extension is not None:
            extension.register(sub)
    return parser


def main(argv=None):
    parser = build_parser()
    ns, rest = parser.parse_known_args(argv)
    if rest and ns.command not in ("deploy", "stage", "bench"):
        parser.error("unrecognized arguments: %s" % " ".join(rest))
    return ns.func(ns, rest) if _takes_rest(ns.func) else ns.func(ns)


def _takes_rest(func):
    return func.__code__.co_argcount >= 2


if __name__ == "__main__":
    sys.exit(main())
