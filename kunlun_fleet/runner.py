"""Every command that runs a playbook (deploy, stage, bench) runs it here, through
ansible-runner's Python API: one place for the environment, the output, the run report
and the exit codes, so that each command behaves the same way.

One directory per run, the newest KEEP_RUNS (50) kept:

  reports/runs/<UTC timestamp>-<command>/
      summary.json, summary.md   the run report (secrets masked)
      site.yml                   the playbook of a `deploy --from/--only` (site.yml's imports)
      artifacts/                 ansible-runner's: stdout, job_events/, rc, status, command

Output: on a terminal a live view (the stage bar, one line per host, or per group of hosts
in the same state beyond GROUP_ABOVE hosts); `--plain`, or stdout not a terminal, prints
what ansible-playbook prints; `--json` one JSON object per event per line.

Exit codes (deploy, stage, bench):
  0    every host ok
  1    error: ansible-playbook stopped on an error that names no host (a syntax error, a
       missing file, an option it refused), or the run could not start
  2    failed hosts: a task failed on one host or more (after preflight)
  3    refused input: preflight failed on a host, or the command line was refused before
       anything ran (an unknown stage); no host was changed
  4    unreachable hosts, and no host failed
  130  interrupted (Ctrl-C or SIGTERM): the run was cancelled, its report says "interrupted"

Ctrl-C stops ansible-playbook as its own Ctrl-C would (its workers stop their tasks), then
ansible-runner's cancel ends it if it is still running CANCEL_GRACE seconds later (or at a
second Ctrl-C); the report is written in every case. A task cut mid-way is done again by
the resume command (the stages are idempotent).
"""

import configparser
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

OK, ERROR, FAILED, REFUSED, UNREACHABLE, INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_MEANING = {
    OK: "every host ok",
    ERROR: "error (no host named)",
    FAILED: "failed hosts",
    REFUSED: "refused input (preflight)",
    UNREACHABLE: "unreachable hosts",
    INTERRUPTED: "interrupted",
}
KEEP_RUNS = 50
# Seconds ansible-playbook gets to stop after Ctrl-C before it is cancelled (killed).
CANCEL_GRACE = 10
GROUP_ABOVE = 20
# The stage whose failure means the input was refused (it reads, never changes a host).
REFUSING_STAGE = "preflight"
RUN_ID = re.compile(r"^\d{8}T\d{6}Z-[A-Za-z0-9_.-]+$")
MASK = "********"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9\-._~+/]+=*")
# Interactive prompts ansible-playbook can show; answered from the operator's terminal
# before the run (ansible-playbook runs on a pseudo-terminal of its own).
PROMPTS = [
    (("-k", "--ask-pass"), "SSH password", r"^SSH password:\s*?$"),
    (("-K", "--ask-become-pass"), "BECOME password", r"^BECOME password.*:\s*?$"),
    (("-J", "--ask-vault-pass", "--ask-vault-password"), "Vault password", r"^Vault password.*:\s*?$"),
]


class Refused(Exception):
    """The command line asks for something that does not exist; nothing ran."""


def root():
    """The checkout whose playbooks run: this one, or KUNLUN_FLEET_ROOT (tests point it at
    a tree of their own)."""
    return Path(os.environ.get("KUNLUN_FLEET_ROOT") or ROOT).resolve()


def runs_dir(base=None):
    return Path(base or root()) / "reports" / "runs"


def ansible_env(inventory=None, base=None, env=None):
    """The environment of every ansible command: the checkout's ansible.cfg and, when the
    inventory is a directory with a vault password file, that file (the fleet's API key)."""
    from kunlun_fleet import vault

    env = dict(os.environ if env is None else env, ANSIBLE_CONFIG=str(Path(base or root()) / "ansible.cfg"))
    return vault.vault_env(inventory, env) if inventory and os.path.isdir(inventory) else env


def _venv_bin():
    """ansible-playbook of the venv the CLI runs from, ahead of anything else on PATH."""
    return str(Path(sys.executable).parent)


def _cfg(base, section, key, default):
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(str(Path(base) / "ansible.cfg"))
    return parser.get(section, key, fallback=default)


# ---------------------------------------------------------------- stages


def playbook_plays(path):
    """The play names of a playbook, following its import_playbook lines."""
    import yaml

    path = Path(path)
    names = []
    for entry in yaml.safe_load(path.read_text()) or []:
        imported = entry.get("ansible.builtin.import_playbook") or entry.get("import_playbook")
        if imported:
            names += playbook_plays(path.parent / imported)
        elif entry.get("name"):
            names.append(entry["name"])
    return names


