"""Serve refuses bad input on a sim host (kf-node-3, or a scratch lane's) before it changes
anything there."""

import os
import subprocess
import time

import pytest

from kunlun_fleet.sim.testing import INVENTORY, REPO, VENV_BIN, _env, lane_host, sim, ssh

pytestmark = [pytest.mark.sim, pytest.mark.slow]
INDEX, HOST = lane_host(3)


def serve(*extra):
    proc = subprocess.run(
        [os.path.join(VENV_BIN, "ansible-playbook"), "-i", INVENTORY, "playbooks/serve.yml", *extra],
        cwd=REPO,
        env=_env(),
        text=True,
        capture_output=True,
        timeout=900,
    )
    return proc.returncode, proc.stdout + proc.stderr


def nothing_written(host):
    left = ssh(host, "ls -d /etc/systemd/system/kunlun-serve.service /etc/kunlun-serve 2>&1 || true").stdout
    return left.count("No such file or directory") == 2


@pytest.fixture(scope="module")
def host(_hosts_to_reset):
    """One reset for both refusals: each proves it wrote nothing, so the next finds the host
    as the reset left it (the squatter is stopped in between)."""
    sim("sim-reset", str(INDEX))
    _hosts_to_reset.add(INDEX)
    return INDEX


def test_serving_port_taken_by_another_program(host):
    ssh(host, "systemd-run --unit kf-port-squatter python3 -m http.server 8000 --bind 0.0.0.0")
    try:
        deadline = time.monotonic() + 60
        while ssh(host, "ss -Htln 'sport = :8000' | grep -q .", check=False).returncode != 0:
            assert time.monotonic() < deadline, "the squatter never listened on 8000"
            time.sleep(0.5)
        rc, out = serve("--limit", HOST)
    finally:
        ssh(host, "systemctl stop kf-port-squatter", check=False)
    assert rc != 0, out[-3000:]
    assert "Port 8000 on %s is taken by another program" % HOST in out, out[-3000:]
    assert "kunlun_stack_serving_overrides: {port: N}" in out
    assert nothing_written(host)


def test_no_api_key_in_the_vault(host):
    rc, out = serve("--limit", HOST, "-e", "vault_kunlun_api_key=''")
    assert rc != 0
    assert "No API key for the fleet" in out and "kunlun-fleet api-key -i <inventory>" in out, out[-3000:]
    assert nothing_written(host)


def test_a_host_held_out_by_the_driver_stage_is_left_to_it(host):
    """The driver stage's rolling pass held this host out (its reason in
    /etc/kunlun-serve/held-out): serve refuses it, naming the reason and the driver stage,
    which checks the driver before it serves again (tests/upgrade/test_driver_rolling_sim.py)."""
    reason = "2026-12-04T23:40:00Z driver rolling pass: xpu 3 ERR!"
    ssh(host, "mkdir -p /etc/kunlun-serve && echo '%s' > /etc/kunlun-serve/held-out" % reason)
    try:
        rc, out = serve("--limit", HOST)
        left = ssh(host, "ls -A /etc/kunlun-serve; ls /etc/systemd/system/kunlun-serve.service 2>&1 || true").stdout
    finally:
        ssh(host, "rm -rf /etc/kunlun-serve")
    assert rc != 0, out[-3000:]
    assert "%s is held out of service: %s" % (HOST, reason) in out, out[-3000:]
    assert "run playbooks/driver.yml" in out
    # Nothing written beside the reason: no unit, no configuration.
    assert left.split("\n")[0] == "held-out" and "No such file or directory" in left, left
