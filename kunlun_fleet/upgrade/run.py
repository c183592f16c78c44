"""`kunlun-fleet upgrade -i INV --to STACK` (docs/upgrades.md): a serving fleet moved to another
named stack through a canary, promoted or rolled back on measured figures.

Each step is a playbook run through the one runner (each leaves its run report), in order:

  plan     playbooks/upgrade_plan.yml: the target stack judged by the stack rules (an unknown or
           known-bad stack is refused here, before any change), each host's served stack read,
           the canary and the baseline chosen, each host's XRE driver read. Every host on the
           target (its stack and its driver) already: unchanged.
  image    playbooks/image.yml for the target stack with image_promote false: built and proved
           once, distributed to every serving host under its own tags; nothing served changes.
  canary-driver  when the target stack's XRE driver is not the canary's: playbooks/driver.yml
           on the canary alone, for the target stack (its rolling pass: drained, serving
           stopped, the driver installed, every card verified, serving restarted and gated),
           so that the canary is measured on the whole stack.
  canary   playbooks/serve.yml on the canary alone, on the target stack's image (drained
           through the gateway, restarted, gated on readiness; the serve role puts it back on
           its image when the gate fails).
  measure  playbooks/canary.yml: the canary against the baseline, side by side (the golden
           outputs, a single stream, one concurrency point), the gate.
  then, on PASS:
  promote-driver  when other hosts need the target's driver: playbooks/driver.yml for the
           target stack, its rolling pass one host at a time behind the capacity gate.
  promote  playbooks/promote.yml for the target stack, one run: its image (distributed by the
           image step) tagged current on every host, the one before previous, then the serve
           stage's rollout: the rest rolled out by the rollout's batches behind its capacity
           gate; the inventory's kunlun_stack_stack line set to the target.
  or on FAIL:
  restore  playbooks/serve.yml on the canary alone, on the inventory's stack (its current
           image), then playbooks/driver.yml on it when its driver was changed (restore-driver;
           alone when the canary's driver pass itself failed): the canary back; no other host
           ever changed.

--check: plan, then image and canary in check mode (what they would do), nothing measured.
The report (results.json, report.md, report.html) goes to reports/upgrade-<timestamp>/.
"""

import datetime
import json
import re
from pathlib import Path

from kunlun_fleet import runner
from kunlun_fleet.upgrade import report

