"""kunlun-fleet's command line: thin wrappers around the playbooks and the sim fleet.
deploy, stage and bench run their playbook through kunlun_fleet/runner/ (ansible-runner):
a live view or ansible-playbook's output, a report per run, exit codes (docs/cli.md).

  kunlun-fleet deploy -i INVENTORY [--from STAGE | --only STAGE,...] [--limit HOSTS]
                      [--plain | --json] [ansible-playbook args]      site.yml
  kunlun-fleet stage NAME -i INVENTORY [--limit HOSTS] [--plain | --json] [args]
                                                             playbooks/NAME.yml
  kunlun-fleet runs [show ID]                                the run reports (reports/runs/)
  kunlun-fleet status -i INVENTORY [--limit HOSTS] [--json]  every serving host's state, read-only
                      [--collect DIR]                        ... and the raw outputs the parsers read
  kunlun-fleet support-bundle -i INVENTORY [--limit HOSTS] [-o FILE]
                                                             every host's diagnostics, masked, in one tar.gz
  kunlun-fleet conformance DIR                               the parsers over those outputs: ok/unreadable/differs
  kunlun-fleet hostkeys -i INVENTORY [--limit HOSTS] [--accept]  every host's SSH host key: known, new, CHANGED
  kunlun-fleet bootstrap -i INVENTORY (--ask-pass | --password-file F) [--deploy-user NAME]
                                                             the controller's key on password-only servers
  kunlun-fleet bundle build DIR [--vendor VDIR] [--find-links WHEELDIR] [--no-index] [--inventory INV]
                                                             the offline bundle: index downloads, vendor files,
                                                             bundle.yml and MANIFEST.sha256 (docs/bundle.md)
  kunlun-fleet bundle check DIR [--inventory INV]            verify it against its manifest, index and the pins
                                                             (`bundle-check DIR` is the same)
  kunlun-fleet api-key -i INVENTORY [--show]                 make the fleet's API key once (ansible-vault)
  kunlun-fleet api-key -i INVENTORY add|revoke|rotate NAME [--no-apply] | list | apply | show NAME
                                                             the teams' client keys, checked by the gateway
  kunlun-fleet watchdog -i INVENTORY release HOST            let a quarantined host back (readiness and a figure decide)
  kunlun-fleet bench -i INVENTORY [--concurrency 1,64,...] [--duration S | --requests N] [--check]
                                                             playbooks/bench.yml: load sweep and report
  kunlun-fleet plan [--concurrency N] [--output-tok-s T] [--ttft-p99 2s] [--results FILE]
                                                             hosts needed, from the latest bench results
  kunlun-fleet host -i INVENTORY add|remove HOST[,HOST]      membership: every stage to new hosts and into the
                                                             gateways; or drained, stopped, out (docs/membership.md)
  kunlun-fleet estimate [-i INVENTORY | --hosts N] [--from-run ID] [--image-gb G --model-gb G ...]
                                                             bare -> serving time, from a measured deploy
  kunlun-fleet sim-up N | sim-down | sim-status | sim-reset HOST | demo
"""

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ansible_env(inventory=None):
    """Environment for ansible commands run from the CLI: this checkout's ansible.cfg and,
    when the inventory has one, its vault password file (the fleet's API key)."""
    from kunlun_fleet import runner

    return runner.ansible_env(inventory, ROOT)


def _output(ns):
    """--json, --plain, or the live view when stdout is a terminal."""
    if ns.json:
        return "json"
    if ns.plain or not sys.stdout.isatty() or os.environ.get("TERM") == "dumb":
        return "plain"
    return "live"


def _argv(ns):
    return ["kunlun-fleet"] + list(ns.argv)


def cmd_deploy(ns, rest):
    """site.yml, or the stages chosen with --from/--only, through the runner."""
    from kunlun_fleet import runner

    stages = runner.site_stages()
    try:
        chosen = runner.select_stages(stages, ns.from_stage, ns.only)
    except runner.Refused as exc:
        print("kunlun-fleet deploy: %s" % exc, file=sys.stderr)
        return runner.REFUSED
    head = ["kunlun-fleet", "deploy", "-i", ns.inventory]
    return runner.run_playbook(
        "deploy",
        "site.yml",
        rest,
        inventory=ns.inventory,
        limit=ns.limit,
        stages=chosen,
        selection=len(chosen) != len(stages),
        output=_output(ns),
        resume=(head, rest, "only" if ns.only else "from"),
        argv=_argv(ns),
    )


def cmd_stage(ns, rest):
    from kunlun_fleet import runner

    base = runner.root()
    playbook = Path("playbooks") / ("%s.yml" % ns.name)
    if not (base / playbook).exists():
        names = sorted(p.stem for p in (base / "playbooks").glob("*.yml"))
        print(
            "kunlun-fleet stage: no stage %r (no %s); the stages: %s" % (ns.name, playbook, ", ".join(names)),
            file=sys.stderr,
        )
        return runner.REFUSED
    stages = [s for s in runner.site_stages(base) if s["stage"] == ns.name] or None
    head = ["kunlun-fleet", "stage", ns.name, "-i", ns.inventory]
    return runner.run_playbook(
        "stage",
        str(playbook),
        rest,
        inventory=ns.inventory,
        limit=ns.limit,
        stages=stages,
        output=_output(ns),
        resume=(head, rest, None),
        argv=_argv(ns),
        label="stage-%s" % ns.name,
    )


def cmd_status(ns):
    """playbooks/status.yml, read-only and quiet, through the runner; the table or --json."""
    from kunlun_fleet import status

    return status.run(ns.inventory, ns.limit, as_json=ns.json, argv=_argv(ns), collect_dir=ns.collect)


def cmd_support_bundle(ns):
    """playbooks/status.yml with the diagnostics, read-only: one masked tar.gz."""
    from kunlun_fleet import support

    return support.run(ns.inventory, ns.limit, output=ns.output, argv=_argv(ns))


def cmd_conformance(ns):
    """The product's parsers over a `status --collect DIR`: ok, unreadable or differs per file."""
    from kunlun_fleet import conformance

    return conformance.run(ns.dir, as_json=ns.json)


