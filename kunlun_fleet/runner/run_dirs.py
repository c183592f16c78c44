"""The run directories, reports/runs/<UTC timestamp>-<command>/: made, rotated (the newest
KEEP_RUNS of each command kept), listed, found by id, and the table of `kunlun-fleet runs`."""

import datetime
import json
import os
import re
import shutil
from pathlib import Path

from kunlun_fleet.runner.checkout import root
from kunlun_fleet.runner.exit_codes import Refused
from kunlun_fleet.runner.report import _duration

KEEP_RUNS = 50
RUN_ID = re.compile(r"^\d{8}T\d{6}Z-[A-Za-z0-9_.-]+$")
# A run's kind: the command after the timestamp, without the -N of a second run in the same second.
RUN_KIND = re.compile(r"^\d{8}T\d{6}Z-(.+?)(?:-\d+)?$")


def run_kind(name):
    """`deploy`, `stage-serve`, `status`, ... of a run directory's name."""
    m = RUN_KIND.match(name)
    return m.group(1) if m else name


def runs_dir(base=None):
    return Path(base or root()) / "reports" / "runs"


def new_run_dir(command, base=None, keep=None):
    """reports/runs/<UTC timestamp>-<command>/, made private; older runs beyond `keep`
    removed."""
    parent = runs_dir(base)
    parent.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_id, n = "%s-%s" % (stamp, command), 1
    while (parent / run_id).exists():
        n += 1
        run_id = "%s-%s-%d" % (stamp, command, n)
    path = parent / run_id
    path.mkdir(mode=0o700)
    rotate(parent, keep)
    return path


def rotate(parent, keep=None):
    """Keep the newest `keep` run directories of each command (default KEEP_RUNS, or
    KUNLUN_FLEET_KEEP_RUNS): a status every five minutes from cron never evicts the last
    deploy's report."""
    if keep is None:
        try:
            keep = int(os.environ.get("KUNLUN_FLEET_KEEP_RUNS") or KEEP_RUNS)
        except ValueError:
            raise Refused(
                "KUNLUN_FLEET_KEEP_RUNS=%r: give a number of runs to keep (default %d)"
                % (os.environ["KUNLUN_FLEET_KEEP_RUNS"], KEEP_RUNS)
            ) from None
    kinds = {}
    for path in sorted(p for p in Path(parent).iterdir() if p.is_dir() and RUN_ID.match(p.name)):
        kinds.setdefault(run_kind(path.name), []).append(path)
    for runs in kinds.values():
        for old in runs[: max(0, len(runs) - max(1, keep))]:
            shutil.rmtree(old, ignore_errors=True)


def list_runs(base=None):
    """Every run's summary (oldest first); a directory without one reads as 'no report'."""
    parent = runs_dir(base)
    if not parent.is_dir():
        return []
    runs = []
    for path in sorted(p for p in parent.iterdir() if p.is_dir() and RUN_ID.match(p.name)):
        try:
            runs.append(json.loads((path / "summary.json").read_text()))
        except (OSError, ValueError):
            runs.append({"id": path.name, "status": "no report (running, or killed)"})
    return runs


def find_run(run_id, base=None):
    """A run by id, unique prefix, or 'last'."""
    parent = runs_dir(base)
    names = sorted(p.name for p in parent.iterdir() if p.is_dir() and RUN_ID.match(p.name)) if parent.is_dir() else []
    if run_id in ("last", "latest") and names:
        return parent / names[-1]
    matches = [n for n in names if n == run_id] or [n for n in names if n.startswith(run_id)]
    if len(matches) != 1:
        raise Refused(
            "no run %r in %s%s"
            % (
                run_id,
                parent,
                (": it matches %s" % ", ".join(matches)) if matches else " (`kunlun-fleet runs` lists them)",
            )
        )
    return parent / matches[0]


def runs_table(runs):
    rows = [("id", "command", "status", "wall time", "hosts failed")]
    for r in runs:
        bad = list(r.get("failed_hosts") or []) + list(r.get("unreachable_hosts") or [])
        command = r.get("command", "-")
        if command == "stage" and r.get("playbook"):
            command += " " + Path(r["playbook"]).stem
        rows.append(
            (
                r.get("id", "?"),
                command,
                r.get("status", "-"),
                _duration(r.get("wall_s")),
                ("%d: %s" % (len(bad), ", ".join(bad[:5]) + (" ..." if len(bad) > 5 else ""))) if bad else "0",
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)