# The steps' playbooks, relative to the checkout.
PLAN, IMAGE, SERVE, CANARY, DRIVER, PROMOTE = (
    "playbooks/upgrade_plan.yml",
    "playbooks/image.yml",
    "playbooks/serve.yml",
    "playbooks/canary.yml",
    "playbooks/driver.yml",
    "playbooks/promote.yml",
)


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def first_failure(run_dir):
    """The first failed task's host, task and message in a step's run report, one line."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return ""
    if summary.get("error"):
        return " ".join(str(summary["error"]).split())
    for host, entry in sorted((summary.get("hosts") or {}).items()):
        failure = (entry or {}).get("first_failure")
        if failure:
            return "%s: %s: %s" % (host, failure.get("task"), " ".join(str(failure.get("message")).split()))
    return ""


def inventory_stack(inventory):
    """The stack the inventory names (its kunlun_stack_stack, else the shipped default)."""
    from kunlun_fleet import bundle

    try:
        return bundle.load_pins(inventory).get("kunlun_stack_stack")
    except (OSError, ValueError):
        return None


def set_inventory_stack(inventory, stack):
    """Set kunlun_stack_stack in the inventory's group_vars for all, where a file sets it
    (that one line rewritten), else in group_vars/all/kunlun_stack_stack.yml when group_vars/all
    is a directory. Returns the file written, or None (the operator sets it)."""
    inv = Path(inventory)
    candidates = [inv / "group_vars" / "all.yml", inv / "group_vars" / "all.yaml"]
    folder = inv / "group_vars" / "all"
    if folder.is_dir():
        candidates += sorted(folder.glob("*.yml")) + sorted(folder.glob("*.yaml"))
    line = re.compile(r"^kunlun_stack_stack:.*$", re.M)
    for path in candidates:
        if path.is_file():
            text = path.read_text()
            if line.search(text):
                new = line.sub('kunlun_stack_stack: "%s"' % stack, text, count=1)
                if new != text:
                    path.write_text(new)
                return path
    if folder.is_dir():
        path = folder / "kunlun_stack_stack.yml"
        path.write_text(
            "---\n# The stack this fleet serves, set by `kunlun-fleet upgrade` when it promoted it to every host.\n"
            'kunlun_stack_stack: "%s"\n' % stack
        )
        return path
    return None


class Upgrade:
    """One upgrade run: the steps, their results, the report."""

    def __init__(self, inventory, to, canary=None, baseline=None, check=False, output="plain", argv=None, base=None):
        self.inventory, self.to, self.check = str(inventory), to, check
        self.canary, self.baseline = canary, baseline
        self.output, self.argv = output, argv
        self.base = Path(base or runner.root())
        self.started = _now()
        self.from_stack = inventory_stack(self.inventory)
        out_dir, n = Path(report.out_dir_for(self.base / "reports", self.started)), 1
        while out_dir.exists():  # two upgrades in one second: one report each
            n += 1
            out_dir = Path("%s-%d" % (report.out_dir_for(self.base / "reports", self.started), n))
        self.out_dir = out_dir
        self.out_dir.mkdir(parents=True)
        self.steps, self.plan, self.measure = [], None, None
        self.canary_driver = False  # the canary-driver step ran (restore puts the driver back too)
        self.results = None

    # ------------------------------------------------------------------ one step
    def step(self, name, playbook, extra, limit=None, check=False):
        """Run one playbook; record the step; return (rc, message)."""
        args = ["-e", json.dumps(extra)] + (["--check", "--diff"] if check else [])
        entry = {"name": name, "started": _now(), "finished": None, "result": "ok", "message": ""}
        self.steps.append(entry)
        try:
            run = runner.Run(
                "upgrade",
                playbook,
                args,
                inventory=self.inventory,
                limit=limit,
                output=self.output,
                argv=self.argv,
                base=self.base,
                label="upgrade-" + name,
            )
        except runner.Refused as exc:
            entry.update(finished=_now(), result="failed", message=str(exc))
            return runner.REFUSED, str(exc)
        rc = run.run()
        entry["finished"] = _now()
        run_dir = getattr(run, "dir", None)
        if rc != runner.OK:
            entry["result"] = "failed"
            entry["message"] = first_failure(run_dir) if run_dir else "the run did not start"
        else:
            entry["message"] = ("check mode: " if check else "") + "run %s" % (run_dir.name if run_dir else "-")
        return rc, entry["message"]

    def skipped(self, name, message, result="skipped"):
        self.steps.append({"name": name, "started": None, "finished": None, "result": result, "message": message})

    # ------------------------------------------------------------------ the run
    def run(self):
        outcome, reason = self._run()
        return self.finish(outcome, reason)

    def _run(self):
        plan_file = self.out_dir / "plan.json"
        extra = {"upgrade_to": self.to, "upgrade_plan_file": str(plan_file)}
        if self.canary:
            extra["upgrade_canary"] = self.canary
        if self.baseline:
            extra["upgrade_baseline"] = self.baseline
        rc, message = self.step("plan", PLAN, extra)
        if rc != runner.OK or not plan_file.is_file():
            return "refused", message or "the plan could not be made"
        self.plan = json.loads(plan_file.read_text())
        if self.plan.get("unchanged"):
            return "unchanged", "every host already serves %s" % self.to
        canary, baseline = self.plan["canary"], self.plan["baseline"]
        driver_hosts = self.plan.get("driver_hosts") or []
        stack = {"kunlun_stack_stack": self.to}
        rc, message = self.step("image", IMAGE, dict(stack, image_promote=False), check=self.check)
        if rc != runner.OK:
            return "failed", "the image of %s was not built or distributed (no serving change): %s" % (self.to, message)
        if canary in driver_hosts:
            rc, message = self.step("canary-driver", DRIVER, stack, limit=canary, check=self.check)
            self.canary_driver = True
            if rc != runner.OK:
                # Its image never changed: only the driver goes back (a canary the pass held
                # out is retried on the inventory's driver; the serve stage would refuse it).
                self.step("restore-driver", DRIVER, {}, limit=canary)
                to_driver = self.plan.get("to_driver")
                return "rolled-back", "canary %s did not take XRE %s: %s" % (canary, to_driver, message)
        rc, message = self.step("canary", SERVE, dict(stack, serve_image_tag=self.to), limit=canary, check=self.check)
        if rc != runner.OK:
            self.restore(canary)
            return "rolled-back", "canary %s did not serve %s: %s" % (canary, self.to, message)
        if self.check:
            self.skipped("measure", "check mode: the canary gate measures nothing", "would-run")
            self.skipped("promote", "check mode", "would-run")
            rest = self.plan["rest"]
            driver = (
                " (XRE %s on %s first, one host at a time)" % (self.plan.get("to_driver"), ", ".join(driver_hosts))
                if driver_hosts
                else ""
            )
            return "would-upgrade", "would build %s, switch canary %s, measure it against %s, then promote to %s%s" % (
                self.to,
                canary,
                baseline,
                ", ".join(rest) or "no other host",
                driver,
            )
        measure_file = self.out_dir / "measure.json"
        rc, message = self.step(
            "measure",
            CANARY,
            {
                "upgrade_canary": canary,
                "upgrade_baseline": baseline,
                "upgrade_to": self.to,
                "upgrade_measure_file": str(measure_file),
            },
        )
        if measure_file.is_file():
            self.measure = json.loads(measure_file.read_text())
        if rc != runner.OK or not (self.measure or {}).get("passed"):
            why = (self.measure or {}).get("message") or message
            self.restore(canary)
            return "rolled-back", "canary %s against baseline %s: %s" % (canary, baseline, why)
        rc = runner.OK
        if [h for h in driver_hosts if h != canary]:
            rc, message = self.step("promote-driver", DRIVER, stack)
        if rc == runner.OK:
            rc, message = self.step("promote", PROMOTE, stack)
        if rc != runner.OK:
            why = "the canary passed, the promotion stopped: %s (--to %s again resumes it)" % (message, self.to)
            return "failed", why
        written = set_inventory_stack(self.inventory, self.to)
        self.skipped(
            "inventory",
            "kunlun_stack_stack set to %s in %s" % (self.to, written)
            if written
            else "set kunlun_stack_stack: %s in the inventory (no group_vars for all to write)" % self.to,
            "ok" if written else "failed",
        )
        return "promoted", self.measure.get("message", "PASS")

    def restore(self, canary):
        """The canary back on the inventory's stack: its current image, then its driver when the
        canary's was changed (the driver stage's rolling pass on it alone). The image first: the
        stack's image on the new driver is the state the canary step left, the old image on the
        new driver the one the old stack's floor allows."""
        self.step("restore", SERVE, {}, limit=canary)
        if self.canary_driver:
            self.step("restore-driver", DRIVER, {}, limit=canary)

    # ------------------------------------------------------------------ the report
    def read_after(self):
        """The plan step's reading after the run ({hosts: {host: stack}, drivers: {host: XRE}}),
        or None when unread."""
        if self.check or not self.plan or self.plan.get("unchanged"):
            # Nothing ran after the plan's reading: it is the state after too.
            return None
        after_file = self.out_dir / "after.json"
        rc, _ = self.step("read-after", PLAN, {"upgrade_to": self.to, "upgrade_plan_file": str(after_file)})
        self.steps.pop()  # a reading for the report, not a step of the upgrade
        try:
            after = json.loads(after_file.read_text())
            return after if isinstance(after.get("hosts"), dict) else None
        except (OSError, ValueError, AttributeError):
            return None

    def host_entry(self, host, before, after):
        """One host of the report: its stack, and its XRE driver when the plan read it."""
        entry = {
            "host": host,
            "stack_before": before["hosts"].get(host, ""),
            "stack_after": after["hosts"].get(host, ""),
            "note": self._note(host),
        }
        changed = entry["stack_after"] != entry["stack_before"]
        if host in (before.get("drivers") or {}):
            entry["driver_before"] = before["drivers"][host]
            entry["driver_after"] = (after.get("drivers") or before["drivers"]).get(host, "")
            changed = changed or entry["driver_after"] != entry["driver_before"]
        entry["changed"] = changed
        return entry

    def finish(self, outcome, reason):
        before = {"hosts": (self.plan or {}).get("hosts") or {}, "drivers": (self.plan or {}).get("drivers") or {}}
        after = self.read_after() or before
        measure = self.measure or {}
        figures = measure.get("figures")
        results = {
            "format": report.FORMAT,
            "started": self.started,
            "finished": _now(),
            "inventory": self.inventory,
            "from_stack": (self.plan or {}).get("from_stack") or self.from_stack,
            "to_stack": self.to,
            "to_status": (self.plan or {}).get("to_status"),
            "check": self.check,
            "outcome": outcome,
            "reason": " ".join(str(reason).split()),
            "canary": (self.plan or {}).get("canary") or None,
            "baseline": (self.plan or {}).get("baseline") or None,
            "thresholds": (measure.get("settings") or {}).get("thresholds"),
            "gate": measure.get("gate"),
            "figures": figures,
            "series": measure.get("series"),
            "outputs": measure.get("outputs"),
            "hosts": [self.host_entry(host, before, after) for host in before["hosts"]],
            "steps": self.steps,
        }
        self.results = results
        report.write(results, self.out_dir)
        print(report.resume_line(results, self.out_dir))
        return {
            "promoted": runner.OK,
            "unchanged": runner.OK,
            "would-upgrade": runner.OK,
            "refused": runner.REFUSED,
        }.get(outcome, runner.FAILED)

    def _note(self, host):
        plan = self.plan or {}
        if host == plan.get("canary"):
            return "canary"
        if host == plan.get("baseline"):
            return "baseline"
        return ""


def upgrade(inventory, to, **kwargs):
    """Run one upgrade; returns (exit code, Upgrade)."""
    up = Upgrade(inventory, to, **kwargs)
    return up.run(), up
