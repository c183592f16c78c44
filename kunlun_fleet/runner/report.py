"""The run report: summary.json's document, summary.md for a person, and the lines a run
prints at its end."""

import os
import shlex
from pathlib import Path

from kunlun_fleet.runner.exit_codes import ERROR, EXIT_MEANING, OK, PARTIAL
from kunlun_fleet.runner.tracking import COUNTS, _iso


def _duration(seconds):
    if seconds is None:
        return "-"
    if seconds < 60:
        return "%.1f s" % seconds
    seconds = int(round(seconds))
    return (
        "%dh%02dm%02ds" % (seconds // 3600, seconds % 3600 // 60, seconds % 60)
        if seconds >= 3600
        else "%dm%02ds" % (seconds // 60, seconds % 60)
    )


def stack_info(base, image_tag, inventory=None, stack=None):
    """The stack the run deploys (`stack`, else the inventory's kunlun_stack_stack, else the
    checkout's default) and its pins as the checkout at base has them, and the image tag when
    the run computed it."""
    import yaml

    info = {"image_tag": image_tag}
    try:
        pins = yaml.safe_load((Path(base) / "roles/kunlun_stack/defaults/main.yml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return info
    from kunlun_fleet.bundle import load_pins, module_utils

    module_utils()
    from ansible.module_utils.kunlun_stack import resolve_pins

    if inventory:
        try:
            chosen = load_pins(inventory)
            for key in ("kunlun_stack_stack", "kunlun_stack_site_stacks"):
                pins[key] = chosen.get(key, pins.get(key))
        except (OSError, ValueError, yaml.YAMLError):
            pass
    pins = resolve_pins(pins, stack)
    info["name"] = pins.get("kunlun_stack_stack")
    components = pins.get("kunlun_stack_components") or {}
    info["versions"] = {name: c.get("version") for name, c in components.items() if isinstance(c, dict)}
    for key, label in (("kunlun_stack_driver", "xre_driver"), ("kunlun_stack_gateway_router", "vllm_router")):
        if isinstance(pins.get(key), dict) and pins[key].get("version"):
            info["versions"][label] = pins[key]["version"]
    if isinstance(pins.get("kunlun_stack_model"), dict):
        info["model"] = pins["kunlun_stack_model"].get("name")
    return info


def _budget(verdict):
    """The failure budget's verdict as the report keeps it (None: no stage checked it)."""
    if not verdict:
        return None
    return {
        k: verdict.get(k) for k in ("stage", "left_out", "shared_left_out", "allowed", "serving", "within", "message")
    }


def build_summary(run, code, status, rc):
    """The run report (summary.json's document) of a run that ended with exit code `code`."""
    t = run.tracker
    with t.lock:
        if run.interrupted:
            state = "interrupted"
        else:
            state = "successful" if code == OK else "failed"
        end = run.ended
        stages = []
        for name in t.stage_names:
            record = t.stages[name]
            start = record["start"]
            stop = record["end"] or (end if start else None)
            if start is None:
                result = "not run"
            elif record["failed"] or record["unreachable"]:
                result = "failed"
            elif record["end"] is None and run.interrupted:
                result = "interrupted"
            else:
                result = "ok"
            stages.append(
                {
                    "stage": name,
                    "plays": record["plays"],
                    "start": _iso(start),
                    "end": _iso(stop),
                    "wall_s": round(stop - start, 1) if start else None,
                    "result": result,
                    "failed_hosts": sorted(record["failed"]),
                    "unreachable_hosts": sorted(record["unreachable"]),
                    "hosts": len(record["hosts"]),
                    "host_tasks": record["host_tasks"],
                }
            )
        hosts = {}
        for name, h in t.hosts.items():
            result = (
                "failed"
                if h["failed"] and h["failure"]
                else "unreachable"
                if h["unreachable"]
                else "interrupted"
                if run.interrupted and h["state"] == "running"
                else "ok"
            )
            hosts[name] = dict(
                {k: h[k] for k in COUNTS}, result=result, last_stage=h["stage"], first_failure=h["failure"]
            )
            if result == "interrupted":  # the step it was in may be half done: the resume redoes it
                hosts[name]["in_flight"] = {"stage": h["stage"], "task": h["task"]}
    summary = {
        "id": run.id,
        "command": run.command,
        "command_line": run.masker.text(shlex.join(run.argv)),
        "playbook": os.path.relpath(run.playbook, run.base),
        "inventory": run.inventory_given,
        "limit": run.limit,
        "stages_selected": [s["stage"] for s in run.stages] if run.selection else None,
        "check_mode": run.check_mode(),
        "start": _iso(run.started),
        "end": _iso(end),
        "wall_s": round(end - run.started, 1),
        "stages": stages,
        "hosts": hosts,
        "failed_hosts": run.failed_hosts(),
        "unreachable_hosts": run.unreachable_hosts(),
        "status": state,
        "exit_code": code,
        "exit_meaning": EXIT_MEANING.get(code),
        "ansible_rc": rc,
        "runner_status": status,
        "error": run.error,
        "resume": run.resume_command(code),
        # The failure budget's last verdict, and its refusal when it stopped the run.
        "failure_budget": _budget(t.budget),
        "stopped_by_budget": (t.budget_stop or {}).get("message"),
        "error_output": run.error_output() if code == ERROR else None,
        "stack": run.stack(),
        "artifacts": "artifacts/",
    }
    return summary


def closing_lines(command, s, code, path):
    """The lines a run prints at its end (not with --json): the outcome, each failed or
    unreachable host's first failure, the report's path and the resume command."""
    lines = [
        "",
        "kunlun-fleet %s: %s in %s (exit %d: %s)"
        % (command, s["status"], _duration(s["wall_s"]), code, EXIT_MEANING.get(code, "?")),
    ]
    for host in s["failed_hosts"] + s["unreachable_hosts"]:
        f = s["hosts"][host]["first_failure"] or {}
        lines.append(
            "  %s %s: %s / %s: %s"
            % (
                "UNREACHABLE" if f.get("unreachable") else "FAILED",
                host,
                f.get("stage"),
                f.get("task"),
                (f.get("message") or "").splitlines()[0] if f.get("message") else "",
            )
        )
    if s.get("stopped_by_budget"):
        lines.append("  STOPPED by the failure budget: %s" % s["stopped_by_budget"].splitlines()[0])
    elif code == PARTIAL:
        b = s["failure_budget"]
        lines.append(
            "  %d host(s) left out, within the failure budget of %d (kunlun_stack_failure_budget); "
            "every other host finished" % (len(b["left_out"] or []), b["allowed"] or 0)
        )
    if s.get("error_output"):
        lines.append("  " + s["error_output"][0])
    if not s["hosts"] and code == OK:
        lines.append("  no host was reached: check the inventory (-i) and --limit")
    lines.append("report: %s" % path)
    if s["resume"]:
        lines.append("resume: %s" % s["resume"])
    return lines


def summary_markdown(s):
    """summary.md: the same report for a person."""
    out = ["# kunlun-fleet %s: %s" % (s["command"], s["status"]), ""]
    facts = [
        ("run", s["id"]),
        ("command", "`%s`" % s["command_line"]),
        ("playbook", s["playbook"]),
        ("inventory", s["inventory"] or "(ansible.cfg's)"),
        ("limit", s["limit"] or "(all hosts)"),
    ]
    if s.get("stages_selected"):
        facts.append(("stages", ", ".join(s["stages_selected"])))
    if s.get("check_mode"):
        facts.append(("mode", "check (nothing changed)"))
    facts += [
        ("started", s["start"]),
        ("ended", s["end"]),
        ("wall time", _duration(s["wall_s"])),
        ("exit code", "%d (%s)" % (s["exit_code"], s["exit_meaning"])),
    ]
    out += ["| | |", "|---|---|"] + ["| %s | %s |" % (k, v) for k, v in facts] + [""]
    out += ["## Stages", "", "| stage | wall time | result |", "|---|---:|---|"]
    for st in s["stages"]:
        out.append("| %s | %s | %s |" % (st["stage"], _duration(st["wall_s"]), st["result"]))
    out += ["| **total** | **%s** | |" % _duration(s["wall_s"]), ""]
    out += [
        "## Hosts",
        "",
        "| host | ok | changed | failed | unreachable | skipped | result |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, h in s["hosts"].items():
        out.append(
            "| %s | %d | %d | %d | %d | %d | %s |"
            % (name, h["ok"], h["changed"], h["failed"], h["unreachable"], h["skipped"], h["result"])
        )
    if not s["hosts"]:
        out.append("| (no host reached) | | | | | | |")
    out.append("")
    bad = s["failed_hosts"] + s["unreachable_hosts"]
    if bad:
        out += ["## First failure per host", ""]
        for name in bad:
            f = s["hosts"][name]["first_failure"] or {}
            out.append(
                '- **%s** (%s), stage %s, task "%s"%s:'
                % (
                    name,
                    "unreachable" if f.get("unreachable") else "failed",
                    f.get("stage"),
                    f.get("task"),
                    ", role %s" % f["role"] if f.get("role") else "",
                )
            )
            out += ["", "  ```", *["  " + line for line in (f.get("message") or "").splitlines()], "  ```", ""]
    budget = s.get("failure_budget")
    if budget and (budget["left_out"] or s.get("stopped_by_budget")):
        out += ["## Failure budget", ""]
        if s.get("stopped_by_budget"):
            out += [
                "The run stopped for every host after stage %s:" % budget["stage"],
                "",
                "```",
                s["stopped_by_budget"],
                "```",
                "",
            ]
        else:
            out += [
                "%d host(s) left out (%s), within the budget of %d of %d serving hosts: every other host finished."
                % (len(budget["left_out"]), ", ".join(budget["left_out"]), budget["allowed"], budget["serving"]),
                "",
            ]
    if s.get("error_output"):
        out += ["## What ansible-playbook said", "", "```", *s["error_output"], "```", ""]
    flight = [(name, h["in_flight"]) for name, h in s["hosts"].items() if h.get("in_flight")]
    if flight:
        out += ["## In flight when interrupted", ""]
        out += ['- **%s**: stage %s, task "%s"' % (name, f["stage"], f["task"]) for name, f in flight] + [""]
    if s["resume"]:
        out += ["## Resume", "", "```", s["resume"], "```", ""]
    stack = s.get("stack") or {}
    if stack.get("versions") or stack.get("image_tag"):
        out += ["## Stack", ""]
        if stack.get("name"):
            out.append("Stack: %s." % stack["name"])
        if stack.get("versions"):
            out.append(
                "Pins (roles/kunlun_stack/defaults/main.yml): "
                + ", ".join("%s %s" % (k, v) for k, v in stack["versions"].items())
                + "."
            )
        if stack.get("model"):
            out.append("Model: %s." % stack["model"])
        out.append("Image tag: %s." % (stack.get("image_tag") or "not computed in this run (no image stage)"))
        out.append("")
    out.append("ansible-runner's artifacts (events, stdout): `%s`" % s["artifacts"])
    return "\n".join(out) + "\n"
