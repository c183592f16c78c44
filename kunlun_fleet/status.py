"""kunlun-fleet status: every serving host's state, read live and read-only, as one table
(or one JSON document), judged by the health rules below.

playbooks/status.yml runs through kunlun_fleet/runner/ as deploy does (the inventory's
vault password, a run report in reports/runs/<id>-status/), in check mode and quietly: the
results of its host_status and gateway tasks are taken from the run's events, and only the
table is printed at the end. The last acceptance figure per host is read here, on the
controller (the acceptance stage writes reports/acceptance.json on the controller only).

Health (health(): a pure function): a host is unhealthy when it is unreachable, its state
could not be read, kunlun-serve is not active, it does not run the current serving image,
fewer of its accelerators are ok than expected (or it has no driver facts), or - when the
inventory has gateways - it is not in every gateway's worker list, or a gateway's engine
watchdog quarantined it (its state.json: the kind, stuck or slow, and the watchdog's
reason; held when it flaps and waits for the operator). Warnings (cards below full power,
/home unreadable or nearly full, /metrics unreadable, a failed acceptance figure, a host
the watchdog suspects) are shown, never judged.

--collect DIR (write_collection()): the same run also calls library/collect_outputs.py on each
host (-e status_collect=true), which returns the raw outputs the product's parsers read, serials
and addresses masked on the host; they are masked again and written under DIR/<host>/ with an
index.json, for `kunlun-fleet conformance DIR` (kunlun_fleet/conformance.py).

Exit codes: 0 every host healthy; 2 a host unhealthy; 4 a host unreachable (whatever the
others); 1 the run itself failed (ansible-playbook stopped naming no host); 3 refused input
(a missing inventory); 130 interrupted.
"""

import base64
import datetime
import io
import json
import os
import re
import shlex
import sys
import time

from kunlun_fleet import runner

PLAYBOOK = "playbooks/status.yml"
HEALTHY, UNHEALTHY = runner.OK, runner.FAILED
UNREACHABLE = runner.UNREACHABLE
# Below this share of free space the data volume gets a warning.
LOW_FREE_PCT = 10.0
COLUMNS = (
    "host",
    "reachable",
    "OS",
    "/home",
    "driver",
    "devices",
    "power",
    "image",
    "stack",
    "service",
    "model",
    "gateway",
    "run/wait",
    "last figure",
    "health",
)


# ---------------------------------------------------------------- the run's events
def new_state():
    """What the events of a status run said: host_status results, unreachable and failed
    hosts, and the gateways' task results (None: the task did not run; []: no gateway)."""
    return {
        "results": {},
        "unreachable": {},
        "failed": {},
        "lists": None,
        "units": None,
        "alerts": None,
        "watchdog": None,
        "evidence": None,
        "outputs": {},
    }


# The playbook's task that reads the alerts of Prometheus on each monitoring host (its
# other uri task reads the gateways' worker lists).
ALERTS_TASK = "Status | The alerts firing now"
# Its slurp tasks besides the gateways' units: the engine watchdog's state on each gateway,
# and (support-bundle) the watchdog's evidence archives.
WATCHDOG_TASK = "Status | The engine watchdog's state"
EVIDENCE_TASK = "Status | The watchdog's evidence archives"
# The watchdog's state format (its state.json "version") this reads.
WATCHDOG_VERSION = 1
# A watchdog whose last round is older than this is said to be not running (as the alert
# KunlunWatchdogNotRunning says it; its rounds come every 10 s).
WATCHDOG_STALE_S = 300


def _action(data, name):
    action = data.get("task_action") or ""
    return action == name or action.endswith("." + name)


def _message(res):
    if not isinstance(res, dict):
        return str(res)
    msg = res.get("msg") or res.get("module_stderr") or res.get("stderr") or ""
    if not isinstance(msg, str):
        msg = json.dumps(msg)
    # uri's "Status code was -1 and not [200]: Request failed: <urlopen error [Errno 111] ...>"
    failed = re.search(r"Request failed: (?:<urlopen error )?(.*?)>?$", msg.strip())
    if failed:
        msg = failed.group(1)
    # One line: a connection's "... last 100 lines received:" says what matters last.
    lines = [line.strip() for line in msg.splitlines() if line.strip()]
    if len(lines) > 1 and "lines received" in lines[0]:
        lines = lines[-1:]
    msg = " ".join(lines)
    return (msg if len(msg) <= 300 else msg[:300] + " ...") or "no message"


