"""`--json`: one JSON object per event per line, for other tools."""

import os

from kunlun_fleet.runner.masking import ANSI
from kunlun_fleet.runner.tracking import _message, _no_log


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
