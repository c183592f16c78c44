"""Every role's molecule scenario, on the shared sim fleet (molecule test -s NAME)."""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))

pytestmark = pytest.mark.molecule


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(sim_fleet, scenario):
    env = dict(
        os.environ,
        PATH="%s:%s" % (ROOT / ".venv/bin", os.environ.get("PATH", "")),
        ANSIBLE_FORCE_COLOR="0",
        NO_COLOR="1",
        PY_COLORS="0",
    )
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/molecule"), "test", "-s", scenario],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=1800,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, "molecule scenario %s failed:\n%s\n--- the output's end:\n%s" % (
        scenario,
        failures(out),
        out[-6000:],
    )


def failures(out):
    """The failed tasks, each after its TASK line, and molecule's failed step: a failed
    verify is followed by destroy's output, which would push them out of the tail."""
    # Lines may carry molecule's border ("  │ ") when it decorates its output.
    lines = [re.sub(r"^\s*│ ?", "", text) for text in out.splitlines()]
    task, found = "", []
    for i, line in enumerate(lines):
        if line.startswith("TASK ["):
            task = line.rstrip("* ")
        elif re.match(r"(fatal|failed): \[", line) and not ignored(lines[i + 1 :]):
            found += [task, line[:1500]]
        elif ("CRITICAL" in line and "glob failed" not in line) or "ERROR]" in line:
            # Idempotence names the tasks that changed on the lines after it. (Every run
            # says it found no molecule/default: that one is not a failure.)
            found += [line[:1500]] + [nxt[:300] for nxt in lines[i + 1 : i + 8] if nxt.lstrip().startswith("*")]
    return "\n".join(found[-20:]) or "(no failed task in the output)"


def ignored(rest):
    """Whether the failure whose result these lines continue was ignored: Ansible prints
    "...ignoring" after the result, which may span many lines (YAML), before the next task."""
    for line in rest:
        if line.startswith(("TASK [", "PLAY ", "RUNNING HANDLER [")) or re.match(
            r"(fatal|failed|ok|changed): \[", line
        ):
            return False
        if line.strip() == "...ignoring":
            return True
    return False