def collect(state, event):
    """Feeds one ansible-runner event into `state` (new_state())."""
    kind = event.get("event")
    data = event.get("event_data") or {}
    host, res = data.get("host"), data.get("res")
    if _action(data, "host_status") and host:
        if kind == "runner_on_ok":
            state["results"][host] = res or {}
        elif kind == "runner_on_unreachable":
            state["unreachable"][host] = _message(res)
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            state["failed"][host] = _message(res)
        return
    if _action(data, "collect_outputs") and host:
        # status --collect: the raw outputs, masked on the host (collect_outputs).
        if kind in ("runner_on_ok", "runner_on_failed") and isinstance(res, dict):
            state["outputs"][host] = res
        elif kind == "runner_on_unreachable":
            state["outputs"][host] = {"failed": True, "msg": _message(res)}
        return
    for action, key in (("uri", "lists"), ("slurp", "units")):
        if _action(data, action):
            task = data.get("task") or ""
            if action == "uri" and task.startswith(ALERTS_TASK):
                key = "alerts"
            elif action == "slurp" and task.startswith(WATCHDOG_TASK):
                key = "watchdog"
            elif action == "slurp" and task.startswith(EVIDENCE_TASK):
                key = "evidence"
            if kind == "runner_on_skipped" and not (res or {}).get("results"):
                state[key] = []  # an empty loop: the inventory has no gateway
            elif kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable") and isinstance(res, dict):
                state[key] = [r for r in res.get("results") or [] if isinstance(r, dict)]


# ---------------------------------------------------------------- the gateways
def unit_worker_urls(text):
    """The --worker-urls of a gateway unit's ExecStart (None when it names none)."""
    joined = re.sub(r"\\\n", " ", text or "")
    for line in joined.splitlines():
        line = line.strip()
        if not line.startswith("ExecStart="):
            continue
        try:
            argv = shlex.split(line[len("ExecStart=") :])
        except ValueError:
            argv = line.split()
        if "--worker-urls" not in argv:
            return None
        urls = []
        for token in argv[argv.index("--worker-urls") + 1 :]:
            if token.startswith("-"):
                break
            urls.append(re.sub(r"([%$])\1", r"\1", token))  # the unit's %% and $$: one character
        return urls
    return None


def gateways_view(lists, units):
    """{gateway: {answering, workers, configured, error}} from the two tasks' results
    (None when they did not run)."""
    if lists is None:
        return None
    view = {}
    for item in lists:
        gw = item.get("status_gateway") or item.get("item")
        if not gw:
            continue
        entry = {"answering": False, "workers": None, "configured": None, "error": ""}
        body = item.get("json")
        if body is None and item.get("content"):  # a router that answers without a JSON content type
            try:
                body = json.loads(item["content"])
            except ValueError:
                body = None
        if item.get("unreachable"):
            entry["error"] = "unreachable: %s" % _message(item)
        elif item.get("status") == 200 and isinstance(body, dict) and isinstance(body.get("urls"), list):
            entry.update(answering=True, workers=[str(u) for u in body["urls"]])
        else:
            entry["error"] = "not answering (%s)" % (
                "HTTP %s" % item.get("status") if (item.get("status") or -1) > 0 else _message(item)
            )
        view[gw] = entry
    for item in units or []:
        gw = item.get("status_gateway") or item.get("item")
        if gw in view and item.get("content") and not item.get("failed"):
            try:
                text = base64.b64decode(item["content"]).decode("utf-8", "replace")
            except (ValueError, TypeError):
                continue
            view[gw]["configured"] = unit_worker_urls(text)
    return view


def gateway_state(worker_url, gateways, watchdog=None):
    """{state, detail, per_gateway}: in (listed by every gateway), quarantined (a gateway's
    engine watchdog drained it: `watchdog`, the row's watchdog_of(), says on which),
    drained (a gateway was started with it and no longer lists it), absent (not listed, not
    configured), unknown (a gateway did not answer, or they were not read), n/a (the
    inventory has no gateway)."""
    if gateways is None:
        return {"state": "unknown", "detail": "the gateways were not read", "per_gateway": {}}
    if not gateways:
        return {"state": "n/a", "detail": "no gateway in the inventory", "per_gateway": {}}
    quarantined = set(gw for gw, s in ((watchdog or {}).get("per_gateway") or {}).items() if s == "quarantined")
    per = {}
    for gw, g in sorted(gateways.items()):
        if gw in quarantined:
            per[gw] = "quarantined"
        elif not g["answering"]:
            per[gw] = "unknown"
        elif worker_url and worker_url in g["workers"]:
            per[gw] = "in"
        elif worker_url and g["configured"] and worker_url in g["configured"]:
            per[gw] = "drained"
        else:
            per[gw] = "absent"
    if all(s == "in" for s in per.values()):
        return {"state": "in", "detail": "listed by %s" % ", ".join(per), "per_gateway": per}
    state = next(s for s in ("quarantined", "drained", "absent", "unknown") if s in per.values())
    words = {
        "quarantined": "quarantined by the engine watchdog on %s",
        "drained": "drained (taken out with remove_worker) on %s",
        "absent": "not listed on %s",
        "unknown": "gateway %s %s",
    }
    parts = []
    for gw, s in per.items():
        if s == "in":
            continue
        parts.append(words[s] % ((gw, gateways[gw]["error"]) if s == "unknown" else gw))
    if not worker_url:
        parts.append("no worker URL for this host")
    return {"state": state, "detail": "; ".join(parts), "per_gateway": per}


