"""Shared test set-up: the project's module_utils and library importable as Ansible sees them."""

import sys
from pathlib import Path

import ansible.module_utils
import pytest

ROOT = Path(__file__).resolve().parent.parent
# Modules import `ansible.module_utils.<name>`: Ansible maps ansible.cfg's module_utils
# there at run time; tests do the same. library/ is importable for the modules' logic.
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
for extra in (ROOT / "library", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))


@pytest.fixture(scope="session")
def repo_root():
    return ROOT


@pytest.fixture(scope="session")
def stack_defaults():
    import yaml

    return yaml.safe_load((ROOT / "roles/kunlun_stack/defaults/main.yml").read_text())


def _run(cmd, **kw):
    import subprocess

    return subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, **kw)


@pytest.fixture(scope="session")
def sim_fleet():
    """The one sim fleet every sim/molecule/e2e test shares: `kunlun-fleet sim-up 3`.

    sim-up is idempotent (a healthy fleet is only verified), so this costs seconds when
    the fleet is already up. It is left running for the next suite; `make sim-down` ends it.
    """
    import os

    proc = _run([str(ROOT / ".venv/bin/kunlun-fleet"), "sim-up", "3"], timeout=1800,
                env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")))
    assert proc.returncode == 0, "sim-up 3 failed:\n%s\n%s" % (proc.stdout[-3000:], proc.stderr[-3000:])
    inventory = ROOT / "inventories/sim"
    assert (inventory / "hosts.yml").exists()
    return inventory