def cmd_hostkeys(ns):
    """Every host's SSH host key against INV/.ssh/known_hosts; --accept records the new ones."""
    from kunlun_fleet import hostkeys

    return hostkeys.run_hostkeys(
        ns.inventory,
        ns.limit,
        do_accept=ns.accept,
        as_json=ns.json,
        timeout=ns.timeout,
        vault_password_file=ns.vault_password_file,
    )


def cmd_bootstrap(ns, rest):
    """playbooks/bootstrap.yml with the login password, once every host key is known."""
    from kunlun_fleet import hostkeys

    return hostkeys.run_bootstrap(
        ns.inventory,
        ns.limit,
        ask_pass=ns.ask_pass,
        password_file=ns.password_file,
        deploy_user=ns.deploy_user,
        rest=rest,
        output=_output(ns),
        argv=_argv(ns),
    )


def cmd_bundle_build(ns):
    """The offline bundle from the package index and the vendor's files (kunlun_fleet/bundle.py)."""
    from kunlun_fleet import bundle

    return bundle.run_build(ns)


def cmd_bundle_check(ns):
    """The bundle against its manifest, its index and the pins (the stages' check, every pin)."""
    from kunlun_fleet import bundle

    return bundle.run_check(ns)


def cmd_api_key(ns):
    from kunlun_fleet import runner, vault

    if ns.action:
        try:
            return _api_key_action(ns)
        except vault.Refused as exc:
            print("kunlun-fleet api-key: %s. Nothing was changed." % exc, file=sys.stderr)
            return runner.REFUSED
    if ns.name or ns.no_apply:
        print("kunlun-fleet api-key: NAME and --no-apply go with add, revoke or rotate", file=sys.stderr)
        return runner.REFUSED
    if ns.show:
        print(vault.read_api_key(ns.inventory, ns.vault_password_file))
        return 0
    created, path = vault.ensure_api_key(ns.inventory, ns.vault_password_file)
    pw = ns.vault_password_file or vault.paths(ns.inventory)[0]
    print(
        "%s the fleet's API key in %s (ansible-vault, password file %s). Print it with "
        "`kunlun-fleet api-key -i %s --show`." % ("made" if created else "kept", path, pw, ns.inventory)
    )
    return 0


# The client keys (docs/gateway.md "Client keys", docs/cli.md "api-key"). A key is printed
# only by add and rotate (once, alone on stdout, for the operator to hand over) and by show;
# the apply's run goes to stderr then, so that `KEY=$(kunlun-fleet api-key ... add NAME)`
# holds the key alone. Keys reach the playbook through the vault file only.
_STATES = {
    "applied": "applied",
    "added": "added, not applied yet (the gateways refuse it until `apply`)",
    "rotated": "rotated, not applied yet (the gateways accept the old key until `apply`)",
    "revoked": "revoked, not applied yet (the gateways accept it until `apply`)",
}


def _api_key_action(ns):
    from kunlun_fleet import vault

    inv, pw = ns.inventory, ns.vault_password_file
    if ns.finish and not (ns.action == "rotate" and not ns.name):
        raise vault.Refused("--finish goes with `rotate` without a name (the fleet key's rotation)")
    if ns.action == "rotate" and not ns.name:
        return _fleet_key_rotate(ns)
    if ns.action in ("add", "revoke", "rotate", "show") and not ns.name:
        raise vault.Refused("%s needs a client name: kunlun-fleet api-key -i %s %s NAME" % (ns.action, inv, ns.action))
    if ns.action in ("list", "apply") and ns.name:
        raise vault.Refused("%s takes no name (got %r)" % (ns.action, ns.name))
    if ns.show or (ns.no_apply and ns.action not in ("add", "revoke", "rotate")):
        raise vault.Refused("--show goes alone (a client's key: `show NAME`); --no-apply with add, revoke or rotate")
    if ns.action == "show":
        print(vault.read_client_key(inv, ns.name, pw))
        return 0
    if ns.action == "list":
        return _api_key_list(inv, pw)
    if ns.action == "apply":
        return _api_key_apply(ns, sys.stdout)
    if ns.action == "add":
        vault._check_name(ns.name, "added")  # before the fleet key is made, if it is
        created, _ = vault.ensure_api_key(inv, pw)
        if created:
            print("made the fleet's API key first (`kunlun-fleet api-key -i %s --show`)" % inv, file=sys.stderr)
        key = vault.add_client_key(inv, ns.name, pw)
    elif ns.action == "rotate":
        key = vault.rotate_client_key(inv, ns.name, pw)
    else:
        vault.revoke_client_key(inv, ns.name, pw)
        key = None
    done = {"add": "added", "rotate": "made a new key for", "revoke": "revoked"}[ns.action]
    if key is not None:
        print(
            "%s client %s in %s (encrypted). Its key, printed this once (`show %s` prints it again):"
            % (done, ns.name, vault.paths(inv)[1], ns.name),
            file=sys.stderr,
        )
        print(key, flush=True)
    else:
        print("%s client %s in %s." % (done, ns.name, vault.paths(inv)[1]), file=sys.stderr)
    if ns.no_apply:
        print(
            "Not applied (--no-apply): the gateways %s until `kunlun-fleet api-key -i %s apply`."
            % ("refuse the new key" if ns.action == "add" else "accept the old key", inv),
            file=sys.stderr,
        )
        return 0
    return _api_key_apply(ns, sys.stderr if key is not None else sys.stdout)


