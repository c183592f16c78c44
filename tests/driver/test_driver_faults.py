"""The driver stage against one sim host (kf-node-3, or a scratch lane's): bad input is
refused with a clear message and nothing changes on the host; VD cards and their module
option.

Each test runs `playbooks/driver.yml --limit HOST -i INVENTORY` and compares a snapshot of
what the role could touch, taken before and after. The tests share two resets (`kunlun-fleet
sim-reset HOST [--fault NAME=VALUE]`): a host holding an older XRE, then one without a
driver (bare_host), on which the stage ends up installing the pinned driver for the tests
of a host holding it (pinned_host; alone, they reset with it). A refusal changes nothing
(its snapshot proves it), so the next test finds the host as the one before left it; the
faults the kit reads at every call (device count, a device in error, firmware, power cap,
card variant) are rewritten in place between tests.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kunlun_fleet.sim import testing
from kunlun_fleet.sim.config import BUNDLE_DIR
from kunlun_fleet.bundle import load_pins as stack_pins

pytestmark = [pytest.mark.sim, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
# The suite's host and its inventory: a scratch lane's, or kf-node-3 of the shared fleet.
INVENTORY = Path(testing.INVENTORY)
INDEX, HOST = testing.lane_host(3)
PINS = stack_pins()
PIN = PINS["kunlun_stack_driver"]["version"]
# The installer's place in the sim bundle (bundle.yml's driver; the vendor's file name).
ARTIFACT = "drivers/xre-Linux-x86_64-%s.run" % PIN
OLD = "5.0.21.10"

# What the role may change, and what must stay as it was when it refuses.
SNAPSHOT = r"""
for f in /usr/local/xpu/version /usr/local/bin/xpu-smi /var/run/reboot-required; do
  [ -e "$f" ] && echo "$f $(sha256sum < "$f")" || echo "$f absent"; done
for d in /etc/modprobe.d /etc/modules-load.d /etc/ansible /home/newdata /usr/src; do
  echo "== $d"; [ -d "$d" ] && find "$d" -xdev -printf '%p %y %m\n' | sort; done
