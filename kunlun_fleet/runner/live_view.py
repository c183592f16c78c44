"""The live view on a terminal: the stage bar and one row per host, or per group of hosts in
the same state beyond GROUP_ABOVE hosts (rich)."""

import time

from kunlun_fleet.runner.tracking import COUNTS

GROUP_ABOVE = 20


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
        for label, h, _hosts in _rows(tracker.hosts):
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
