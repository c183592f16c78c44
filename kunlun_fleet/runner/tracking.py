"""What happened in a run, from ansible-runner's events: the stages, the hosts, their counts
and first failures (the Tracker), read by the output and the report."""

import datetime
import json
import threading
import time

from kunlun_fleet.runner.exit_codes import BUDGET_ACTIONS
from kunlun_fleet.runner.masking import ANSI


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


def _stage_record():
    # host_tasks: the task results of the stage's hosts (ok, changed, failed, skipped,
    # unreachable); hosts: the hosts that had one - what the fleet estimate scales by.
    return {
        "start": None,
        "end": None,
        "plays": [],
        "failed": set(),
        "unreachable": set(),
        "host_tasks": 0,
        "hosts": set(),
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
        self.stages = {name: _stage_record() for name in self.stage_names}
        self.hosts = {}
        self.stage = self.play = self.task = None
        self.stats = None
        self.image_tag = None
        self.started = time.time()
        self.notes = []  # failure lines the live view prints above itself
        # The failure budget's last verdict (library/failure_budget.py, after each stage):
        # {stage, left_out, allowed, serving, within, message, seq}; `budget_stop` its failure
        # (the run stopped for every host), not a failure of the host it ran for.
        self.budget = None
        self.budget_stop = None
        self.seq = 0  # events seen, to order the budget's verdict against the hosts' failures
        self.last_failure_seq = 0

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
            record = self.stages.setdefault(stage, _stage_record())
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

    def _budget_event(self, kind, data):
        """The failure budget's verdict (the module's own result, not a host's outcome)."""
        res = data.get("res") or {}
        if kind == "runner_on_start" or kind == "runner_on_skipped":
            return
        verdict = {k: res.get(k) for k in ("left_out", "shared_left_out", "allowed", "serving")}
        verdict.update(
            stage=self.stage_of(data.get("play")),
            within=kind == "runner_on_ok",
            message=_message(res, self.masker),
            seq=self.seq,
        )
        self.budget = verdict
        if kind != "runner_on_ok":
            self.budget_stop = verdict

    def _host_event(self, kind, data, when):
        self.seq += 1
        if (data.get("resolved_action") or data.get("task_action")) in BUDGET_ACTIONS:
            self._budget_event(kind, data)
            return
        h = self.host(data["host"])
        res = data.get("res") or {}
        stage = self.stage_of(data.get("play"))
        h["stage"], h["task"] = stage, data.get("task")
        if kind != "runner_on_start" and stage in self.stages:
            self.stages[stage]["host_tasks"] += 1
            self.stages[stage]["hosts"].add(data["host"])
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
            self.last_failure_seq = self.seq
            return
        if h["state"] not in ("failed", "unreachable"):
            h["state"] = "ok"