# ---------------------------------------------------------------- the engine watchdog
def parse_watchdog_state(text):
    """(error, state) of a watchdog state.json's text: error "" and the state dict when it
    follows version 1 ({version, updated, interval_s, workers: {url: {host, state, kind,
    reason, since, evidence, hold, readmissions, decode_tok_s, fleet_decode_tok_s}}})."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        return "not JSON (%s)" % exc, None
    if not isinstance(data, dict):
        return "not a JSON object", None
    if data.get("version") != WATCHDOG_VERSION:
        return "version %r, kunlun-fleet reads version %d" % (data.get("version"), WATCHDOG_VERSION), None
    updated = data.get("updated")
    if isinstance(updated, bool) or not isinstance(updated, (int, float)):
        return '"updated" is not a number', None
    workers = data.get("workers")
    if not isinstance(workers, dict):
        return 'no "workers" object', None
    for url, entry in workers.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("state"), str):
            return 'worker %s has no "state"' % url, None
    return "", data


def watchdog_view(results, now=None):
    """{gateway: {state, error, updated, age_s, interval_s, workers}} from the slurp of each
    gateway's state.json; state: read, absent (no file: no watchdog there, or before its first
    round), unreadable (the file, or its format), unreachable. None when the task did not run."""
    if results is None:
        return None
    now = time.time() if now is None else now
    view = {}
    for item in results:
        gw = item.get("status_gateway") or item.get("item")
        if not gw:
            continue
        entry = {"state": "read", "error": "", "updated": None, "age_s": None, "interval_s": None, "workers": {}}
        view[gw] = entry
        if item.get("unreachable"):
            entry.update(state="unreachable", error="unreachable: %s" % _message(item))
            continue
        if not item.get("content"):
            msg = _message(item)
            if "not found" in msg.lower():
                entry.update(state="absent", error="")
            else:
                entry.update(state="unreadable", error=msg)
            continue
        try:
            text = base64.b64decode(item["content"]).decode("utf-8")
        except (ValueError, TypeError) as exc:
            entry.update(state="unreadable", error="not UTF-8 text (%s)" % exc)
            continue
        error, data = parse_watchdog_state(text)
        if error:
            entry.update(state="unreadable", error=error)
            continue
        entry.update(
            updated=float(data["updated"]),
            age_s=round(now - float(data["updated"]), 1),
            interval_s=data.get("interval_s"),
            workers=data["workers"],
        )
    return view


# The worst state a worker has on any gateway's watchdog comes first.
_WATCHDOG_ORDER = ("quarantined", "suspect", "serving", "out")


def watchdog_of(host, worker_url, watchdog):
    """What the gateways' watchdogs say of one host: {state, kind, reason, since, hold,
    evidence, decode_tok_s, fleet_decode_tok_s, gateway, per_gateway} from the gateway whose
    state is the worst (quarantined, suspect, serving, out), or None when no watchdog knows
    it. A worker is found by its URL, else by the inventory host name the watchdog gives it."""
    per, entries = {}, {}
    for gw, view in sorted((watchdog or {}).items()):
        if view.get("state") != "read":
            continue
        workers = view.get("workers") or {}
        entry = workers.get(worker_url) if worker_url else None
        if entry is None:
            entry = next((w for w in workers.values() if w.get("host") == host), None)
        if entry is None:
            continue
        per[gw] = entry.get("state") or "?"
        entries[gw] = entry
    if not per:
        return None
    rank = dict((s, i) for i, s in enumerate(_WATCHDOG_ORDER))
    gw = min(per, key=lambda g: (rank.get(per[g], len(rank)), g))
    entry = entries[gw]
    return {
        "state": per[gw],
        "kind": entry.get("kind") or "",
        "reason": entry.get("reason") or "",
        "since": entry.get("since"),
        "hold": entry.get("hold") is True,
        "evidence": entry.get("evidence") or "",
        "decode_tok_s": entry.get("decode_tok_s"),
        "fleet_decode_tok_s": entry.get("fleet_decode_tok_s"),
        "gateway": gw,
        "per_gateway": per,
    }


def quarantine_reason(host, watchdog):
    """The health reason of a quarantined host: where, the kind, the watchdog's reason, and
    whether it is held for flapping."""
    where = sorted(g for g, s in watchdog["per_gateway"].items() if s == "quarantined")
    text = "quarantined by the engine watchdog on %s" % ", ".join(where)
    if watchdog.get("kind"):
        text += " (%s)" % watchdog["kind"]
    if watchdog.get("reason"):
        text += ": %s" % watchdog["reason"]
    if watchdog.get("hold"):
        text += "; held: flapping, it is not re-admitted by itself (kunlun-fleet watchdog -i INV release %s)" % host
    return text


# ---------------------------------------------------------------- the alerts
def alerts_view(results):
    """{monitors: {host: error ("" when Prometheus answered)}, firing: [...], pending: n}
    from the alerts task's results; None when the task did not run."""
    if results is None:
        return None
    view = {"monitors": {}, "firing": [], "pending": 0}
    for item in results:
        monitor = item.get("status_monitor") or item.get("item")
        if not monitor:
            continue
        doc = item.get("json") if isinstance(item.get("json"), dict) else {}
        if item.get("unreachable"):
            view["monitors"][monitor] = "unreachable: %s" % _message(item)
            continue
        if item.get("status") != 200 or doc.get("status") != "success":
            view["monitors"][monitor] = "not answering (%s)" % (
                "HTTP %s" % item.get("status") if item.get("status", -1) > 0 else _message(item)
            )
            continue
        view["monitors"][monitor] = ""
        for alert in (doc.get("data") or {}).get("alerts") or []:
            labels, notes = alert.get("labels") or {}, alert.get("annotations") or {}
            if alert.get("state") != "firing":
                view["pending"] += 1
                continue
            view["firing"].append(
                {
                    "alert": labels.get("alertname", "?"),
                    "severity": labels.get("severity", ""),
                    "host": labels.get("host", ""),
                    "device": labels.get("device", ""),
                    "summary": notes.get("summary", ""),
                    "since": alert.get("activeAt", ""),
                    "monitor": monitor,
                }
            )
    view["firing"].sort(key=lambda a: (a["severity"] != "critical", a["alert"], _natural(a["host"]), a["device"]))
    return view