def site_stages(base=None):
    """site.yml's stages in its order: [{stage, name, import, when, plays}], the stage
    named after its playbook (playbooks/<stage>.yml)."""
    import yaml

    base = Path(base or root())
    stages = []
    for entry in yaml.safe_load((base / "site.yml").read_text()) or []:
        imported = entry.get("ansible.builtin.import_playbook") or entry.get("import_playbook")
        if not imported:
            continue
        stage = {
            "stage": Path(imported).stem,
            "name": entry.get("name", Path(imported).stem),
            "import": str((base / imported).resolve()),
            "plays": playbook_plays(base / imported),
        }
        if "when" in entry:
            stage["when"] = entry["when"]
        stages.append(stage)
    return stages


def select_stages(stages, start=None, only=None):
    """The stages to run, in site.yml's order: all of them, those from `start` on, or
    those named in `only` (a comma-separated list). An unknown name is refused."""
    names = [s["stage"] for s in stages]
    wanted = [start] if start else [n.strip() for n in (only or "").split(",") if n.strip()]
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise Refused(
            "no stage %s; the stages of site.yml, in order: %s"
            % (", ".join(repr(n) for n in unknown), ", ".join(names))
        )
    if start:
        return stages[names.index(start) :]
    if only is not None:
        if not wanted:
            raise Refused("--only needs one stage or more; the stages: %s" % ", ".join(names))
        return [s for s in stages if s["stage"] in wanted]
    return list(stages)


def write_selection(stages, path):
    """A playbook of site.yml's import lines for the chosen stages (absolute paths, so it
    runs from the run's directory; each imported play keeps its playbook_dir)."""
    import yaml

    plays = []
    for s in stages:
        entry = {"name": s["name"], "ansible.builtin.import_playbook": s["import"]}
        if "when" in s:
            entry["when"] = s["when"]
        plays.append(entry)
    Path(path).write_text(
        "---\n# Written by kunlun-fleet deploy --from/--only: site.yml's stages %s.\n%s"
        % (", ".join(s["stage"] for s in stages), yaml.safe_dump(plays, sort_keys=False))
    )
    return path


# ---------------------------------------------------------------- secrets


def vault_secrets(inventory, password_file=None, password=None):
    """Every vaulted value of an inventory directory (inline `!vault` values and vaulted
    files), decrypted, to be masked wherever they would be printed or stored. Values
    shorter than 8 characters are left out (they would mask ordinary words)."""
    if not inventory or not os.path.isdir(inventory):
        return []
    from kunlun_fleet import vault as kvault

    password_file = password_file or os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE") or kvault.paths(inventory)[0]
    if password is None and not os.path.exists(password_file):
        return []
    try:
        import yaml
        from ansible.parsing.dataloader import DataLoader
        from ansible.parsing.vault import VaultLib, VaultSecret, get_file_vault_secret

        if password is not None:  # asked for at the prompt (--ask-vault-pass)
            secret = VaultSecret(password.encode())
        else:
            secret = get_file_vault_secret(filename=password_file, vault_id="default", loader=DataLoader())
            secret.load()
        vlib = VaultLib([("default", secret)])
    except Exception:  # an unreadable password file: ansible-playbook will say so itself
        return []
    found = [secret.bytes.decode(errors="replace").strip()]

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!vault", lambda loader, node: _Vaulted(loader.construct_scalar(node)))
    for path in sorted(Path(inventory).rglob("*")):
        if path.suffix not in (".yml", ".yaml", ".json", "") or not path.is_file():
            continue
        if any(part.startswith(".") for part in path.relative_to(inventory).parts):
            continue
        try:
            text = path.read_text()
            if text.startswith("$ANSIBLE_VAULT"):
                _strings(yaml.safe_load(vlib.decrypt(text.encode()).decode()), found)
            elif "!vault" in text:
                _vaulted(yaml.load(text, Loader=Loader), vlib, found)
        except Exception:
            continue
    return sorted({s for s in found if len(s) >= 8}, key=len, reverse=True)


class _Vaulted(str):
    pass


def _vaulted(data, vlib, found):
    if isinstance(data, _Vaulted):
        found.append(vlib.decrypt(str(data).encode()).decode().strip())
    elif isinstance(data, dict):
        for value in data.values():
            _vaulted(value, vlib, found)
    elif isinstance(data, list):
        for value in data:
            _vaulted(value, vlib, found)


def _strings(data, found):
    if isinstance(data, str):
        found.append(data.strip())
    elif isinstance(data, dict):
        for value in data.values():
            _strings(value, found)
    elif isinstance(data, list):
        for value in data:
            _strings(value, found)


class Masker:
    """Replaces the inventory's vaulted values and any `Bearer <token>` with ********."""

    def __init__(self, secrets=()):
        self.secrets = re.compile("|".join(re.escape(s) for s in secrets)) if secrets else None

    def text(self, text):
        if not isinstance(text, str) or not text:
            return text
        if self.secrets is not None:
            text = self.secrets.sub(MASK, text)
        return BEARER.sub(lambda m: m.group(1) + MASK, text)

    def obj(self, data):
        if isinstance(data, str):
            return self.text(data)
        if isinstance(data, dict):
            return {k: self.obj(v) for k, v in data.items()}
        if isinstance(data, list):
            return [self.obj(v) for v in data]
        return data