def _fleet_key_rotate(ns):
    """The fleet key's rotation (docs/gateway.md "Rotating the fleet key"). `rotate`: a new
    fleet key, the old one kept as the previous; applied by playbooks/fleet_key.yml, the
    workers first (a rolling restart: each accepts both), then the gateways (both accepted
    from clients, the new one sent on). `rotate --finish`: the previous key removed, the
    gateways first (it gets 401), then the workers. The new key is printed once, alone on
    stdout."""
    from kunlun_fleet import vault

    inv, pw = ns.inventory, ns.vault_password_file
    if ns.show:
        raise vault.Refused("--show goes alone (`kunlun-fleet api-key -i %s --show` prints the fleet key)" % inv)
    if ns.finish:
        vault.finish_fleet_key(inv, pw)
        print(
            "the fleet key's rotation is finished in %s: the key it replaced is gone." % vault.paths(inv)[1],
            file=sys.stderr,
        )
        key = None
    else:
        key = vault.rotate_fleet_key(inv, pw)
        print(
            "made a new fleet key in %s (encrypted); the old one stays accepted until `kunlun-fleet api-key -i %s "
            "rotate --finish`. The new key, printed this once (`kunlun-fleet api-key -i %s --show` prints it again):"
            % (vault.paths(inv)[1], inv, inv),
            file=sys.stderr,
        )
        print(key, flush=True)
    if ns.no_apply:
        print(
            "Not applied (--no-apply): `kunlun-fleet api-key -i %s apply` applies it (the serving hosts restart in "
            "batches)." % inv,
            file=sys.stderr,
        )
        return 0
    rc = _api_key_apply(ns, sys.stderr if key is not None else sys.stdout)
    if rc == 0 and key is not None:
        print(
            "applied: the workers and the gateways accept the old and the new key; the gateways send the workers the "
            "new one. Move every client of the fleet key to the new key, then `kunlun-fleet api-key -i %s rotate "
            "--finish` (the old key refused from then on)." % inv,
            file=sys.stderr,
        )
    elif rc == 0:
        print("applied: the old fleet key is refused everywhere.", file=sys.stderr)
    return rc


def _api_key_apply(ns, stream):
    """playbooks/api_keys.yml through the runner: every gateway's key map, a graceful reload;
    on success the record `list` compares the vault with."""
    from kunlun_fleet import runner, vault

    inv = ns.inventory
    pw = ns.vault_password_file or vault.paths(inv)[0]
    fingerprints = vault.client_fingerprints(inv, pw)
    plain = ns.plain or not stream.isatty() or os.environ.get("TERM") == "dumb"
    record = vault.applied_record(inv) or {"clients": {}}
    # The fleet key changed (a rotation begun or finished) since the last apply, or no apply is
    # on record (what the workers accept is not known): the workers are brought to the vault's
    # keys too, before (begin) or after (finish) the gateways (playbooks/fleet_key.yml; the
    # serve stage restarts nothing where nothing changed). Sending the workers a key they do
    # not accept yet would fail every request.
    fleet_changed = any(
        record["clients"].get(name) != fingerprints.get(name) for name in (vault.FLEET, vault.FLEET_PREVIOUS)
    )
    rc = runner.run_playbook(
        "api-key",
        "playbooks/fleet_key.yml" if fleet_changed else "playbooks/api_keys.yml",
        ["--vault-password-file", pw],
        inventory=inv,
        output="plain" if plain else "live",
        argv=_argv(ns),
        stream=stream,
        label="api-key",
    )
    if rc == runner.OK:
        vault.record_applied(inv, fingerprints)
        print("applied: every gateway has the client keys of %s" % vault.paths(inv)[1], file=sys.stderr)
    else:
        print(
            "not applied on every gateway (exit code %d, the run above): the vault holds the change; "
            "`kunlun-fleet api-key -i %s apply` once what the run names is fixed" % (rc, inv),
            file=sys.stderr,
        )
    return rc


def _api_key_list(inv, pw):
    from kunlun_fleet import vault

    states = vault.client_states(inv, pw)
    record = vault.applied_record(inv)
    width = max(len(name) for name, _ in states)
    for name, state in states:
        text = "the fleet key: the workers' own, always accepted" if name == vault.FLEET else _STATES[state]
        if name == vault.FLEET_PREVIOUS:
            text = (
                "the fleet key a rotation replaces: still accepted, until `api-key rotate --finish`"
                if state != "revoked"
                else "the fleet key a rotation replaced: still accepted until `apply`"
            )
        if name in (vault.FLEET, vault.FLEET_PREVIOUS) and state not in ("applied", "revoked"):
            text += " (not applied by `api-key apply` yet)"
        print("%s  %s" % (name.ljust(width), text))
    print(
        "last applied by `kunlun-fleet api-key apply`: %s"
        % (record["applied_at"] if record else "never (the gateway stage applies them too)"),
        file=sys.stderr,
    )
    return 0


def _int_list(text):
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("a comma-separated list of integers, got %r" % text) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("concurrency values must be 1 or more, got %r" % text)
    return values


def cmd_watchdog(ns):
    """playbooks/watchdog_release.yml through the runner: the release request on every gateway."""
    from kunlun_fleet import runner

    rc = runner.run_playbook(
        "watchdog",
        "playbooks/watchdog_release.yml",
        ["-e", "watchdog_release_host=%s" % ns.host],
        inventory=ns.inventory,
        output=_output(ns),
        argv=_argv(ns),
        label="watchdog",
    )
    if rc == runner.OK:
        print(
            "asked: every gateway's watchdog judges %s at its next round (readiness, then a single stream at the "
            "re-admission figure); `kunlun-fleet status -i %s` shows the outcome" % (ns.host, ns.inventory)
        )
    return rc


def _host_names(text):
    return [h.strip() for h in (text or "").split(",") if h.strip()]


def _membership_refusal(action, hosts, groups, inventory):
    """Why `host ACTION HOSTS` cannot be done on an inventory of these groups, or None."""
    serving = groups.get("xpu_servers", [])
    unknown = [h for h in hosts if h not in serving]
    if unknown:
        return "not serving hosts of %s (xpu_servers): %s; %s" % (
            inventory,
            ", ".join(unknown),
            "add them to its hosts.yml first" if action == "add" else "its serving hosts: " + ", ".join(serving),
        )
    if action != "remove":
        return None
    shared = sorted({h for g in ("gateways", "image_builders", "monitoring") for h in groups.get(g, [])} & set(hosts))
    if shared:
        return (
            "the fleet depends on %s (a gateway, the image builder or a monitoring host): move that role to another "
            "host in the inventory and deploy it first" % ", ".join(shared)
        )
    if not set(serving) - set(hosts):
        return "no serving host would be left"
    return None