# ---------------------------------------------------------------- the acceptance figure
def read_acceptance(path):
    """{hosts, target, measured_at, file} from the acceptance stage's figures, or None."""
    try:
        with open(path) as fh:
            data = json.load(fh)
        when = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return {
        "hosts": data.get("hosts") if isinstance(data.get("hosts"), dict) else {},
        "target": data.get("target_single_stream_tok_s"),
        "file": str(path),
        "measured_at": when.isoformat(timespec="seconds"),
    }


def acceptance_of(host, acceptance):
    if not acceptance or not isinstance(acceptance["hosts"].get(host), dict):
        return None
    figures = acceptance["hosts"][host]
    rate, target = figures.get("tokens_per_s"), acceptance.get("target")
    return {
        "tokens_per_s": rate,
        "target": target,
        "pass": (rate is not None and target is not None and float(rate) >= float(target)),
        "measured_at": acceptance["measured_at"],
        "file": acceptance["file"],
    }


# ---------------------------------------------------------------- the health rules
def health(row, has_gateway):
    """Why a host is unhealthy, one reason each (empty: healthy). Pure: reads the row only.

    Unreachable; its state not read; the data volume not mounted; kunlun-serve not active; not
    running the current image; fewer accelerators ok than expected (no driver facts
    included); not in every gateway when the inventory has gateways (has_gateway)."""
    if not row.get("reachable"):
        return ["unreachable: %s" % (row.get("error") or "no answer")]
    if row.get("error"):
        return ["state not read: %s" % row["error"]]
    reasons = []
    # The data volume first: without it nothing below can serve (a data disk failed at boot).
    volume = row.get("volume") or {}
    if volume_missing(volume):
        reasons.append(
            "data volume not mounted at %s%s"
            % (
                volume.get("mount_point") or "/home",
                (
                    " (fstab: %s): its device did not appear at boot, a data disk failed or missing? "
                    "Check pvs, lvs -a -o +devices, journalctl -b -u %s" % (volume["fstab"], volume.get("mount_unit"))
                )
                if volume.get("fstab")
                else " and no fstab line for it (the storage stage has not run here)",
            )
        )
    service = row.get("service") or {}
    unit = service.get("unit") or "kunlun-serve.service"
    active = service.get("active")
    if active != "active":
        if active is None:
            reasons.append("%s %s" % (unit, service.get("error") or "unreadable"))
        elif active == "not-found":
            reasons.append("%s is not installed" % unit)
        else:
            reasons.append("%s is %s" % (unit, active))
    image = row.get("image") or {}
    if image.get("state") != "current":
        if image.get("state") == "stale":
            reasons.append(
                "image stale: runs %s%s, %s is %s"
                % (short_id(image.get("runs_id")), _tags(image), image.get("ref"), short_id(image.get("current_id")))
            )
        elif image.get("state") == "none":
            reasons.append("no serving image (no unit, no container)")
        else:
            reasons.append("image unknown: %s" % (image.get("error") or "not read"))
    driver = row.get("driver") or {}
    if driver.get("state") != "present":
        reasons.append(driver.get("error") or "no driver facts")
    else:
        expected = driver.get("expected") or driver.get("devices") or 0
        ok = driver.get("devices_ok") or 0
        if ok < expected:
            bad = driver.get("bad_devices") or []
            reasons.append(
                "accelerators %d/%d ok%s"
                % (ok, expected, (" (not ok: %s)" % ", ".join(str(b) for b in bad)) if bad else "")
            )
    held_out = (row.get("serving") or {}).get("held_out")
    if held_out:
        reasons.append("held out of service: %s" % held_out)
    gateway = row.get("gateway") or {}
    watchdog = row.get("watchdog") or {}
    if watchdog.get("state") == "quarantined":
        reasons.append(quarantine_reason(row.get("host") or "HOST", watchdog))
    # Out of a gateway for the quarantine alone: said above, once.
    out = set((gateway.get("per_gateway") or {}).values()) - {"in"}
    if has_gateway and gateway.get("state") != "in" and not (watchdog and out == {"quarantined"}):
        reasons.append("not in the gateway: %s" % (gateway.get("detail") or gateway.get("state")))
    return reasons