for f in /etc/modprobe.d/* /etc/modules-load.d/*; do [ -f "$f" ] && sha256sum "$f"; done
echo "== packages"; dpkg-query -W -f '${Package} ${Status}\n' gcc make 'linux-headers-*' 2>/dev/null | sort
echo "== modules"; lsmod | awk '$1 ~ /^kunlun/ {print $1, $3}' | sort
echo "== nodes"; ls /dev | grep '^xpu' | sort
"""


def _env():
    return dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_DEPRECATION_WARNINGS="False",
        PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")),
    )


# Which shared reset the host is in ("bare", "pinned"), or None once a test changed it
# beyond what _reuse undoes (any other reset, a converge, an install).
_HOST = {"kind": None}
# The faults the kit's xpu-smi and lspci read at every call (not at boot or module load).
PER_CALL = ("xpu_devices", "xpu_error_device", "xpu_firmware", "xpu_power_cap", "xpu_card_variant")


def sim_reset(*faults):
    _HOST["kind"] = None
    args = [str(VENV_BIN / "kunlun-fleet"), "sim-reset", HOST]
    for fault in faults:
        args += ["--fault", fault]
    proc = subprocess.run(args, cwd=REPO, env=_env(), text=True, capture_output=True, timeout=900)
    assert proc.returncode == 0, "sim-reset %s failed:\n%s%s" % (HOST, proc.stdout, proc.stderr)


def _reuse(kind, machine, faults):
    """The host of the ``kind`` reset with ``faults`` (each one the kit reads at every call).
    The first call resets the host; the next ones, while no other reset or change came
    between, rewrite the kit's faults file and remove what the previous test added (a
    pending-reboot flag, a process holding a device)."""
    assert all(f.split("=", 1)[0] in PER_CALL for f in faults), faults
    if _HOST["kind"] != kind:
        sim_reset(*(machine + faults))
        _HOST["kind"] = kind
        return
    text = "".join("%s\n" % f for f in machine + faults)
    on_host(
        "printf %%s %s > /etc/kunlun-kit/faults; rm -f /var/run/reboot-required /var/run/reboot-required.pkgs;"
        ' pkill -x -f "sleep 100000" || true' % shlex.quote(text)
    )


def bare_host(*faults):
    """A host without a driver (see _reuse); the tests that install something come last."""
    _reuse("bare", (), faults)


def pinned_host(*faults):
    """The host holding the pinned driver (see _reuse)."""
    _reuse("pinned", ("xpu_old_driver=" + PIN,), faults)


def on_host(command, check=True):
    """Run a shell command on the suite's host over SSH (host key checked); its stdout, stripped."""
    from kunlun_fleet.sim import fleet

    for _ in range(5):
        proc = subprocess.run(fleet.ssh_cmd(INDEX, command), text=True, capture_output=True, timeout=300)
        if proc.returncode != 255:  # 255: ssh itself failed (e.g. sshd restarting after boot)
            break
        time.sleep(3)
    if check:
        assert proc.returncode == 0, "%s: %r failed (rc=%d):\n%s%s" % (
            HOST,
            command,
            proc.returncode,
            proc.stdout,
            proc.stderr,
        )
    return proc.stdout.strip()


def snapshot():
    return on_host(SNAPSHOT)


def driver_play(*args):
    """ansible-playbook playbooks/driver.yml --limit HOST; returns (proc, recap dict).
    Run once: a host the stage cannot reach is a failure to see, not to retry (a reboot the
    role makes waits for the host itself)."""
    proc = subprocess.run(
        [
            str(VENV_BIN / "ansible-playbook"),
            "-i",
            str(INVENTORY),
            str(REPO / "playbooks" / "driver.yml"),
            "--limit",
            HOST,
        ]
        + list(args),
        cwd=REPO,
        env=_env(),
        text=True,
        capture_output=True,
        timeout=1800,
    )
    recap = {}
    m = re.search(
        r"^%s\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)" % re.escape(HOST),
        proc.stdout,
        re.M,
    )
    if m:
        recap = dict(zip(("ok", "changed", "unreachable", "failed", "skipped"), map(int, m.groups()), strict=True))
    return proc, recap


def refused(proc, recap, *phrases):
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert recap.get("failed") == 1 and recap.get("unreachable") == 0, out[-4000:]
    text = re.sub(r"\s+", " ", out)
    for phrase in phrases:
        assert re.sub(r"\s+", " ", phrase) in text, "missing %r in:\n%s" % (phrase, out[-4000:])


@pytest.fixture(scope="module", autouse=True)
def fleet_and_cleanup(sim_fleet):
    yield
    if testing.closing_resets():
        sim_reset()


@pytest.fixture(autouse=True)
def reset_after_a_failure(request):
    """A failed test may leave the host anywhere: the next one starts from a reset."""
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed != failed:
        _HOST["kind"] = None


@pytest.fixture
def damaged_bundle(tmp_path):
    """A bundle holding the real manifest and index and an installer one line too long."""
    src = Path(BUNDLE_DIR)  # the validated stack's, where the sim inventory points for it
    (tmp_path / "drivers").mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "MANIFEST.sha256", tmp_path / "MANIFEST.sha256")
    shutil.copy(src / "bundle.yml", tmp_path / "bundle.yml")
    shutil.copy(src / ARTIFACT, tmp_path / ARTIFACT)
    with open(tmp_path / ARTIFACT, "ab") as fh:
        fh.write(b"\n# one byte too many\n")
    return str(tmp_path)


# ------------------------------------------------------ a host holding an older driver


def test_serving_host_needing_an_upgrade_is_refused():
    # The upgrade itself (the same reset without the process holding a device): molecule/driver.
    sim_reset("xpu_old_driver=" + OLD)
    on_host("setsid -f sh -c 'exec sleep 100000 3</dev/xpu3' </dev/null >/dev/null 2>&1")
    before = snapshot()
    proc, recap = driver_play()
    refused(
        proc,
        recap,
        "runs XRE %s and the pin is %s, but the host is serving" % (OLD, PIN),
        "sleep (pid",
        "holds /dev/xpu3",
        "drain the host first",
        "Nothing was changed",
    )
    assert snapshot() == before
    assert "/usr/local/xpu/version" in before and on_host("cat /usr/local/xpu/version") == OLD


# ------------------------------------------------- bad input on a host without a driver
# One reset for these (bare_host): each refusal changes nothing; the failed installer and
# the install that comes after it go last, in the order a host meets them.


def test_installer_checksum_mismatch(damaged_bundle):
    bare_host()
    before = snapshot()
    proc, recap = driver_play("-e", "kunlun_stack_bundle_dir=" + damaged_bundle)
    refused(proc, recap, "checksum mismatch", ARTIFACT, "nothing was changed")
    assert snapshot() == before
    assert "/usr/local/xpu/version absent" in before


# The driver stage's bundle check is bundle_check on the controller, as preflight's: the
# driver's installer listed in the manifest but missing from the bundle is refused by the
# same module there (tests/preflight/test_controller_checks.py, the bundle's missing file).


def test_seven_of_eight_devices():
    bare_host("xpu_devices=7")
    before = snapshot()
    proc, recap = driver_play()
    refused(proc, recap, "lspci shows 7 P800 functions", "where 8 are expected", "Nothing was changed")
    assert snapshot() == before


# What the kit's no_kernel_headers fault removes at boot (kunlun-kit apply-faults), moved
# aside here and put back after, so that the tests after this one share its reset. The
# fault itself goes through the driver stage in the large lane (tests/scale).
HEADERS_ASIDE = (
    "mkdir -p /root/headers-aside && mv /usr/src/linux-headers-$(uname -r) /root/headers-aside/"
    " && mv /lib/modules/$(uname -r)/build /root/headers-aside/build"
)
HEADERS_BACK = (
    "mv /root/headers-aside/linux-headers-$(uname -r) /usr/src/"
    " && mv /root/headers-aside/build /lib/modules/$(uname -r)/build && rmdir /root/headers-aside"
)


def test_headers_unavailable_for_running_kernel():
    bare_host()
    kernel = on_host("uname -r")
    on_host(HEADERS_ASIDE)
    try:
        before = snapshot()
        proc, recap = driver_play()
        refused(
            proc,
            recap,
            "runs kernel %s and has no headers for it" % kernel,
            "linux-headers-%s" % kernel,
            "Nothing was changed",
        )
        assert snapshot() == before  # no headers, no gcc, no driver
        assert "gcc install ok installed" not in before
    finally:
        on_host(HEADERS_BACK)


def test_installer_failure_shows_the_log_tail():
    """KERNELDIR holding another kernel's headers: the installer refuses; its log's last lines show."""
    bare_host()
    on_host(
        "mkdir -p /root/other-kernel/include/config && touch /root/other-kernel/Makefile"
        " && echo 1.2.3-other > /root/other-kernel/include/config/kernel.release"
    )
    proc, recap = driver_play("-e", "driver_kernel_headers_dir=/root/other-kernel")
    refused(
        proc,
        recap,
        "installer failed (exit status 1)",
        "last lines of /home/newdata/logs/xre-install-%s.log" % PIN,
        "holds headers for kernel 1.2.3-other",
    )
    assert "holds headers for kernel 1.2.3-other" in on_host("cat /home/newdata/logs/xre-install-%s.log" % PIN)
    assert on_host("ls /usr/local/xpu 2>/dev/null || echo none") == "none"
    assert on_host("ls /etc/ansible/facts.d/xpu.fact 2>/dev/null || echo none") == "none"
    # Still no driver: the next test installs one on this host (the build tools are there now).


def test_device_in_error_found_after_install():
    """Without a driver the cards cannot be read: the install runs, then nothing more.
    Also the one fresh install of this file: the e2e (site.yml from bare hosts, then its
    unchanged second run) and the large lane converge bare hosts; molecule/driver upgrades."""
    bare_host("xpu_error_device=3")
    _HOST["kind"] = None  # the install changes the host
    proc, recap = driver_play()
    refused(proc, recap, "device 3 (00000000:61:00.0) is in error", "XRE %s was installed on this run" % PIN)
    assert on_host("cat /usr/local/xpu/version") == PIN
    assert on_host("ls /etc/ansible/facts.d/xpu.fact 2>/dev/null || echo none") == "none"
    assert on_host("grep -rs KLreg /etc/modprobe.d || echo none") == "none"
    assert on_host("ls /etc/modules-load.d/kunlun_peermem.conf 2>/dev/null || echo none") == "none"
    # The host now holds the pinned driver, installed by the stage: once the card is good
    # again (the fault cleared, the module reloaded) the tests on the pinned driver go on
    # here instead of on a reset that installs it.
    on_host(
        ': > /etc/kunlun-kit/faults; for m in kunlun_peermem kunlun; do lsmod | grep -q "^$m " && rmmod $m; done;'
        " modprobe kunlun"
    )
    _HOST["kind"] = "pinned"


# -------------------------------------------- bad input on a host holding the pinned driver
# On the host the tests above leave (or one reset: pinned_host); the VD tests, which change
# the host, go last.


def test_device_in_error_on_installed_driver():
    pinned_host("xpu_error_device=3")
    before = snapshot()
    proc, recap = driver_play()
    refused(proc, recap, "device 3 (00000000:61:00.0) is in error", "Nothing was changed")
    assert snapshot() == before


def test_firmware_below_floor():
    pinned_host("xpu_firmware=1.40.0.0")
    before = snapshot()
    proc, recap = driver_play()
    refused(proc, recap, "has firmware 1.40.0.0", "at least 1.48 is required", "Nothing was changed")
    assert snapshot() == before


def test_cards_in_the_low_power_mode():
    # The driver stage's own use of the full-power check. Its messages (one card, all eight,
    # an unknown cap, the warning when not required, check mode): tests/unit/test_full_power_tasks.py;
    # preflight's refusal on a sim host: tests/preflight/test_host_checks_sim.py.
    pinned_host("xpu_power_cap=3:120")
    before = snapshot()
    proc, recap = driver_play()
    refused(
        proc,
        recap,
        "1 of 8 cards is capped below the full 400 W: device 3 (serial",
        "at 120 W.",
        "power limit back to 400 W with the vendor",
        "Nothing was changed",
    )
    assert snapshot() == before


def test_vc_and_vd_mixed():
    pinned_host("xpu_card_variant=mixed")
    before = snapshot()
    proc, recap = driver_play()
    refused(proc, recap, "mixes VC and VD cards: VC on 0, 1, 2, 3, VD on 4, 5, 6, 7", "Nothing was changed")
    assert snapshot() == before


PID1_START = "sed -e 's/^.*) //' /proc/1/stat | cut -d' ' -f20"


def test_serving_host_with_pending_reboot_is_not_rebooted():
    pinned_host()
    on_host(
        "touch /var/run/reboot-required; setsid -f sh -c 'exec sleep 100000 3</dev/xpu0' </dev/null >/dev/null 2>&1"
    )
    # PID 1's start in clock ticks since the machine booted (/proc/1/stat field 22): exact,
    # where `ps -o lstart` adds the kernel's btime, which moves by a second or two under load.
    boot = on_host(PID1_START)
    before = snapshot()
    proc, recap = driver_play("-e", "driver_reboot_allowed=true")
    refused(proc, recap, "needs a reboot", "but is serving", "It was not rebooted", "drain the host first")
    assert snapshot() == before
    assert on_host(PID1_START) == boot


def test_kunlun_serve_with_a_pending_reboot_the_policy_forbids_is_refused_not_drained():
    """kunlun-serve active (a stand-in unit holding /dev/xpu0) and a reboot pending without
    driver_reboot_allowed: refused with nothing changed, not left to the rolling pass (which
    would drain and stop serving for a reboot it may not make)."""
    pinned_host()
    on_host(
        "touch /var/run/reboot-required; "
        "systemd-run --unit kunlun-serve --property=Type=exec sh -c 'exec sleep 100000 3</dev/xpu0'"
    )
    try:
        before = snapshot()
        proc, recap = driver_play()
        refused(proc, recap, "needs a reboot", "but is serving", "It was not rebooted", "driver_reboot_allowed: true")
        assert "is upgraded in the rolling pass" not in proc.stdout, proc.stdout[-3000:]
        assert snapshot() == before
        assert on_host("systemctl is-active kunlun-serve.service") == "active"
    finally:
        on_host("systemctl stop kunlun-serve.service; rm -f /var/run/reboot-required", check=False)


def test_pending_reboot_without_permission_stops_the_host():
    pinned_host()
    on_host("touch /var/run/reboot-required")
    before = snapshot()
    proc, recap = driver_play()
    refused(
        proc, recap, "needs a reboot", "driver_reboot_allowed is false, so this host stops here", "Nothing was changed"
    )
    assert snapshot() == before


# --------------------------------------------------------------------- good paths

# The upgrade from an older XRE, its no-op re-run and the install log's line: molecule/driver
# (converge, idempotence, verify). A fresh install: see test_device_in_error_found_after_install.
# Check mode on a fresh host: the e2e's check mode from bare hosts (snapshots equal, the
# installer line asserted there).


def test_vd_option_waits_while_an_xpu_is_held():
    pinned_host("xpu_card_variant=VD")
    on_host("setsid -f sh -c 'exec sleep 100000 3</dev/xpu5' </dev/null >/dev/null 2>&1")
    proc, recap = driver_play()
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "kunlun was NOT reloaded" in re.sub(r"\s+", " ", proc.stdout)
    assert on_host("grep -h KLreg /etc/modprobe.d/kunlun.conf") == PINS_VD_LINE
    assert "RmDisableSMMU" not in on_host("cat /run/kunlun-kit/modules/kunlun/options")


def test_vd_cards_get_the_module_option_and_a_reload():
    pinned_host("xpu_card_variant=VD")
    # The host as the reset made it (kunlun loaded without the option, no option line): the
    # test before leaves the line written and not loaded, which a re-run would keep as it is.
    on_host("sed -i '/KLreg_RegistryDwords/d' /etc/modprobe.d/kunlun.conf 2>/dev/null || true")
    assert "RmDisableSMMU" not in on_host("cat /run/kunlun-kit/modules/kunlun/options")
    _HOST["kind"] = None  # the converge changes the host
    proc, recap = driver_play()
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert on_host("grep -h KLreg /etc/modprobe.d/kunlun.conf") == PINS_VD_LINE
    # the kit records the options the loaded module got: proof of the reload
    assert "RmDisableSMMU=1;C2CHighSpeed=1" in on_host("cat /run/kunlun-kit/modules/kunlun/options")
    proc, recap = driver_play()
    assert proc.returncode == 0 and recap["changed"] == 0, proc.stdout[-4000:]


PINS_VD_LINE = yaml.safe_load((REPO / "roles/driver/defaults/main.yml").read_text())["driver_vd_options"]