def cmd_host(ns):
    """Membership (docs/membership.md): `host remove` runs playbooks/remove_host.yml (drained,
    serving stopped, out of the gateways and monitoring, the data left); `host add` deploys
    every stage to the new hosts, with the hosts they need (the image builder, the gateways,
    monitoring), after their SSH host keys are known."""
    from kunlun_fleet import runner

    hosts = _host_names(ns.hosts)
    if not hosts:
        print("kunlun-fleet host %s: give the hosts, e.g. p800-a07[,p800-a08]" % ns.action, file=sys.stderr)
        return runner.REFUSED
    try:
        groups = _inventory_groups(ns.inventory)
    except runner.Refused as exc:
        print("kunlun-fleet host %s: %s" % (ns.action, exc), file=sys.stderr)
        return runner.REFUSED
    why = _membership_refusal(ns.action, hosts, groups, ns.inventory)
    if why:
        print("kunlun-fleet host %s: %s. Nothing was changed." % (ns.action, why), file=sys.stderr)
        return runner.REFUSED
    if ns.action == "remove":
        rc = runner.run_playbook(
            "host-remove",
            "playbooks/remove_host.yml",
            ["-e", json.dumps({"kunlun_stack_removed_hosts": hosts})],
            inventory=ns.inventory,
            output=_output(ns),
            argv=_argv(ns),
            label="host-remove",
        )
        if rc == runner.OK:
            print(
                "removed from serving: %s (drained, serving stopped, out of the gateways and monitoring; the data "
                "volume, image and weights stay). Now delete %s from %s/hosts.yml (and host_vars): left there, the "
                "next deploy serves %s again."
                % (
                    ", ".join(hosts),
                    "it" if len(hosts) == 1 else "them",
                    ns.inventory,
                    "it" if len(hosts) == 1 else "them",
                )
            )
        return rc
    # add: the new hosts' keys must be known first (kunlun-fleet hostkeys, first contact).
    from kunlun_fleet import hostkeys

    known = hostkeys.run_hostkeys(ns.inventory, ",".join(hosts), do_accept=False)
    if known != 0:
        print(
            "kunlun-fleet host add: the SSH host keys of %s are not all known and checked; run `kunlun-fleet hostkeys "
            "-i %s --limit %s --accept` (compare each fingerprint with the server's console) and add again"
            % (", ".join(hosts), ns.inventory, ",".join(hosts)),
            file=sys.stderr,
        )
        return runner.REFUSED
    limit = ",".join(hosts + ["image_builders", "gateways", "monitoring"])
    head = ["kunlun-fleet", "deploy", "-i", ns.inventory]
    return runner.run_playbook(
        "host-add",
        "site.yml",
        [],
        inventory=ns.inventory,
        limit=limit,
        stages=runner.site_stages(),
        output=_output(ns),
        resume=(head, [], "from"),
        argv=_argv(ns),
        label="host-add",
    )


def cmd_upgrade(ns):
    """A serving fleet moved to another named stack through a canary (kunlun_fleet/upgrade/run.py)."""
    from kunlun_fleet.upgrade import run

    rc, _ = run.upgrade(
        ns.inventory,
        ns.to,
        canary=ns.canary,
        baseline=ns.baseline,
        check=ns.check,
        output=_output(ns),
        argv=_argv(ns),
    )
    return rc


def cmd_stacks(ns):
    """The named stacks the inventory can serve, with their status and the one it names."""
    from kunlun_fleet import bundle

    try:
        pins = bundle.load_pins(ns.inventory)
    except ValueError as exc:
        from kunlun_fleet import runner

        print("kunlun-fleet stacks: %s" % exc, file=sys.stderr)
        return runner.REFUSED
    bundle.module_utils()
    from ansible.module_utils.kunlun_stack import component_versions, stack_catalog

    chosen = pins.get("kunlun_stack_stack")
    catalog = stack_catalog(pins.get("kunlun_stack_stacks"), pins.get("kunlun_stack_site_stacks"))
    site = set(pins.get("kunlun_stack_site_stacks") or {})
    for name in sorted(catalog):
        entry = catalog[name] or {}
        versions = component_versions(entry.get("components") or {})
        mark = "*" if name == chosen else " "
        print(
            "%s %-20s %-10s %-5s vllm %s, vllm-kunlun %s, kunlun_ops %s, torch %s"
            % (
                mark,
                name,
                entry.get("status", "?"),
                "site" if name in site else "",
                versions.get("vllm", "?"),
                versions.get("vllm_kunlun_commit", "?"),
                versions.get("kunlun_ops", "?"),
                versions.get("torch", "?"),
            )
        )
        why = entry.get("reason") if entry.get("status") == "known-bad" else entry.get("summary")
        if why:
            print("      %s" % " ".join(str(why).split()))
    print("* the stack the inventory names (kunlun_stack_stack)")
    return 0


def cmd_bench(ns, rest):
    """playbooks/bench.yml on the inventory, with the sweep's settings as extra vars; then
    the report's path."""
    import json
    import time

    from kunlun_fleet import runner

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
    args = ["-e", json.dumps(extra)] if extra else []
    if ns.check:
        args.append("--check")
    started = time.time()
    rc = runner.run_playbook(
        "bench",
        "playbooks/bench.yml",
        args + list(rest),
        inventory=ns.inventory,
        limit=ns.limit,
        output=_output(ns),
        argv=_argv(ns),
    )
    if ns.check:
        print("check mode: the bench measured nothing and wrote no report", file=sys.stderr if ns.json else sys.stdout)
        return rc
    reports = runner.root() / "reports"
    runs = sorted(p for p in reports.glob("bench-*") if p.stat().st_mtime >= started - 1)
    if runs:
        print("bench report: %s" % (runs[-1] / "report.html"), file=sys.stderr if ns.json else sys.stdout)
    return rc


def cmd_runs(ns):
    """The run reports: a table of them, or one (summary.md)."""
    from kunlun_fleet import runner

    if ns.action == "show":
        if not ns.run_id:
            print("kunlun-fleet runs show: give a run id (or 'last'); `kunlun-fleet runs` lists them", file=sys.stderr)
            return runner.REFUSED
        try:
            path = runner.find_run(ns.run_id)
        except runner.Refused as exc:
            print("kunlun-fleet runs show: %s" % exc, file=sys.stderr)
            return runner.REFUSED
        summary = path / "summary.md"
        if not summary.exists():
            print(
                "kunlun-fleet runs show: %s has no summary.md (a run still going, or killed); its events are in %s"
                % (path.name, path / "artifacts"),
                file=sys.stderr,
            )
            return 1
        print(summary.read_text(), end="")
        return 0
    runs = runner.list_runs()
    if not runs:
        print("no runs yet in %s (deploy, stage and bench write one each)" % runner.runs_dir())
        return 0
    print(runner.runs_table(runs))
    return 0