def volume_missing(volume):
    """Whether the host_status read found nothing mounted at the data volume's mount point
    (not a read that failed)."""
    return volume.get("mounted") is False and not (volume.get("error") or "").startswith("unreadable")


def warnings(row):
    """What an operator should see without it making the host unhealthy."""
    if not row.get("reachable") or row.get("error"):
        return []
    notes = []
    driver = row.get("driver") or {}
    if driver.get("low_power"):
        notes.append("cards below full power: %s" % ", ".join(str(i) for i in driver["low_power"]))
    volume = row.get("volume") or {}
    if volume.get("error") and not volume_missing(volume):
        notes.append("%s: %s" % (volume.get("mount_point") or "volume", volume["error"]))
    # Not mounted: the free space read is the root disk's, not the volume's.
    if volume.get("free_pct") is not None and volume["free_pct"] < LOW_FREE_PCT and not volume_missing(volume):
        notes.append("%s has %.1f%% free" % (volume.get("mount_point"), volume["free_pct"]))
    serving = row.get("serving") or {}
    if (row.get("service") or {}).get("active") == "active" and serving.get("error"):
        notes.append(serving["error"])
    for section in ("os",):
        if (row.get(section) or {}).get("error"):
            notes.append(row[section]["error"])
    figure = row.get("acceptance")
    if figure and figure.get("tokens_per_s") is not None and not figure.get("pass"):
        notes.append(
            "last acceptance figure %.1f tok/s is below the target %s"
            % (float(figure["tokens_per_s"]), figure.get("target"))
        )
    watchdog = row.get("watchdog") or {}
    if watchdog.get("state") == "suspect":
        notes.append(
            "the engine watchdog on %s suspects it%s%s"
            % (
                watchdog["gateway"],
                " (%s)" % watchdog["kind"] if watchdog.get("kind") else "",
                ": %s" % watchdog["reason"] if watchdog.get("reason") else "",
            )
        )
    return notes


def short_id(image_id):
    if not image_id:
        return "-"
    return image_id.split(":", 1)[-1][:12] if image_id.startswith("sha256:") else image_id


def _tags(image):
    tags = image.get("runs_tags") or []
    return " (%s)" % ", ".join(tags) if tags else ""


# ---------------------------------------------------------------- rows and the document
def build_row(host, state, gateways, acceptance, watchdog=None):
    has_gateway = bool(gateways)
    row = {"host": host, "reachable": host not in state["unreachable"], "error": None}
    if host in state["unreachable"]:
        row["error"] = state["unreachable"][host]
    elif host in state["failed"]:
        row["error"] = state["failed"][host]
    else:
        res = state["results"].get(host) or {}
        for key in ("os", "volume", "driver", "service", "image", "serving"):
            row[key] = res.get(key) if isinstance(res.get(key), dict) else {}
    worker_url = (row.get("serving") or {}).get("worker_url") or ""
    row["watchdog"] = watchdog_of(host, worker_url, watchdog)
    row["gateway"] = gateway_state(worker_url, gateways, row["watchdog"])
    row["acceptance"] = acceptance_of(host, acceptance)
    row["reasons"] = health(row, has_gateway)
    row["warnings"] = warnings(row)
    row["healthy"] = not row["reasons"]
    return row


def _natural(name):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def document(state, acceptance=None, now=None):
    """The status document: {hosts, healthy, gateways, watchdog, exit_code, ...}."""
    gateways = gateways_view(state["lists"], state["units"])
    watchdog = watchdog_view(state.get("watchdog"), now)
    names = set(state["results"]) | set(state["unreachable"]) | set(state["failed"])
    rows = [build_row(h, state, gateways, acceptance, watchdog) for h in sorted(names, key=_natural)]
    doc = {
        "hosts": rows,
        "healthy": bool(rows) and all(r["healthy"] for r in rows),
        "gateways": gateways,
        "watchdog": watchdog,
        "alerts": alerts_view(state.get("alerts")),
        "acceptance_file": (acceptance or {}).get("file"),
    }
    doc["exit_code"] = exit_code(rows)
    return doc


def exit_code(rows):
    """4 when a host is unreachable, else 2 when a host is unhealthy, else 0."""
    if any(not r["reachable"] for r in rows):
        return UNREACHABLE
    if any(not r["healthy"] for r in rows):
        return UNHEALTHY
    return HEALTHY


# ---------------------------------------------------------------- the table
def human_bytes(n):
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "K", "M", "G", "T", "P"):
        if value < 1024 or unit == "P":
            return ("%.0f%s" if unit == "B" else "%.1f%s") % (value, unit)
        value /= 1024.0
    return "%dB" % n


