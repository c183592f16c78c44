"""The upgrade suites on the shared sim fleet start from every host on the inventory's
pinned XRE driver. The driver pass (test_driver_rolling_sim.py) leaves the fleet on another
XRE; a session that reuses that fleet gets the pin back here first, through the driver stage
itself."""

import os
import subprocess

import pytest

from kunlun_fleet.bundle import load_pins
from kunlun_fleet.sim.testing import INVENTORY, REPO, VENV_BIN, _env, loaded_driver


@pytest.fixture(scope="session")
def fleet_on_the_pinned_driver(sim_fleet):
    """The pinned XRE version, loaded on kf-node-1..3."""
    pin = str(load_pins(INVENTORY)["kunlun_stack_driver"]["version"])
    if [loaded_driver(i) for i in (1, 2, 3)] != [pin] * 3:
        proc = subprocess.run(
            [os.path.join(VENV_BIN, "ansible-playbook"), "-i", INVENTORY, "playbooks/driver.yml"],
            cwd=REPO,
            env=_env(),
            text=True,
            capture_output=True,
            timeout=1800,
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert [loaded_driver(i) for i in (1, 2, 3)] == [pin] * 3
    return pin