def cmd_plan(ns):
    from kunlun_fleet import runner
    from kunlun_fleet.bench import plan, results

    # Input it cannot use is refused with the same code as every other command's (3).
    path = ns.results or results.latest(str(ROOT / "reports"))
    if not path or not os.path.exists(path):
        print(
            "kunlun-fleet plan: no bench results (reports/bench-*/results.json): "
            "run `kunlun-fleet bench -i INVENTORY` first",
            file=sys.stderr,
        )
        return runner.REFUSED
    if not ns.concurrency and not ns.output_tok_s:
        print(
            "kunlun-fleet plan: give --concurrency N and/or --output-tok-s T (and optionally --ttft-p99 2s)",
            file=sys.stderr,
        )
        return runner.REFUSED
    res = results.load(path)
    curve = plan.per_host_curve(res)
    ttft = plan.parse_seconds(ns.ttft_p99) if ns.ttft_p99 else None
    answer = plan.answer(res, concurrency=ns.concurrency, output_tok_s=ns.output_tok_s, ttft_p99_s=ttft)
    print("from %s (%s host(s) measured directly)" % (path, len((res.get("meta") or {}).get("hosts") or [])))
    print(plan.describe(answer))
    print("assumption: " + plan.ASSUMPTION)
    print(
        "per-host curve (%s): " % plan.extent(curve)
        + ", ".join("%d concurrent: %.0f tok/s, TTFT p99 %.2f s" % r for r in curve)
    )
    fleet = plan.fleet_curve(res)
    print(
        "fleet curve per host, %d hosts (%s): " % (plan.fleet_hosts(res), plan.extent(fleet))
        + ", ".join("%g concurrent: %.0f tok/s, TTFT p99 %.2f s" % r for r in fleet)
    )
    return 0 if answer.get("hosts") else 1


def _inventory_groups(inventory):
    """{group: [host, ...]} of an inventory (read as Ansible reads it, no variables)."""
    from kunlun_fleet import runner

    os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    if not os.path.exists(inventory):
        raise runner.Refused("no inventory %s" % inventory)
    try:
        manager = InventoryManager(loader=DataLoader(), sources=[inventory])
    except AnsibleError as exc:
        raise runner.Refused("the inventory %s cannot be read: %s" % (inventory, exc)) from exc
    return {name: [h.name for h in group.get_hosts()] for name, group in manager.groups.items()}


def _serving_hosts(inventory):
    """The number of xpu_servers hosts in an inventory."""
    return len(_inventory_groups(inventory).get("xpu_servers", []))


def _reference_run(ns):
    """(id, summary) of the run the estimate starts from: --from-run, else the newest deploy
    of every stage (no --only/--from) that finished, of this inventory first."""
    from kunlun_fleet import runner

    if ns.from_run:
        path = runner.find_run(ns.from_run)
        return path.name, json.loads((path / "summary.json").read_text())
    runs = [
        r
        for r in runner.list_runs()
        if r.get("command") == "deploy"
        and not r.get("stages_selected")
        and not r.get("check_mode")
        and r.get("exit_code") in (runner.OK, runner.PARTIAL)
    ]
    from kunlun_fleet.status import same_inventory

    mine = [r for r in runs if ns.inventory and same_inventory(r.get("inventory"), ns.inventory)]
    chosen = (mine or runs or [None])[-1]
    return (chosen["id"], chosen) if chosen else (None, None)


def cmd_estimate(ns):
    from kunlun_fleet import estimate, runner

    try:
        hosts = ns.hosts if ns.hosts else _serving_hosts(ns.inventory) if ns.inventory else 0
        run_id, summary = _reference_run(ns)
    except runner.Refused as exc:
        print("kunlun-fleet estimate: %s" % exc, file=sys.stderr)
        return runner.REFUSED
    if hosts <= 0:
        print(
            "kunlun-fleet estimate: no serving host: give -i INVENTORY (its xpu_servers) or --hosts N", file=sys.stderr
        )
        return runner.REFUSED
    if summary is None:
        print(
            "kunlun-fleet estimate: no finished deploy of every stage to start from (reports/runs/): deploy one "
            "server first (README, 'Real servers', step 6), or give --from-run ID",
            file=sys.stderr,
        )
        return runner.REFUSED
    inputs = {
        "task_cpu_s": ns.task_cpu_s,
        "cores": ns.controller_cores or os.cpu_count() or 1,
        "forks": ns.forks,
        "link_gbps": ns.link_gbps,
        "controller_gbps": ns.controller_gbps,
        "per_source": ns.per_source,
        "idle_batch_max": ns.idle_batch_max,
        "image_gb": ns.image_gb,
        "model_gb": ns.model_gb,
        "engine_start_s": ns.engine_start_s,
        "ref_image_gb": ns.ref_image_gb,
        "ref_model_gb": ns.ref_model_gb,
        "ref_engine_start_s": ns.ref_engine_start_s,
    }
    result = estimate.estimate(summary, hosts, inputs)
    if ns.json:
        print(json.dumps(dict(result, run=run_id, inputs=inputs), indent=2))
    else:
        sys.stdout.write(estimate.render(result, run_id, inputs))
    return 0


def cmd_inventory(ns):
    """A site inventory written from a CSV of the servers (--csv), and each serving host's data
    disks from what it reports (--discover), shown and confirmed first (kunlun_fleet/inventory_gen.py)."""
    from kunlun_fleet import inventory_gen

    return inventory_gen.run(
        ns.inventory,
        csv_path=ns.csv,
        discover=ns.discover,
        limit=ns.limit,
        yes=ns.yes,
        force=ns.force,
        argv=_argv(ns),
    )


def _bundle_options(p):
    p.add_argument(
        "--inventory", "-i", metavar="INV", help="take the kunlun_stack pins as INV/group_vars/all overrides them"
    )
    p.add_argument(
        "--no-base-image", action="store_true", help="the base image comes from a registry, not from the bundle"
    )
    p.add_argument(
        "--stack",
        metavar="NAME",
        help="the pins of this stack (default: the inventory's kunlun_stack_stack, else the validated one); "
        "one bundle per stack",
    )


class _Parser(argparse.ArgumentParser):
    """A command line it cannot read is refused input: exit code 3, as for an unknown stage."""

    def error(self, message):
        from kunlun_fleet import runner

        self.print_usage(sys.stderr)
        self.exit(runner.REFUSED, "%s: error: %s\n" % (self.prog, message))