def human_age(seconds):
    if seconds is None:
        return ""
    seconds = int(seconds)
    if seconds >= 86400:
        return "%dd%dh" % (seconds // 86400, seconds % 86400 // 3600)
    if seconds >= 3600:
        return "%dh%02dm" % (seconds // 3600, seconds % 3600 // 60)
    return "%dm" % (seconds // 60) if seconds >= 60 else "%ds" % seconds


def cells(row):
    """A row's table cells, in COLUMNS order."""
    health_cell = "ok" if row["healthy"] else "UNHEALTHY: " + "; ".join(row["reasons"])
    if not row["reachable"] or row.get("error"):
        blank = ["-"] * (len(COLUMNS) - 3)
        return [row["host"], "yes" if row["reachable"] else "NO"] + blank + [health_cell]
    osr, vol, drv = row["os"], row["volume"], row["driver"]
    svc, img, srv, gw = row["service"], row["image"], row["serving"], row["gateway"]
    os_cell = " ".join(
        x for x in ((osr.get("pretty_name") or "?").replace(" GNU/Linux", ""), osr.get("kernel") or "") if x
    )
    if vol.get("size_bytes"):
        vol_cell = "%s %s %s%% free" % (
            vol.get("fstype") or "(no mount)",
            human_bytes(vol["size_bytes"]),
            ("%.0f" % vol["free_pct"]) if vol.get("free_pct") is not None else "?",
        )
    else:
        vol_cell = "unreadable"
    if drv.get("state") == "present":
        driver_cell = drv.get("version") or "?"
        devices_cell = "%s/%s" % (drv.get("devices_ok"), drv.get("expected") or drv.get("devices"))
        power_cell = {True: "ok", False: "LOW %d" % len(drv.get("low_power") or []), None: "?"}[drv.get("power_ok")]
    else:
        driver_cell = "no facts" if drv.get("state") == "absent" else "unreadable"
        devices_cell = power_cell = "-"
    image_cell = img.get("state") or "?"
    if image_cell == "stale" and "previous" in (img.get("runs_tags") or []):
        image_cell = "stale (previous)"
    service_cell = svc.get("active") or "unreadable"
    if svc.get("active") == "active" and svc.get("active_for_s") is not None:
        service_cell += " " + human_age(svc["active_for_s"])
    run, wait = srv.get("requests_running"), srv.get("requests_waiting")
    requests_cell = (
        "-" if run is None and wait is None else "%s/%s" % ("?" if run is None else run, "?" if wait is None else wait)
    )
    figure = row.get("acceptance")
    if figure and figure.get("tokens_per_s") is not None:
        figure_cell = "%.1f tok/s%s" % (float(figure["tokens_per_s"]), "" if figure["pass"] else " FAIL")
    else:
        figure_cell = "-"
    gateway_cell = gw.get("state") or "?"
    watchdog = row.get("watchdog") or {}
    if gateway_cell == "quarantined":
        marks = [m for m in (watchdog.get("kind"), "held" if watchdog.get("hold") else "") if m]
        gateway_cell += " (%s)" % ", ".join(marks) if marks else ""
    return [
        row["host"],
        "yes",
        os_cell,
        vol_cell,
        driver_cell,
        devices_cell,
        power_cell,
        image_cell,
        img.get("stack") or "-",
        service_cell,
        srv.get("model") or "-",
        gateway_cell,
        requests_cell,
        figure_cell,
        health_cell,
    ]


def render_table(doc):
    rows = [list(COLUMNS)] + [cells(r) for r in doc["hosts"]]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(COLUMNS) - 1)]
    lines = [
        "  ".join([str(c).ljust(w) for c, w in zip(r[:-1], widths, strict=True)] + [str(r[-1])]).rstrip() for r in rows
    ]
    hosts = doc["hosts"]
    unreachable = sum(1 for r in hosts if not r["reachable"])
    unhealthy = sum(1 for r in hosts if r["reachable"] and not r["healthy"])
    lines.append("")
    lines.append(
        "%d host(s): %d healthy, %d unhealthy, %d unreachable (exit %d)"
        % (len(hosts), len(hosts) - unhealthy - unreachable, unhealthy, unreachable, doc["exit_code"])
    )
    for r in hosts:
        for note in r["warnings"]:
            lines.append("  warning %s: %s" % (r["host"], note))
    gateways = doc.get("gateways")
    if gateways:
        for gw, g in sorted(gateways.items()):
            lines.append(
                "gateway %s: %s" % (gw, "%d worker(s) listed" % len(g["workers"]) if g["answering"] else g["error"])
            )
    elif gateways is None and hosts:
        lines.append("gateways: not read (no host answered)")
    for gw, w in sorted((doc.get("watchdog") or {}).items()):
        line = watchdog_line(gw, w)
        if line:
            lines.append(line)
    alerts = doc.get("alerts")
    if alerts and alerts["monitors"]:
        answered = sorted(m for m, e in alerts["monitors"].items() if not e)
        for monitor, error in sorted(alerts["monitors"].items()):
            if error:
                lines.append("monitoring %s: %s" % (monitor, error))
        if answered:
            lines.append(
                "alerts firing: %s (Prometheus on %s)%s"
                % (
                    len(alerts["firing"]) or "none",
                    ", ".join(answered),
                    "; %d pending" % alerts["pending"] if alerts["pending"] else "",
                )
            )
        for a in alerts["firing"]:
            where = a["host"] + (" device %s" % a["device"] if a["device"] else "")
            lines.append("  %s [%s] %s: %s" % (a["alert"], a["severity"] or "-", where or "-", a["summary"]))
    if doc.get("acceptance_file"):
        when = next((r["acceptance"]["measured_at"] for r in hosts if r.get("acceptance")), None)
        if when:
            lines.append("last figure: single-stream tok/s from %s (%s)" % (doc["acceptance_file"], when))
    lines += left_out_lines(doc.get("left_out"))
    if doc.get("report"):
        lines.append("report: %s" % doc["report"])
    return "\n".join(lines) + "\n"


def watchdog_line(gw, w):
    """One line on a gateway's watchdog under the table (None: nothing to say, no watchdog
    there or the gateway unreachable, which its own line says)."""
    if w["state"] == "unreadable":
        return "watchdog %s: state unreadable: %s" % (gw, w["error"])
    if w["state"] != "read":
        return None
    quarantined = []
    for url, e in sorted(w["workers"].items(), key=lambda kv: _natural(str(kv[1].get("host") or kv[0]))):
        if e.get("state") == "quarantined":
            marks = [m for m in (e.get("kind"), "held" if e.get("hold") else "") if m]
            quarantined.append(str(e.get("host") or url) + (" (%s)" % ", ".join(marks) if marks else ""))
    suspect = sum(1 for e in w["workers"].values() if e.get("state") == "suspect")
    text = "watchdog %s: %d worker(s), quarantined: %s" % (gw, len(w["workers"]), ", ".join(quarantined) or "none")
    if suspect:
        text += ", %d suspect" % suspect
    when = datetime.datetime.fromtimestamp(w["updated"], datetime.timezone.utc).isoformat(timespec="seconds")
    text += "; last round %s" % when
    if w["age_s"] is not None and w["age_s"] > WATCHDOG_STALE_S:
        text += " (%s ago: is kunlun-watchdog running?)" % human_age(w["age_s"])
    return text


def render_json(doc):
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


# ---------------------------------------------------------------- --collect DIR
def _collect_module():
    """library/collect_outputs.py (its Masker), loaded from this checkout."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "library", "collect_outputs.py")
    spec = importlib.util.spec_from_file_location("kunlun_fleet_collect_outputs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _safe_name(name):
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "output"


def write_collection(directory, outputs, hosts, when=None):
    """DIR/<host>/<file> per output and DIR/<host>/index.json, from collect_outputs' results
    ({host: result}); `hosts` (name: error) adds the hosts not collected (unreachable, not
    read). The text was masked on the host; it is masked again here (placeholders are kept),
    before anything is written. Returns {host: number of files written}."""
    masking = _collect_module()
    when = when or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    written = {}
    for host in sorted(set(outputs) | set(hosts), key=_natural):
        res = outputs.get(host) or {}
        host_dir = os.path.join(directory, _safe_name(host))
        os.makedirs(host_dir, exist_ok=True)
        entries = [dict(o) for o in res.get("outputs") or [] if isinstance(o, dict) and o.get("name")]
        masker = masking.mask_outputs(entries)
        index = {
            "host": host,
            "collected_at": when,
            "mount_point": res.get("mount_point"),
            "commands": [],
            "masked": res.get("masked") or masker.counts(),
            "error": None,
        }
        if not entries:
            index["error"] = (
                hosts.get(host)
                or (_message(res) if res else None)
                or "not collected (collect_outputs did not run on this host)"
            )
        written[host] = 0
        for o in entries:
            name = _safe_name(o["name"])
            item = {
                "command": o.get("command"),
                "file": None,
                "rc": o.get("rc"),
                "missing": bool(o.get("missing")),
                "reason": o.get("reason") or "",
                "stderr": o.get("stderr") or "",
            }
            if not o.get("missing"):
                with open(os.path.join(host_dir, name), "w") as fh:
                    fh.write(o.get("stdout") or "")
                item["file"] = name
                written[host] += 1
            index["commands"].append(item)
        with open(os.path.join(host_dir, "index.json"), "w") as fh:
            json.dump(index, fh, indent=2)
            fh.write("\n")
    return written


# ---------------------------------------------------------------- the run
class StatusRun(runner.Run):
    """The runner's run of playbooks/status.yml, quiet, that keeps the tasks' results
    (with collect: collect_outputs runs too, status_collect=true; with support, with the
    serving unit's diagnostics, status_support=true)."""

    def __init__(self, inventory, limit=None, argv=None, base=None, collect=False, support=False, label="status"):
        args = ["--check"] + (["-e", "status_collect=true"] if collect else [])
        args += ["-e", "status_support=true"] if support else []
        super().__init__(
            label,
            PLAYBOOK,
            args,
            inventory=inventory,
            limit=limit,
            output="quiet",
            argv=argv,
            stream=io.StringIO(),
            base=base,
        )
        self.state = new_state()

    def on_event(self, event):
        super().on_event(event)  # masked in place first
        collect(self.state, event)


def read_fleet(command, inventory, limit=None, argv=None, base=None, collect=False, support=False):
    """The status playbook run once, read-only: (exit code, the run, the status document).
    The document is None when the run was refused or interrupted (said on stderr)."""
    try:
        status_run = StatusRun(inventory, limit, argv=argv, base=base, collect=collect, support=support, label=command)
    except runner.Refused as exc:
        sys.stderr.write("kunlun-fleet %s: %s\n" % (command, exc))
        return runner.REFUSED, None, None
    code = status_run.run()
    if code == runner.INTERRUPTED:
        sys.stderr.write("kunlun-fleet %s: interrupted; report: %s\n" % (command, status_run.dir / "summary.md"))
        return code, status_run, None
    acceptance = read_acceptance(os.path.join(str(status_run.base), "reports", "acceptance.json"))
    return code, status_run, document(status_run.state, acceptance)


def same_inventory(a, b):
    """Two -i arguments name the same inventory (both empty: ansible.cfg's)."""
    if not a or not b:
        return not a and not b  # both ansible.cfg's
    return os.path.realpath(str(a)) == os.path.realpath(str(b))


def last_left_out(inventory, base=None):
    """The hosts the newest deploy or stage run of this inventory left out (failed or
    unreachable), from its report: {run, exit_code, exit_meaning, hosts: {host: first
    failure line}, resume}; None when that run left none out (or there is no such run)."""
    runs = [
        r
        for r in runner.list_runs(base)
        if r.get("command") in ("deploy", "stage", "host-add") and same_inventory(r.get("inventory"), inventory)
    ]
    if not runs:
        return None
    last = runs[-1]
    bad = list(last.get("failed_hosts") or []) + list(last.get("unreachable_hosts") or [])
    if not bad:
        return None
    hosts = {}
    for name in bad:
        f = (last.get("hosts") or {}).get(name, {}).get("first_failure") or {}
        message = (f.get("message") or "").splitlines()
        hosts[name] = "%s%s / %s: %s" % (
            "unreachable, " if f.get("unreachable") else "",
            f.get("stage"),
            f.get("task"),
            message[0] if message else "",
        )
    return {
        "run": last.get("id"),
        "exit_code": last.get("exit_code"),
        "exit_meaning": last.get("exit_meaning"),
        "hosts": hosts,
        "resume": last.get("resume"),
    }


def left_out_lines(left):
    """The lines under the table on the hosts the last deploy left out."""
    if not left:
        return []
    lines = [
        "last deploy %s (exit %s: %s) left out %d host(s):"
        % (left["run"], left["exit_code"], left["exit_meaning"], len(left["hosts"]))
    ]
    lines += ["  %s: %s" % (h, why) for h, why in sorted(left["hosts"].items(), key=lambda kv: _natural(kv[0]))]
    if left.get("resume"):
        lines.append("  resume: %s" % left["resume"])
    return lines


def not_collected(doc):
    """{host: why} for the hosts whose state could not be read."""
    return dict((r["host"], r["error"] or "not collected") for r in doc["hosts"] if r.get("error"))


def run(inventory, limit=None, as_json=False, argv=None, out=None, base=None, collect_dir=None):
    """Runs the status playbook, prints the table (or the JSON document), returns the exit code.
    collect_dir: also save each host's raw outputs, masked, under collect_dir/<host>/."""
    out = out or sys.stdout
    if collect_dir:
        try:
            os.makedirs(collect_dir, exist_ok=True)
        except OSError as exc:
            sys.stderr.write("kunlun-fleet status: --collect %s: %s\n" % (collect_dir, exc.strerror or exc))
            return runner.REFUSED
    code, status_run, doc = read_fleet("status", inventory, limit, argv=argv, base=base, collect=bool(collect_dir))
    if doc is None:
        return code
    report = status_run.dir / "summary.md"
    doc["report"] = str(report)
    # What the last deploy left out (its report), beside what the hosts say now.
    doc["left_out"] = last_left_out(inventory, status_run.base)
    if collect_dir:
        written = write_collection(collect_dir, status_run.state["outputs"], not_collected(doc))
        doc["collected"] = {"dir": os.path.abspath(collect_dir), "files": written}
        sys.stderr.write(
            "kunlun-fleet status: raw outputs of %d host(s) in %s (masked); check them with "
            "`kunlun-fleet conformance %s`\n" % (sum(1 for n in written.values() if n), collect_dir, collect_dir)
        )
    if not doc["hosts"]:
        code = code if code != runner.OK else runner.ERROR
        said = (status_run.summary or {}).get("error_output") or []
        sys.stderr.write(
            "kunlun-fleet status: no host was read (exit %d)%s\n  report: %s\n"
            % (code, "".join("\n  " + line for line in said), report)
        )
        if as_json:
            out.write(render_json(dict(doc, exit_code=code, error=said or ["no host was read"])))
        return code
    out.write(render_json(doc) if as_json else render_table(doc))
    return doc["exit_code"]
