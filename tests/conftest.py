"""Shared test set-up: the project's module_utils and library importable as Ansible sees them."""

import os
import sys
from pathlib import Path

import ansible.module_utils
import pytest
from kunlun_fleet.bundle import load_pins as stack_pins

# sim_fleet (one shared 3-host fleet per session) and fresh_host; strict skips and the
# suite runner's per-test log.
pytest_plugins = ["kunlun_fleet.sim.testing", "kunlun_fleet.sim.honest_runs"]

ROOT = Path(__file__).resolve().parent.parent
# Bytecode for this run and every Python it starts (ansible-playbook, the stand-ins, the
# bench venv's aiperf) in one tree under .cache, none beside the sources (the roles' files/
# and the stand-in's sources are copied to hosts as they are): with PYTHONDONTWRITEBYTECODE
# set, as in this machine's environment, each process compiled again what it imported and pytest
# rewrote every test module's asserts again (tests/unit's collection: 4.7 CPU-s, 1.6 with it).
os.environ["PYTHONPYCACHEPREFIX"] = os.environ.get("PYTHONPYCACHEPREFIX") or str(ROOT / ".cache" / "pycache")
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.pycache_prefix, sys.dont_write_bytecode = os.environ["PYTHONPYCACHEPREFIX"], False
# Modules import `ansible.module_utils.<name>`: Ansible maps ansible.cfg's module_utils
# there at run time; tests do the same. library/ is importable for the modules' logic.
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
for extra in (ROOT / "library", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

# The sim fleet's API key (made once, as sim-up does) and its vault password for every
# ansible command the suites run, whichever way they build their environment.
# In a scratch lane the session's fleet is the lane's own (KF_SIM_INVENTORY).
from kunlun_fleet import vault  # noqa: E402 (sys.path set just above)
from kunlun_fleet.sim.testing import INVENTORY  # noqa: E402

vault.ensure_api_key(INVENTORY)
os.environ.setdefault("ANSIBLE_VAULT_PASSWORD_FILE", vault.paths(INVENTORY)[0])


@pytest.fixture(scope="session")
def repo_root():
    return ROOT


@pytest.fixture(scope="session")
def stack_defaults():

    return stack_pins()