def _run_options(p, stages=False):
    """The options of the commands that run a playbook; anything else goes to ansible-playbook."""
    p.add_argument("-i", "--inventory", required=True, help="the inventory (a directory, as inventories/example)")
    p.add_argument("-l", "--limit", help="the hosts to run on (ansible-playbook's --limit)")
    if stages:
        which = p.add_mutually_exclusive_group()
        which.add_argument(
            "--from",
            dest="from_stage",
            metavar="STAGE",
            help="start at this stage of site.yml (and run the ones after it)",
        )
        which.add_argument("--only", metavar="STAGE[,STAGE]", help="run only these stages, in site.yml's order")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--plain", action="store_true", help="ansible-playbook's own output (default when not a terminal)")
    how.add_argument("--json", action="store_true", help="one JSON object per event per line")


def version():
    """kunlun-fleet's release (the installed package's metadata) and, in a git checkout, its
    commit: what an operator quotes in a report of a problem."""
    from importlib import metadata

    try:
        text = "kunlun-fleet %s" % metadata.version("kunlun-fleet")
    except metadata.PackageNotFoundError:
        text = "kunlun-fleet (not installed: run make setup)"
    root = Path(__file__).resolve().parents[1]
    if (root / ".git").exists():
        import subprocess

        proc = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty"], capture_output=True, text=True
        )
        if proc.returncode == 0 and proc.stdout.strip():
            text += " (checkout %s, commit %s)" % (root, proc.stdout.strip())
    return text