# ---------------------------------------------------------------- what happened


def _ts(event):
    try:
        return datetime.datetime.fromisoformat(event["created"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return time.time()


def _iso(ts):
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat(timespec="seconds") if ts else None


def _no_log(res):
    return isinstance(res, dict) and ("censored" in res or res.get("_ansible_no_log"))


def _message(res, masker):
    """A failure's message in one line or a few: msg, else stderr, else the module's own."""
    if not isinstance(res, dict):
        return ""
    if _no_log(res):
        return "(hidden: the task is no_log)"
    msg = res.get("msg") or res.get("stderr") or res.get("module_stderr") or res.get("reason") or ""
    if not isinstance(msg, str):
        msg = json.dumps(msg)
    msg = ANSI.sub("", masker.text(msg)).strip()
    return msg if len(msg) <= 2000 else msg[:2000] + " ..."


COUNTS = ("ok", "changed", "failed", "unreachable", "skipped", "rescued", "ignored")
STATS_KEYS = {
    "ok": "ok",
    "changed": "changed",
    "failures": "failed",
    "dark": "unreachable",
    "skipped": "skipped",
    "rescued": "rescued",
    "ignored": "ignored",
}


class Tracker:
    """What the events said so far: stages, hosts, counts, failures. Fed from
    ansible-runner's thread, read by the live view and the report."""

    def __init__(self, stages, masker):
        self.lock = threading.Lock()
        self.masker = masker
        self.stage_names = [s["stage"] for s in stages]
        self.play_stage = {}
        for s in stages:
            for play in s["plays"]:
                self.play_stage.setdefault(play, s["stage"])
        self.stages = {
            name: {"start": None, "end": None, "plays": [], "failed": set(), "unreachable": set()}
            for name in self.stage_names
        }
        self.hosts = {}
        self.stage = self.play = self.task = None
        self.stats = None
        self.image_tag = None
        self.started = time.time()
        self.notes = []  # failure lines the live view prints above itself

    def stage_of(self, play):
        if play in self.play_stage:
            return self.play_stage[play]
        prefix = (play or "").split("|")[0].strip().lower()
        for name in self.stage_names:
            if prefix == name.lower():
                return name
        return self.stage or (play or "-")

    def host(self, name):
        if name not in self.hosts:
            self.hosts[name] = dict(
                {k: 0 for k in COUNTS}, stage=None, task=None, state="waiting", since=time.time(), failure=None
            )
        return self.hosts[name]

    def feed(self, event):
        with self.lock:
            self._feed(event)

    def _feed(self, event):
        kind = event.get("event")
        data = event.get("event_data") or {}
        when = _ts(event)
        if kind == "playbook_on_play_start":
            self.play = data.get("play") or data.get("name")
            stage = self.stage_of(self.play)
            if stage != self.stage and self.stage in self.stages:
                self.stages[self.stage]["end"] = when
            self.stage = stage
            record = self.stages.setdefault(
                stage, {"start": None, "end": None, "plays": [], "failed": set(), "unreachable": set()}
            )
            if stage not in self.stage_names:
                self.stage_names.append(stage)
            if record["start"] is None:
                record["start"] = when
            record["end"] = None
            record["plays"].append(self.play)
            self.task = None
        elif kind == "playbook_on_task_start":
            self.task = data.get("task")
        elif kind == "playbook_on_stats":
            if self.stage in self.stages and self.stages[self.stage]["end"] is None:
                self.stages[self.stage]["end"] = when
            self.stats = {}
            for key, count in STATS_KEYS.items():
                for host, value in (data.get(key) or {}).items():
                    self.stats.setdefault(host, {k: 0 for k in COUNTS})[count] = value
            for host, counts in self.stats.items():
                h = self.host(host)
                h.update(counts)
                if h["state"] not in ("failed", "unreachable"):
                    h["state"] = "done"
                if not counts["failed"] and not counts["unreachable"]:  # rescued
                    h["failure"] = None
                    if h["state"] == "failed":
                        h["state"] = "done"
                    for record in self.stages.values():
                        record["failed"].discard(host)
        elif data.get("host") and kind in (
            "runner_on_start",
            "runner_on_ok",
            "runner_on_failed",
            "runner_on_skipped",
            "runner_on_unreachable",
        ):
            self._host_event(kind, data, when)

    def _host_event(self, kind, data, when):
        h = self.host(data["host"])
        res = data.get("res") or {}
        stage = self.stage_of(data.get("play"))
        h["stage"], h["task"] = stage, data.get("task")
        if kind == "runner_on_start":
            if h["state"] not in ("failed", "unreachable"):
                h["state"] = "running"
            h["since"] = when
            return
        if kind == "runner_on_ok":
            h["ok"] += 1
            h["changed"] += 1 if res.get("changed") else 0
            facts = res.get("ansible_facts") or {}
            if isinstance(facts, dict) and isinstance(facts.get("image_tag"), str):
                self.image_tag = facts["image_tag"]
        elif kind == "runner_on_skipped":
            h["skipped"] += 1
        elif kind == "runner_on_failed" and data.get("ignore_errors"):
            h["ok"] += 1
            h["ignored"] += 1
        else:
            unreachable = kind == "runner_on_unreachable"
            h["unreachable" if unreachable else "failed"] += 1
            failure = {
                "stage": stage,
                "play": data.get("play"),
                "task": data.get("task"),
                "role": data.get("role"),
                "unreachable": unreachable,
                "message": _message(res, self.masker),
                "time": _iso(when),
            }
            if h["failure"] is None:
                h["failure"] = failure
            h["state"] = "unreachable" if unreachable else "failed"
            self.stages.get(stage, {}).get("unreachable" if unreachable else "failed", set()).add(data["host"])
            self.notes.append((data["host"], failure))
            return
        if h["state"] not in ("failed", "unreachable"):
            h["state"] = "ok"


# ---------------------------------------------------------------- output


def json_line(event, tracker, masker):
    """One event for other tools: names, host, status and times; never a result."""
    data = event.get("event_data") or {}
    kind = event.get("event")
    line = {"event": kind, "counter": event.get("counter"), "created": event.get("created")}
    for key in ("playbook", "play", "task", "role", "host", "task_action", "start", "end", "duration"):
        if data.get(key) not in (None, ""):
            line[key] = data[key] if key != "playbook" else os.path.basename(data[key])
    if data.get("play"):
        line["stage"] = tracker.stage_of(data.get("play"))
    res = data.get("res")
    status = {
        "runner_on_start": "started",
        "runner_on_ok": "ok",
        "runner_on_failed": "failed",
        "runner_on_skipped": "skipped",
        "runner_on_unreachable": "unreachable",
        "runner_item_on_ok": "ok",
        "runner_item_on_failed": "failed",
        "runner_item_on_skipped": "skipped",
    }.get(kind)
    if status:
        if status == "failed" and data.get("ignore_errors"):
            status = "ignored"
        line["status"] = status
        if isinstance(res, dict) and status != "started":
            line["changed"] = bool(res.get("changed"))
            if _no_log(res):
                line["no_log"] = True
            elif status in ("failed", "unreachable"):
                line["msg"] = _message(res, masker)
    if kind == "playbook_on_stats":
        with tracker.lock:
            line["stats"] = tracker.stats
    if kind in ("verbose", "warning", "deprecated", "error") and event.get("stdout"):
        line["text"] = ANSI.sub("", masker.text(event["stdout"])).replace("\r\n", "\n").strip("\n")
    return {k: v for k, v in line.items() if v is not None}


def _clock(seconds):
    seconds = int(max(0, seconds))
    return (
        "%d:%02d:%02d" % (seconds // 3600, seconds % 3600 // 60, seconds % 60)
        if seconds >= 3600
        else "%d:%02d" % (seconds // 60, seconds % 60)
    )


def render(tracker, title, now=None):
    """The live view: title and elapsed time, the stage bar, one row per host (or per
    group of hosts in the same state beyond GROUP_ABOVE hosts)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    now = now or time.time()
    with tracker.lock:
        head = Text()
        head.append(title, style="bold")
        head.append("   elapsed %s" % _clock(now - tracker.started))
        bar = Text()
        for i, name in enumerate(tracker.stage_names):
            record = tracker.stages[name]
            if record["start"] is None:
                mark, style = "·", "dim"
            elif record["failed"] or record["unreachable"]:
                mark, style = "✗", "bold red"
            elif name == tracker.stage and record["end"] is None:
                mark, style = "▶", "bold yellow"
            else:
                mark, style = "✓", "green"
            if i:
                bar.append(" › ", style="dim")
            bar.append("%s %s" % (mark, name), style=style)
        table = Table(box=None, pad_edge=False, expand=False)
        for column, justify in (
            ("host", "left"),
            ("state", "left"),
            ("stage", "left"),
            ("task", "left"),
            ("ok", "right"),
            ("changed", "right"),
            ("failed", "right"),
            ("unreach.", "right"),
            ("time", "right"),
        ):
            table.add_column(
                column, justify=justify, no_wrap=True, max_width=60 if column == "task" else None, overflow="ellipsis"
            )
        for label, h, hosts in _rows(tracker.hosts):
            style = {"failed": "red", "unreachable": "magenta", "running": "yellow"}.get(h["state"])
            table.add_row(
                label,
                h["state"],
                h["stage"] or "",
                tracker.masker.text(h["task"] or ""),
                str(h["ok"]),
                str(h["changed"]),
                str(h["failed"]),
                str(h["unreachable"]),
                _clock(now - h["since"]) if h["state"] == "running" else "",
                style=style,
            )
        if not tracker.hosts:
            table.add_row("(no host reached yet)", "", "", tracker.task or "", "", "", "", "", "")
    return Group(head, bar, table)


def _rows(hosts):
    """(label, counts, names) per host; beyond GROUP_ABOVE hosts the hosts in the same
    state, stage and task share a row (failed and unreachable hosts keep their own)."""
    if len(hosts) <= GROUP_ABOVE:
        return [(name, h, [name]) for name, h in hosts.items()]
    groups = {}
    rows = []
    for name, h in hosts.items():
        if h["state"] in ("failed", "unreachable"):
            rows.append((name, h, [name]))
            continue
        groups.setdefault((h["state"], h["stage"], h["task"]), []).append((name, h))
    for (state, stage, task), members in groups.items():
        total = {k: sum(m[1][k] for m in members) for k in COUNTS}
        total.update(state=state, stage=stage, task=task, since=min(m[1]["since"] for m in members))
        names = [m[0] for m in members]
        label = names[0] if len(names) == 1 else "%s … %s (%d hosts)" % (names[0], names[-1], len(names))
        rows.append((label, total, names))
    return rows


# ---------------------------------------------------------------- runs


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
    """Keep the newest `keep` run directories (default KEEP_RUNS, or KUNLUN_FLEET_KEEP_RUNS)."""
    if keep is None:
        try:
            keep = int(os.environ.get("KUNLUN_FLEET_KEEP_RUNS") or KEEP_RUNS)
        except ValueError:
            raise Refused(
                "KUNLUN_FLEET_KEEP_RUNS=%r: give a number of runs to keep (default %d)"
                % (os.environ["KUNLUN_FLEET_KEEP_RUNS"], KEEP_RUNS)
            )
    runs = sorted(p for p in Path(parent).iterdir() if p.is_dir() and RUN_ID.match(p.name))
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
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


# ---------------------------------------------------------------- one run


class Run:
    """One playbook run: the environment, ansible-runner, the output, the report."""

    def __init__(
        self,
        command,
        playbook,
        args=(),
        inventory=None,
        limit=None,
        stages=None,
        selection=None,
        output="plain",
        resume=None,
        base=None,
        keep=None,
        argv=None,
        stream=None,
        label=None,
    ):
        self.base = Path(base or root())
        self.command = command
        self.label = label or command  # the run id's tail
        self.playbook = str(self.base / playbook)
        self.args = list(args)
        self.inventory_given = inventory
        self.inventory = self._resolve(inventory)
        self.limit = limit
        self.stages = (
            stages
            if stages is not None
            else [
                {
                    "stage": Path(playbook).stem,
                    "name": Path(playbook).stem,
                    "import": self.playbook,
                    "plays": playbook_plays(self.playbook) if os.path.exists(self.playbook) else [],
                }
            ]
        )
        self.selection = selection  # True: a deploy --from/--only (self.stages are the chosen)
        self.output = output
        # (head, tail, "from" | "only" | None): the resume command is head, --from/--only,
        # --limit, tail.
        self.resume = resume
        self.keep = keep
        self.argv = argv or ["kunlun-fleet", command] + self.args
        self.out = stream or sys.stdout
        self.interrupted = False
        self.interrupts = 0
        self.interrupted_at = None
        self.ansible_pid = None  # ansible-playbook's own process, from its events
        self.write_lock = threading.Lock()
        self.broken_pipe = False

    def _resolve(self, inventory):
        """As given when it exists from here; else from the checkout (as `deploy` always
        resolved it); else as given (ansible-playbook names what it cannot read)."""
        if not inventory:
            return None
        if os.path.exists(inventory):
            return os.path.abspath(inventory)
        if (self.base / inventory).exists():
            return str(self.base / inventory)
        if "," in inventory:  # a host list ("host1,host2,"), as ansible-playbook takes it
            return inventory
        raise Refused(
            "no inventory %r (looked in %s and in the checkout %s): give the inventory directory, "
            "e.g. -i inventories/site-a" % (inventory, os.getcwd(), self.base)
        )

    def _write(self, text):
        if self.broken_pipe:
            return
        try:
            with self.write_lock:
                self.out.write(text)
                self.out.flush()
        except BrokenPipeError:
            self.broken_pipe = True

    # -- the environment and ansible-runner's arguments

    def envvars(self):
        env = ansible_env(self.inventory, self.base)
        extra = {
            "ANSIBLE_CONFIG": env["ANSIBLE_CONFIG"],
            "PATH": _venv_bin() + os.pathsep + os.environ.get("PATH", ""),
            # ansible-runner turns host key checking off unless told: keep ansible.cfg's.
            "ANSIBLE_HOST_KEY_CHECKING": os.environ.get("ANSIBLE_HOST_KEY_CHECKING")
            or _cfg(self.base, "defaults", "host_key_checking", "True"),
        }
        if "ANSIBLE_VAULT_PASSWORD_FILE" in env:
            extra["ANSIBLE_VAULT_PASSWORD_FILE"] = env["ANSIBLE_VAULT_PASSWORD_FILE"]
        tty = self.output == "plain" and hasattr(self.out, "isatty") and self.out.isatty()
        # Its pseudo-terminal would make it colour; only a true ANSIBLE_FORCE_COLOR asks for
        # that ("0" or "false" is Ansible's boolean false, as a caller piping the output sets it).
        forced = os.environ.get("ANSIBLE_FORCE_COLOR", "").strip().lower() in ("1", "true", "yes", "on", "y", "t")
        if not tty and not forced:
            extra["ANSIBLE_NOCOLOR"] = "1"
        return extra

    def cmdline(self):
        args = []
        if self.inventory:
            args += ["-i", self.inventory]
        return args + self.args

    def passwords(self):
        """Answers to the prompts the operator asked for (-k, -K, --ask-vault-pass), read
        here, kept in memory only."""
        import getpass

        answers = {}
        for flags, label, pattern in PROMPTS:
            if any(a in flags for a in self.args):
                answers[pattern] = getpass.getpass("%s: " % label)
        return answers

    def password_file(self):
        for i, arg in enumerate(self.args):
            if arg == "--vault-password-file" and i + 1 < len(self.args):
                return self.args[i + 1]
            if arg.startswith("--vault-password-file="):
                return arg.split("=", 1)[1]
        return None

    # -- the run

    def run(self):
        self.dir = new_run_dir(self.label, self.base, self.keep)
        self.id = self.dir.name
        self.masker = Masker()
        self.tracker = Tracker(self.stages, self.masker)
        playbook = self.playbook
        if self.selection:
            playbook = str(write_selection(self.stages, self.dir / "site.yml"))
        (self.dir / "env").mkdir(mode=0o700)
        # Check for Ctrl-C every half second (ansible-runner's default is 5 s).
        (self.dir / "env" / "settings").write_text(json.dumps({"pexpect_timeout": 0.5}))
        self.started = time.time()
        status, rc, self.error = "failed", None, None
        try:
            passwords = self.passwords()
            vault_password = next((v for k, v in passwords.items() if k.startswith("^Vault")), None)
            self.masker = self.tracker.masker = Masker(
                vault_secrets(self.inventory, self.password_file(), vault_password)
            )
            status, rc = self._run(playbook, passwords)
        except KeyboardInterrupt:
            self.interrupted = True
        except Exception as exc:  # ansible-runner refused its configuration, or died
            self.error = "%s: %s" % (type(exc).__name__, exc)
            sys.stderr.write("kunlun-fleet: the run stopped on an error of its own: %s\n" % self.error)
        finally:
            self.ended = time.time()
            code = self.exit_code(rc)
            self.summary = self.report(code, status, rc)
            self._tidy_artifacts()
            self._final(code)
        return code

    def _run(self, playbook, passwords):
        import ansible_runner

        def handler(event):
            try:
                self.on_event(event)
            except Exception as exc:  # a display problem never stops the run
                sys.stderr.write("kunlun-fleet: event %s not shown: %s\n" % (event.get("event"), exc))
            return True

        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, self._interrupt)
        try:
            thread, runner = ansible_runner.run_async(
                private_data_dir=str(self.dir),
                artifact_dir=str(self.dir),
                ident="artifacts",
                project_dir=str(self.base),
                playbook=playbook,
                cmdline=shlex.join(self.cmdline()),
                limit=self.limit,
                envvars=self.envvars(),
                passwords=passwords or None,
                event_handler=handler,
                cancel_callback=self._cancel,
                quiet=True,
                suppress_env_files=True,
                fact_cache_type=None,
            )
            if self.output == "live":
                self._live(thread)
            else:
                while thread.is_alive():
                    thread.join(0.2)
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
        return runner.status, runner.rc

    def _interrupt(self, signum, frame):
        """Ctrl-C (or SIGTERM): ask ansible-playbook to stop as its own Ctrl-C does (it
        passes the signal to its workers, which stop their tasks' processes); the cancel
        below ends it for good when it has not stopped within CANCEL_GRACE seconds, or at a
        second Ctrl-C. ansible-playbook runs on a terminal of its own: the operator's Ctrl-C
        reaches this process only."""
        self.interrupts += 1
        if self.interrupts == 1:
            self.interrupted, self.interrupted_at = True, time.time()
            sys.stderr.write(
                "\nkunlun-fleet: interrupted: stopping ansible-playbook (Ctrl-C again: at once), then the report\n"
            )
            if self.ansible_pid:
                try:
                    os.kill(self.ansible_pid, signal.SIGINT)
                except OSError:
                    pass
        else:
            sys.stderr.write("kunlun-fleet: stopping ansible-playbook now\n")

    def _cancel(self):
        """ansible-runner's cancel_callback: True kills ansible-playbook's process group."""
        if not self.interrupted:
            return False
        return self.ansible_pid is None or self.interrupts > 1 or time.time() - self.interrupted_at > CANCEL_GRACE

    def _live(self, thread):
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        console = Console(file=self.out)
        title = "kunlun-fleet %s  %s%s%s" % (
            self.label.replace("-", " ", 1),
            self.inventory_given or "",
            "  --limit %s" % self.limit if self.limit else "",
            "  (check mode)" if self.check_mode() else "",
        )
        with Live(
            render(self.tracker, title),
            console=console,
            refresh_per_second=4,
            redirect_stdout=False,
            redirect_stderr=False,
        ) as live:
            while thread.is_alive():
                thread.join(0.25)
                with self.tracker.lock:
                    notes, self.tracker.notes = self.tracker.notes, []
                for host, f in notes:
                    line = Text(
                        "%s %s  %s / %s: %s"
                        % ("UNREACHABLE" if f["unreachable"] else "FAILED", host, f["stage"], f["task"], f["message"]),
                        style="magenta" if f["unreachable"] else "red",
                    )
                    live.console.print(line)
                live.update(render(self.tracker, title))
            if self.interrupted:
                with self.tracker.lock:
                    for h in self.tracker.hosts.values():
                        if h["state"] == "running":
                            h["state"] = "interrupted"
            live.update(render(self.tracker, title))

    def on_event(self, event):
        """Masks the event in place (ansible-runner then stores it masked), records it,
        and shows it as the output mode says."""
        if self.ansible_pid is None and event.get("pid"):
            self.ansible_pid = event["pid"]
        if event.get("stdout"):
            event["stdout"] = self.masker.text(event["stdout"])
        if event.get("event_data"):
            event["event_data"] = self.masker.obj(event["event_data"])
        self.tracker.feed(event)
        if self.output == "plain" and event.get("stdout"):
            self._write(event["stdout"].replace("\r\n", "\n") + "\n")
        elif self.output == "json":
            self._write(json.dumps(json_line(event, self.tracker, self.masker)) + "\n")

    # -- the outcome

    def check_mode(self):
        return any(a in ("-C", "--check") for a in self.args)

    def failed_hosts(self):
        return [h for h, v in self.tracker.hosts.items() if v["failed"] and v["failure"]]

    def unreachable_hosts(self):
        return [h for h, v in self.tracker.hosts.items() if v["unreachable"] and not v["failed"]]

    def exit_code(self, rc):
        if self.interrupted:
            return INTERRUPTED
        failed = self.failed_hosts()
        if failed:
            stages = {self.tracker.hosts[h]["failure"]["stage"] for h in failed}
            return REFUSED if REFUSING_STAGE in stages else FAILED
        if self.unreachable_hosts():
            return UNREACHABLE
        return OK if rc == 0 else ERROR

    def resume_command(self, code):
        """The command that finishes the job: from the first stage that failed (or was
        running when interrupted), for the failed and unreachable hosts when the run carried
        on to its last stage with the others, else for every host of the run (preflight and
        a stopped rollout end the run for every host)."""
        if self.resume is None or code in (OK, ERROR):
            return None
        head, tail, how = self.resume
        names = [s["stage"] for s in self.stages]
        bad = self.failed_hosts() + self.unreachable_hosts()
        started = [n for n in names if self.tracker.stages[n]["start"] is not None]
        if bad:
            firsts = [self.tracker.hosts[h]["failure"]["stage"] for h in bad]
            stage = min(firsts, key=lambda s: names.index(s) if s in names else len(names))
        else:
            stage = started[-1] if started else (names[0] if names else None)
        carried_on = bool(names) and names[-1] in started and not self.interrupted
        limit = ",".join(bad) if bad and carried_on else self.limit
        cmd = list(head)
        if how == "only" and stage in names:
            cmd += ["--only", ",".join(names[names.index(stage) :])]
        elif how == "from" and stage in names:
            cmd += ["--from", stage]
        if limit:
            cmd += ["--limit", limit]
        return self.masker.text(shlex.join(cmd + list(tail)))

    def stack(self):
        """The pins this checkout deploys, and the image tag when this run computed it."""
        import yaml

        info = {"image_tag": self.tracker.image_tag}
        try:
            pins = yaml.safe_load((self.base / "roles/kunlun_stack/defaults/main.yml").read_text()) or {}
        except (OSError, yaml.YAMLError):
            return info
        components = pins.get("kunlun_stack_components") or {}
        info["versions"] = {name: c.get("version") for name, c in components.items() if isinstance(c, dict)}
        for key, label in (("kunlun_stack_driver", "xre_driver"), ("kunlun_stack_gateway_router", "vllm_router")):
            if isinstance(pins.get(key), dict) and pins[key].get("version"):
                info["versions"][label] = pins[key]["version"]
        if isinstance(pins.get("kunlun_stack_model"), dict):
            info["model"] = pins["kunlun_stack_model"].get("name")
        return info

    def report(self, code, status, rc):
        t = self.tracker
        with t.lock:
            if self.interrupted:
                state = "interrupted"
            else:
                state = "successful" if code == OK else "failed"
            end = self.ended
            stages = []
            for name in t.stage_names:
                record = t.stages[name]
                start = record["start"]
                stop = record["end"] or (end if start else None)
                if start is None:
                    result = "not run"
                elif record["failed"] or record["unreachable"]:
                    result = "failed"
                elif record["end"] is None and self.interrupted:
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
                    if self.interrupted and h["state"] == "running"
                    else "ok"
                )
                hosts[name] = dict(
                    {k: h[k] for k in COUNTS}, result=result, last_stage=h["stage"], first_failure=h["failure"]
                )
                if result == "interrupted":  # the step it was in may be half done: the resume redoes it
                    hosts[name]["in_flight"] = {"stage": h["stage"], "task": h["task"]}
        summary = {
            "id": self.id,
            "command": self.command,
            "command_line": self.masker.text(shlex.join(self.argv)),
            "playbook": os.path.relpath(self.playbook, self.base),
            "inventory": self.inventory_given,
            "limit": self.limit,
            "stages_selected": [s["stage"] for s in self.stages] if self.selection else None,
            "check_mode": self.check_mode(),
            "start": _iso(self.started),
            "end": _iso(end),
            "wall_s": round(end - self.started, 1),
            "stages": stages,
            "hosts": hosts,
            "failed_hosts": self.failed_hosts(),
            "unreachable_hosts": self.unreachable_hosts(),
            "status": state,
            "exit_code": code,
            "exit_meaning": EXIT_MEANING.get(code),
            "ansible_rc": rc,
            "runner_status": status,
            "error": self.error,
            "resume": self.resume_command(code),
            "error_output": self.error_output() if code == ERROR else None,
            "stack": self.stack(),
            "artifacts": "artifacts/",
        }
        (self.dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (self.dir / "summary.md").write_text(summary_markdown(summary))
        return summary

    def error_output(self, lines=20):
        """What ansible-playbook said when it stopped without naming a host: from its
        first error line on (masked)."""
        try:
            text = (self.dir / "artifacts" / "stdout").read_text(errors="replace")
        except OSError:
            return [self.error] if self.error else []
        text = ANSI.sub("", self.masker.text(text)).replace("\r\n", "\n").splitlines()
        first = next((i for i, line in enumerate(text) if "ERROR" in line), max(0, len(text) - lines))
        return [line for line in text[first : first + lines]] + ([self.error] if self.error else [])

    def _tidy_artifacts(self):
        """ansible-runner's `command` file holds the whole environment: keep the command
        and its directory only. Its stdout copy is masked like everything else."""
        art = self.dir / "artifacts"
        try:
            data = json.loads((art / "command").read_text())
            (art / "command").write_text(json.dumps({"command": data.get("command"), "cwd": data.get("cwd")}))
        except (OSError, ValueError):
            pass
        try:
            text = (art / "stdout").read_text(errors="replace")
            (art / "stdout").write_text(self.masker.text(text))
        except OSError:
            pass
        shutil.rmtree(self.dir / "env", ignore_errors=True)

    def _final(self, code):
        s = self.summary
        path = (
            os.path.relpath(self.dir / "summary.md")
            if str(self.dir).startswith(os.getcwd())
            else str(self.dir / "summary.md")
        )
        if self.output == "json":
            self._write(
                json.dumps(
                    {
                        "event": "kunlun_fleet_summary",
                        "id": s["id"],
                        "status": s["status"],
                        "exit_code": code,
                        "failed_hosts": s["failed_hosts"],
                        "unreachable_hosts": s["unreachable_hosts"],
                        "report": str(self.dir / "summary.json"),
                        "resume": s["resume"],
                    }
                )
                + "\n"
            )
            return
        lines = [
            "",
            "kunlun-fleet %s: %s in %s (exit %d: %s)"
            % (self.command, s["status"], _duration(s["wall_s"]), code, EXIT_MEANING.get(code, "?")),
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
        if s.get("error_output"):
            lines.append("  " + s["error_output"][0])
        if not s["hosts"] and code == OK:
            lines.append("  no host was reached: check the inventory (-i) and --limit")
        lines.append("report: %s" % path)
        if s["resume"]:
            lines.append("resume: %s" % s["resume"])
        self._write("\n".join(lines) + "\n")


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


def run_playbook(command, playbook, args=(), **kwargs):
    """Runs a playbook as `command` and returns the exit code (see the module's doc)."""
    try:
        run = Run(command, playbook, args, **kwargs)
    except Refused as exc:
        sys.stderr.write("kunlun-fleet %s: %s\n" % (command, exc))
        return REFUSED
    return run.run()
