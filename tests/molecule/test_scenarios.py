"""Every role's molecule scenario, on the shared sim fleet (molecule test -s NAME)."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))

pytestmark = pytest.mark.molecule


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(sim_fleet, scenario):
    env = dict(os.environ, PATH="%s:%s" % (ROOT / ".venv/bin", os.environ.get("PATH", "")),
               ANSIBLE_FORCE_COLOR="0", NO_COLOR="1", PY_COLORS="0")
    proc = subprocess.run([str(ROOT / ".venv/bin/molecule"), "test", "-s", scenario], cwd=ROOT, env=env,
                          text=True, capture_output=True, timeout=1800)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, "molecule scenario %s failed:\n%s" % (scenario, out[-6000:])