def build_parser():
    parser = _Parser(prog="kunlun-fleet", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version())
    sub = parser.add_subparsers(dest="command", required=True)
    epilog = (
        "other arguments go to ansible-playbook (-e, --check, --diff, --tags, -v, ...). Exit codes: 0 ok, "
        "1 error, 2 failed hosts, 3 refused input (preflight), 4 unreachable hosts, 130 interrupted; "
        "the report: reports/runs/ID/summary.md (docs/cli.md)"
    )
    p = sub.add_parser(
        "deploy",
        help="run site.yml, or some of its stages (extra arguments go to ansible-playbook)",
        allow_abbrev=False,
        epilog=epilog,
    )
    _run_options(p, stages=True)
    p.set_defaults(func=cmd_deploy)
    p = sub.add_parser("stage", help="run one stage's playbook", allow_abbrev=False, epilog=epilog)
    p.add_argument("name")
    _run_options(p)
    p.set_defaults(func=cmd_stage)
    p = sub.add_parser("runs", help="the run reports: a list, or `runs show ID`")
    p.add_argument("action", nargs="?", choices=["show"])
    p.add_argument("run_id", nargs="?", metavar="ID", help="a run id, a unique prefix of one, or 'last'")
    p.set_defaults(func=cmd_runs)
    p = sub.add_parser(
        "status",
        help="every serving host's state, live and read-only: one row per host",
        allow_abbrev=False,
        epilog="exit codes: 0 every host healthy, 2 a host unhealthy, 4 a host unreachable, 1 error, "
        "3 refused input, 130 interrupted (docs/cli.md)",
    )
    p.add_argument("-i", "--inventory", required=True, help="the inventory (a directory, as inventories/example)")
    p.add_argument("-l", "--limit", help="the hosts to read (ansible-playbook's --limit)")
    p.add_argument("--json", action="store_true", help="one JSON document {hosts: [...], healthy: bool, ...}")
    p.add_argument(
        "--collect",
        metavar="DIR",
        help="also save each host's raw outputs (xpu-smi, lspci, lsblk, docker info, ...), serials and "
        "addresses masked, under DIR/<host>/ (read-only; see `conformance DIR`)",
    )
    p.set_defaults(func=cmd_status)
    p = sub.add_parser(
        "support-bundle",
        help="one tar.gz of every host's diagnostics, secrets masked, readable without the fleet",
        allow_abbrev=False,
        epilog="read-only on the hosts. Exit codes: 0 written with every host, 4 written, a host "
        "unreachable, 1 nothing written, 3 refused input (docs/cli.md)",
    )
    p.add_argument("-i", "--inventory", required=True, help="the inventory (a directory, as inventories/example)")
    p.add_argument("-l", "--limit", help="the hosts to collect (ansible-playbook's --limit)")
    p.add_argument(
        "-o", "--output", metavar="FILE", help="the bundle (default reports/support/support-<UTC time>.tar.gz)"
    )
    p.set_defaults(func=cmd_support_bundle)
    p = sub.add_parser(
        "conformance",
        help="the product's parsers over the outputs `status --collect DIR` saved",
        allow_abbrev=False,
        epilog="exit codes: 0 every file ok (or missing on the host), 2 a file unreadable or "
        "differing from the sim kit's, 3 bad input (no DIR, no DIR/<host>/index.json) "
        "(docs/cli.md)",
    )
    p.add_argument("dir", metavar="DIR", help="a directory written by `kunlun-fleet status --collect DIR`")
    p.add_argument("--json", action="store_true", help="one JSON document {hosts: {...}, exit_code: N}")
    p.set_defaults(func=cmd_conformance)
    p = sub.add_parser(
        "hostkeys",
        help="every host's SSH host key and fingerprint: known, new, CHANGED, unreachable",
        allow_abbrev=False,
        epilog="exit codes: 0 every key known (or accepted now), 1 new keys not accepted yet, "
        "3 refused (a CHANGED key; or a bad command line or inventory), 4 unreachable hosts "
        "(docs/cli.md)",
    )
    p.add_argument("-i", "--inventory", required=True, help="the inventory (a directory, as inventories/example)")
    p.add_argument("-l", "--limit", help="the hosts to read (ansible-playbook's --limit)")
    p.add_argument(
        "--accept", action="store_true", help="append the new keys to INVENTORY/.ssh/known_hosts (never a CHANGED one)"
    )
    p.add_argument("--json", action="store_true", help="one JSON document {hosts: [...], exit_code, ...}")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per host (default 5)")
    p.add_argument("--vault-password-file", help="default: INVENTORY/.vault-password when it exists")
    p.set_defaults(func=cmd_hostkeys)
    p = sub.add_parser(
        "bootstrap",
        help="the controller's key (and a deploy user) on servers that have only a password",
        allow_abbrev=False,
        epilog="other arguments go to ansible-playbook (-K, -e, --check, -v, ...). Host keys must be "
        "known first (kunlun-fleet hostkeys --accept). Exit codes: 0 ok, 1 error, 2 failed "
        "hosts, 3 refused (a host key not known, no public key), 4 unreachable (docs/cli.md)",
    )
    _run_options(p)
    pw = p.add_mutually_exclusive_group()
    pw.add_argument("-k", "--ask-pass", action="store_true", help="prompt for the login (root or sudo) password")
    pw.add_argument(
        "--password-file",
        metavar="FILE",
        help="the password on the first line of FILE (mode 0600; for scripts and tests)",
    )
    p.add_argument("--deploy-user", metavar="NAME", help="also make this user, with the key and passwordless sudo")
    p.set_defaults(func=cmd_bootstrap)
    p = sub.add_parser("bundle", help="the offline bundle: build it, check it (docs/bundle.md)")
    bsub = p.add_subparsers(dest="action", required=True)
    b = bsub.add_parser(
        "build",
        help="download the index's files, take the vendor's, write bundle.yml and the manifest",
        allow_abbrev=False,
        epilog="exit codes: 0 complete, 2 something missing, 3 a file contradicts its pin (wrong "
        "version, name or sha256), 1 an error (docs/bundle.md)",
    )
    b.add_argument(
        "bundle_dir", metavar="DIR", help="the bundle (made when missing; a re-run changes only what changed)"
    )
    b.add_argument(
        "--vendor",
        metavar="VDIR",
        help="the vendor's files (installers, wheels, the vllm-kunlun source, the base image archive, the "
        "model directory, debs/), recognised by their content (default: DIR itself)",
    )
    b.add_argument(
        "--find-links",
        metavar="WHEELDIR",
        action="append",
        help="a directory of wheels pip may take the index's files from (pip's --find-links; repeatable)",
    )
    b.add_argument("--no-index", action="store_true", help="no package index: --find-links only (offline)")
    _bundle_options(b)
    b.set_defaults(func=cmd_bundle_build)
    for name, parent in (("check", bsub), ("bundle-check", sub)):
        c = parent.add_parser(
            name,
            help="verify an offline bundle against its manifest, its bundle.yml and the pins",
            allow_abbrev=False,
            epilog="exit codes: 0 sound, 1 not (each problem named with its fix)",
        )
        c.add_argument("bundle_dir", metavar="DIR")
        _bundle_options(c)
        c.set_defaults(func=cmd_bundle_check)
    p = sub.add_parser(
        "api-key",
        help="the fleet's API key (made once) and the teams' client keys, in INVENTORY/group_vars/all/vault.yml",
        allow_abbrev=False,
        epilog="add and rotate print the new key once, alone on stdout; add, revoke and rotate then apply the "
        "change (playbooks/api_keys.yml: every gateway's key map, a graceful reload of HAProxy). Client names: "
        "lowercase letters, digits, - and _, 'fleet' reserved. Exit codes: 0 ok, 3 refused (nothing changed), "
        "else the apply's (docs/cli.md)",
    )
    p.add_argument("-i", "--inventory", required=True, help="the inventory directory")
    p.add_argument("--vault-password-file", help="default: INVENTORY/.vault-password (made when missing)")
    p.add_argument("--show", action="store_true", help="print the fleet key (for a client); nothing else does")
    p.add_argument(
        "action",
        nargs="?",
        choices=["add", "revoke", "rotate", "list", "apply", "show"],
        help="a client key: add NAME (a new key), revoke NAME, rotate NAME (a new key, the old one refused once "
        "applied), list (names and whether applied), apply (the vault's keys to every gateway), show NAME; "
        "rotate without NAME: the fleet key (both accepted until rotate --finish; docs/gateway.md)",
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="the client (a team), for add, revoke, rotate, show")
    p.add_argument("--no-apply", action="store_true", help="change the vault only; `apply` later")
    p.add_argument(
        "--finish",
        action="store_true",
        help="with `rotate` and no NAME: end the fleet key's rotation (the old key refused from then on)",
    )
    p.add_argument("--plain", action="store_true", help="ansible-playbook's own output for the apply")
    p.set_defaults(func=cmd_api_key)
    p = sub.add_parser(
        "watchdog",
        help="the engine watchdog on the gateways: release a quarantined host",
        allow_abbrev=False,
        epilog="release writes a request on every gateway (playbooks/watchdog_release.yml); the watchdog re-admits "
        "the host at its next round only if readiness and the single-stream figure pass (docs/gateway.md "
        '"Watchdog")',
    )
    p.add_argument("-i", "--inventory", required=True, help="the inventory directory")
    p.add_argument("action", choices=["release"])
    p.add_argument("host", metavar="HOST", help="the serving host's inventory name")
    p.add_argument("--plain", action="store_true", help="ansible-playbook's own output")
    p.add_argument("--json", action="store_true", help="the run's events as JSON lines")
    p.set_defaults(func=cmd_watchdog)
    p = sub.add_parser(
        "host",
        help="membership: add serving hosts (every stage, into the gateways), or remove them (docs/membership.md)",
        allow_abbrev=False,
        epilog="remove: the capacity gate, drained from every gateway, serving stopped, out of the gateways and "
        "monitoring, the data left (playbooks/remove_host.yml); then delete the hosts from the inventory. add: the "
        "hosts already in the inventory with their host_vars and their keys known (hostkeys), then every stage on "
        "them with the image builder, the gateways and monitoring (site.yml --limit)",
    )
    p.add_argument("-i", "--inventory", required=True, help="the inventory directory")
    p.add_argument("action", choices=["add", "remove"])
    p.add_argument("hosts", metavar="HOST[,HOST]", help="the serving hosts' inventory names")
    p.add_argument("--plain", action="store_true", help="ansible-playbook's own output")
    p.add_argument("--json", action="store_true", help="the run's events as JSON lines")
    p.set_defaults(func=cmd_host)
    p = sub.add_parser(
        "bench",
        help="the load sweep, counters and report (playbooks/bench.yml; loads the fleet)",
        allow_abbrev=False,
        epilog=epilog,
    )
    _run_options(p)
    p.add_argument("--concurrency", type=_int_list, help="sweep through the fleet endpoint, e.g. 1,64,256,1024,2048")
    p.add_argument("--host-concurrency", type=_int_list, help="sweep per host (default: --concurrency)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--duration", type=float, help="seconds of requests per sweep point")
    when.add_argument("--requests", type=int, help="requests per sweep point")
    p.add_argument("--no-long", action="store_true", help="skip the long-context point")
    p.add_argument("--check", action="store_true", help="check mode: measures nothing, says so")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser(
        "upgrade",
        help="move the serving fleet to another named stack through a canary measured against the fleet",
        allow_abbrev=False,
        epilog="steps: plan (a known-bad stack refused, nothing changed), the image built and distributed ahead, the "
        "canary switched, measured against a baseline host side by side, then promoted in batches or put back "
        "(docs/upgrades.md); the report: reports/upgrade-<timestamp>/. Exit 0 promoted or unchanged, 2 rolled back "
        "or failed, 3 refused",
    )
    p.add_argument("-i", "--inventory", required=True, help="the inventory directory")
    p.add_argument("--to", required=True, metavar="STACK", help="the stack to serve (kunlun-fleet stacks lists them)")
    p.add_argument("--canary", metavar="HOST", help="the host switched first (default: the first not on STACK)")
    p.add_argument("--baseline", metavar="HOST", help="the host it is measured against (default: the next one)")
    p.add_argument("--check", action="store_true", help="what would happen: nothing changes, nothing is measured")
    p.add_argument("--plain", action="store_true", help="ansible-playbook's own output")
    p.add_argument("--json", action="store_true", help="the runs' events as JSON lines")
    p.set_defaults(func=cmd_upgrade)
    p = sub.add_parser("stacks", help="the named stacks (validated, candidate, known-bad) and the one served")
    p.add_argument("-i", "--inventory", help="the inventory directory (its site stacks and choice)")
    p.set_defaults(func=cmd_stacks)
    p = sub.add_parser("plan", help="hosts needed for a load, from the latest bench results")
    p.add_argument("--concurrency", type=int, help="concurrent requests to serve")
    p.add_argument("--output-tok-s", type=float, help="output tokens per second to serve")
    p.add_argument("--ttft-p99", help="TTFT p99 limit, e.g. 2s or 500ms")
    p.add_argument("--results", help="a results.json (default: the latest reports/bench-*/results.json)")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser(
        "estimate",
        help="bare -> serving time for an inventory's hosts, from a measured deploy (docs/performance.md)",
    )
    p.add_argument("-i", "--inventory", help="the inventory whose xpu_servers are counted")
    p.add_argument("--hosts", type=int, help="serving hosts (default: the inventory's xpu_servers)")
    p.add_argument("--from-run", metavar="ID", help="the deploy run to start from (default: the newest full deploy)")
    p.add_argument("--task-cpu-s", type=float, default=0.15, help="controller CPU seconds per host-task (0.15)")
    p.add_argument("--controller-cores", type=int, help="the controller's cores (default: this machine's)")
    p.add_argument("--forks", type=int, default=50, help="Ansible's forks (50, as ansible.cfg)")
    p.add_argument("--link-gbps", type=float, default=25.0, help="each server's link, Gb/s (25)")
    p.add_argument("--controller-gbps", type=float, default=10.0, help="the controller's link, Gb/s (10)")
    p.add_argument("--per-source", type=int, default=2, help="transfers per weights source (model_peer_per_source, 2)")
    p.add_argument("--idle-batch-max", type=int, default=0, help="serve_idle_batch_max (0: all bare hosts at once)")
    p.add_argument("--image-gb", type=float, help="the serving image's size (default: its time as measured)")
    p.add_argument("--model-gb", type=float, help="the weights' size (default: their time as measured)")
    p.add_argument("--engine-start-s", type=float, help="one engine start (default: as measured)")
    p.add_argument("--ref-image-gb", type=float, help="the reference run's image size (default: --image-gb)")
    p.add_argument("--ref-model-gb", type=float, help="the reference run's weights' size (default: --model-gb)")
    p.add_argument(
        "--ref-engine-start-s", type=float, help="the reference run's engine start (default: --engine-start-s)"
    )
    p.add_argument("--json", action="store_true", help="the estimate as JSON")
    p.set_defaults(func=cmd_estimate)
    p = sub.add_parser(
        "inventory",
        help="write a site inventory: hosts.yml from a CSV of the servers, each serving host's data disks from "
        "what it reports",
        allow_abbrev=False,
        epilog="CSV lines: name,address,role (roles xpu_server, image_builder, gateway, monitoring; several separated "
        "by ';'). Shows what it would write and asks first; never replaces a file that differs without --force (the "
        "old one kept under INVENTORY/.kunlun-fleet-backup/). --discover reads the serving hosts over SSH, read-only, "
        "their host keys known first (kunlun-fleet hostkeys). Exit codes: 0 written (or nothing to change), 1 error, "
        "2 a host's discovery failed, 3 refused (nothing written), 4 a host unreachable (docs/cli.md)",
    )
    p.add_argument("-i", "--inventory", required=True, help="the inventory directory to write (made when missing)")
    p.add_argument("--csv", metavar="FILE", help="the servers, one per line: name,address,role -> hosts.yml")
    p.add_argument(
        "--discover",
        action="store_true",
        help="read each serving host's disks over SSH (read-only) -> host_vars/<host>.yml: storage_data_disks",
    )
    p.add_argument("-l", "--limit", help="with --discover: the hosts to read (ansible-playbook's --limit)")
    p.add_argument("-y", "--yes", action="store_true", help="write without asking (for scripts)")
    p.add_argument("--force", action="store_true", help="replace files that differ (the old ones kept first)")
    p.set_defaults(func=cmd_inventory)
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
    argv = sys.argv[1:] if argv is None else list(argv)
    ns, rest = parser.parse_known_args(argv)
    ns.argv = argv
    if rest and ns.command not in ("deploy", "stage", "bench", "bootstrap"):
        parser.error("unrecognized arguments: %s" % " ".join(rest))
    return ns.func(ns, rest) if _takes_rest(ns.func) else ns.func(ns)


def _takes_rest(func):
    return func.__code__.co_argcount >= 2


if __name__ == "__main__":
    sys.exit(main())
