"""Tests of the XPU part of the hardware kit (kunlun_fleet/sim/kit): the XRE .run builder
and installer, the xpu-smi it installs, the modprobe/rmmod/lsmod and lspci stand-ins.

Everything runs in a scratch root given by XRE_PREFIX (the kit's own switch); the
outputs are read with the PRODUCT's parsers (module_utils/xpu_smi.py), so the kit and the
product are held to the same formats.
"""

import importlib.util
import json
import os
import stat
import subprocess
import time
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "kunlun_fleet" / "sim" / "kit"
SBIN = KIT / "rootfs" / "usr" / "local" / "sbin"
BIN = KIT / "rootfs" / "usr" / "local" / "bin"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


xre = _load("kit_xre", KIT / "xre.py")
x = _load("xpu_smi_parsers", ROOT / "module_utils" / "xpu_smi.py")

VERSION = "5.0.21.26"
NEWER = "5.0.22.1"
FIRMWARE = "1.0.2.14.1.54"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of the /dev/xpu* nodes needs root")


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    return {VERSION: xre.build_xre_run(VERSION, out), NEWER: xre.build_xre_run(NEWER, out, firmware="1.0.2.14.1.60")}


@pytest.fixture
def env(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    kdir = tmp_path / "headers"
    kdir.mkdir()
    (kdir / "Makefile").write_text("# kernel headers\n")
    e = dict(
        os.environ,
        XRE_PREFIX=str(root),
        KERNELDIR=str(kdir),
        PATH=os.pathsep.join([str(SBIN), str(BIN), os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    )
    e["_root"] = str(root)
    return e


def sh(env, *cmd, check=False, timeout=60):
    """Run a kit command; the timeout only stops a hang (a starved ansible-playbook in a
    CI lane beside the fleet took over 60 s: CI 2026-12-07, so the play has its own)."""
    res = subprocess.run(
        [str(c) for c in cmd],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        universal_newlines=True,
        timeout=timeout,
    )
    if check:
        assert res.returncode == 0, res.stdout + res.stderr
    return res


def install(env, run, *extra):
    return sh(env, "sh", run, "--silent", "--accept-license", *extra)


def smi(env, *args):
    return sh(env, Path(env["_root"]) / "usr/local/bin/xpu-smi", *args)


def faults(env, text):
    path = Path(env["_root"]) / "etc" / "kunlun-kit" / "faults"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ------------------------------------------------------------------ builder


def test_build_is_named_and_reproducible(tmp_path):
    a = xre.build_xre_run(VERSION, tmp_path)
    b = xre.build_xre_run(VERSION, tmp_path / "again.run")
    assert a.name == "xre-Linux-x86_64-5.0.21.26.run"
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes().startswith(b"#!/bin/sh")
    assert os.access(str(a), os.X_OK)
    assert xre.build_xre_run(VERSION, tmp_path, firmware="1.0.2.14.1.60").read_bytes() != b.read_bytes()
    with pytest.raises(ValueError):
        xre.build_xre_run("latest", tmp_path)


# ------------------------------------------------------------------ installer refusals


@pytest.mark.parametrize("flags", [[], ["--silent"], ["--accept-license"]])
def test_installer_needs_silent_and_license(env, runs, flags):
    res = sh(env, "sh", runs[VERSION], *flags)
    assert res.returncode != 0
    assert "Do you accept the license" in res.stdout
    assert "--silent --accept-license" in res.stderr
    assert not (Path(env["_root"]) / "usr/local/bin/xpu-smi").exists()


def test_installer_needs_kerneldir(env, runs):
    del env["KERNELDIR"]
    res = install(env, runs[VERSION])
    assert res.returncode != 0
    assert "KERNELDIR is not set" in res.stderr
    assert not (Path(env["_root"]) / "usr/local/xpu").exists()


def test_installer_needs_headers_makefile(env, runs, tmp_path):
    env["KERNELDIR"] = str(tmp_path / "no-such-headers")
    res = install(env, runs[VERSION])
    assert res.returncode != 0
    assert "kernel headers not found" in res.stderr and "no-such-headers" in res.stderr
    log = (Path(env["_root"]) / "var/log/xre-install.log").read_text()
    assert "kernel headers not found" in log


# ------------------------------------------------------------------ install + xpu-smi


@needs_root
def test_install_and_xpu_smi(env, runs):
    res = install(env, runs[VERSION])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no reboot required" in res.stdout
    root = Path(env["_root"])
    assert (root / "usr/local/xpu/version").read_text().strip() == VERSION
    assert 'MODE="0666"' in (root / "etc/udev/rules.d/99-kunlun.rules").read_text()
    rel = os.uname().release
    assert (root / "lib/modules" / rel / "extra/kunlun.ko").exists()
    assert (root / "lib/modules" / rel / "extra/kunlun_peermem.ko").exists()
    assert (root / "var/log/xre-install.log").exists()
    assert not (root / "var/run/reboot-required").exists()

    for name in ["xpu%d" % i for i in range(8)] + ["xpuctrl"]:
        st = os.stat(str(root / "dev" / name))
        assert stat.S_ISCHR(st.st_mode), name
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
        assert stat.S_IMODE(st.st_mode) == 0o666
    assert not (root / "dev" / "xpu8").exists()

    table = smi(env)
    assert table.returncode == 0, table.stderr
    t = x.parse_table(table.stdout)
    assert t["driver_version"] == VERSION
    assert t["runtime_version"] == "5.0.21"
    assert len(t["devices"]) == 8
    assert all(d["memory_total_mib"] == 98304 and d["state"] == "ok" for d in t["devices"])
    assert t["devices"][0]["bus_id"] == "00000000:52:00.0"

    q = x.parse_query(smi(env, "-q").stdout)
    assert q["attached"] == 8 and q["driver_version"] == VERSION
    assert {d["firmware_version"] for d in q["devices"]} == {FIRMWARE}
    assert {d["device_id"] for d in q["devices"]} == {"0x36862057"}
    assert {d["card_variant"] for d in q["devices"]} == {"VC"}
    assert x.firmware_at_least(q["devices"][0]["firmware_version"], "1.48")

    one = x.parse_query(smi(env, "-q", "--id=6").stdout)
    assert [d["index"] for d in one["devices"]] == [6]
    assert smi(env, "-q", "--id=8").returncode != 0

    assert len(x.parse_list(smi(env, "-L").stdout)) == 8

    lsmod = sh(env, "lsmod", check=True).stdout
    assert lsmod.splitlines()[0].split() == ["Module", "Size", "Used", "by"]
    assert x.kunlun_modules_loaded(lsmod) == ["kunlun", "kunlun_peermem"]
    assert x.parse_lsmod(lsmod)["kunlun"]["used_by"] == ["kunlun_peermem"]

    lspci = sh(env, "lspci", "-Dn", check=True).stdout
    assert len(x.parse_lspci(lspci)) == 8
    assert len(lspci.splitlines()) > 8  # ordinary functions too
    assert x.parse_lspci(sh(env, "lspci", "-Dnn", check=True).stdout) == x.parse_lspci(lspci)
    assert len(sh(env, "lspci", "-Dn", "-d", "2057:3686", check=True).stdout.splitlines()) == 8
    assert sh(env, "lspci", "-s", "52:00.0", check=True).stdout.startswith("52:00.0 ")


@needs_root
def test_faults(env, runs):
    install(env, runs[VERSION])
    faults(env, "xpu_devices=7\n")
    assert len(x.parse_table(smi(env).stdout)["devices"]) == 7
    assert len(x.parse_list(smi(env, "-L").stdout)) == 7
    assert len(x.parse_lspci(sh(env, "lspci", "-Dn").stdout)) == 7

    faults(env, "xpu_error_device=2\n")
    t = x.parse_table(smi(env).stdout)
    assert [d["index"] for d in t["devices"] if d["state"] == "error"] == [2]

    faults(env, "xpu_card_variant=VD\nxpu_firmware=1.40.0.0\n")
    q = x.parse_query(smi(env, "-q").stdout)
    assert {d["card_variant"] for d in q["devices"]} == {"VD"}
    assert {d["firmware_version"] for d in q["devices"]} == {"1.40.0.0"}
    assert not x.firmware_at_least("1.40.0.0", "1.48")

    faults(env, "xpu_card_variant=mixed\n")
    q = x.parse_query(smi(env, "-q").stdout)
    assert sorted({d["card_variant"] for d in q["devices"]}) == ["VC", "VD"]


def loaded_prefix(env, version=VERSION):
    """The kit state xpu-smi reads, without the installer (no device nodes, no root):
    the kunlun module marked loaded and the runtime installed."""
    root = Path(env["_root"])
    (root / "run/kunlun-kit/modules/kunlun").mkdir(parents=True)
    (root / "run/kunlun-kit/modules/kunlun/version").write_text(version + "\n")
    (root / "usr/local/xpu").mkdir(parents=True)
    (root / "usr/local/xpu/version").write_text(version + "\n")


def kit_smi(env, *args):
    res = sh(env, sys.executable, KIT / "xre" / "xpu-smi", *args)
    assert res.returncode == 0, res.stderr
    return res.stdout


def caps(env):
    """(table caps, -q caps, -q draws) as the product's parsers read the kit's xpu-smi."""
    table = x.parse_table(kit_smi(env))["devices"]
    query = x.parse_query(kit_smi(env, "-q"))["devices"]
    return ([d["power_cap_w"] for d in table], [d["power_cap_w"] for d in query], [d["power_draw_w"] for d in query])


@pytest.mark.parametrize(
    "fault, expected",
    [
        ("", [400] * 8),  # no fault: the full 400 W
        ("xpu_power_cap=120\n", [120] * 8),  # every card in the low-power mode
        ("xpu_power_cap=3:120\n", [400] * 3 + [120] + [400] * 4),
        ("xpu_power_cap=3:120,5:150\n", [400] * 3 + [120, 400, 150, 400, 400]),
        ("xpu_power_cap=5:N/A\n", [400] * 5 + [None, 400, 400]),  # xpu-smi cannot read it
        ("xpu_power_cap=N/A\n", [None] * 8),
        ("xpu_power_cap=lots\n", [400] * 8),  # not a figure: ignored
        ("xpu_power_cap=9:120\n", [400] * 8),  # no card 9
    ],
)
def test_xpu_smi_power_cap_fault(env, fault, expected):
    loaded_prefix(env)
    if fault:
        faults(env, fault)
    table, query, draws = caps(env)
    assert table == expected  # the table's Pwr:Usage/Cap column
    assert query == expected  # -q's Power Readings
    assert all(isinstance(d, int) and 84 <= d <= 86 for d in draws)


def test_xpu_smi_power_cap_fault_with_other_faults(env):
    loaded_prefix(env)
    faults(env, "xpu_devices=4\nxpu_power_cap=80\n")
    table, query, draws = caps(env)
    assert table == query == [80] * 4
    assert draws == [80] * 4  # an idle card never draws more than its cap
    faults(env, "xpu_error_device=2\nxpu_power_cap=3:120\n")
    devs = x.merge_devices(x.parse_table(kit_smi(env)), x.parse_query(kit_smi(env, "-q")))
    assert [d["power_cap_w"] for d in devs] == [400, 400, 400, 120, 400, 400, 400, 400]
    low, unknown = x.low_power_devices(devs, 400)
    assert [d["index"] for d in low] == [3] and unknown == []
    assert x.low_power_message(low, 400, 8).startswith(
        "1 of 8 cards is capped below the full 400 W: device 3 (serial 02K"
    )
    one = x.parse_query(kit_smi(env, "-q", "--id=3"))["devices"]
    assert [(d["index"], d["power_cap_w"]) for d in one] == [(3, 120)]


def test_xpu_smi_build_515_header(env):
    """xpu_smi_build=515.58: the header of the xpu-smi build that prints 515.58 / N/A
    (as public P800 output does), in the table and -q; the cards are unchanged. The
    product then finds no XRE release in xpu-smi (the sim has no /proc/kunlun/version)."""
    loaded_prefix(env)
    first = x.driver_release(kit_smi(env), kit_smi(env, "-q"), None)
    assert (first["version"], first["source"]) == (VERSION, "xpu-smi")
    devices = x.parse_table(kit_smi(env))["devices"]

    faults(env, "xpu_smi_build=515.58\n")
    table, query = kit_smi(env), kit_smi(env, "-q")
    assert "| XPU-SMI               Driver Version: 515.58       XPU-RT Version: N/A      |" in table
    assert x.parse_header(table) == {"driver_version": "515.58", "runtime_version": None}
    q = x.parse_query(query)
    assert (q["driver_version"], q["runtime_version"]) == ("515.58", None)
    assert [d["bus_id"] for d in x.parse_table(table)["devices"]] == [d["bus_id"] for d in devices]
    assert [d["power_cap_w"] for d in q["devices"]] == [400] * 8
    second = x.driver_release(table, query, None)
    assert second["version"] is None
    assert "xpu-smi printed 'Driver Version: 515.58 XPU-RT Version: N/A'" in second["error"]


# ------------------------------------------------------------------ modules


@needs_root
def test_modprobe_rmmod(env, runs):
    root = Path(env["_root"])
    res = sh(env, "modprobe", "kunlun")
    assert res.returncode != 0 and "Module kunlun not found" in res.stderr  # not installed

    install(env, runs[VERSION])
    # VD cards need this option; it must reach the module on the next load
    conf = root / "etc/modprobe.d/kunlun.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text('options kunlun KLreg_RegistryDwords="RmDisableSMMU=1;C2CHighSpeed=1"\n')

    res = sh(env, "rmmod", "kunlun")
    assert res.returncode != 0 and "in use by: kunlun_peermem" in res.stderr
    res = sh(env, "modprobe", "-r", "kunlun")
    assert res.returncode != 0 and "in use" in res.stderr
    sh(env, "modprobe", "-r", "kunlun_peermem", "kunlun", check=True)
    assert x.kunlun_modules_loaded(sh(env, "lsmod").stdout) == []
    assert not (root / "dev/xpu0").exists() and not (root / "dev/xpuctrl").exists()
    nodrv = smi(env)
    assert nodrv.returncode != 0 and "No XPU device found" in nodrv.stderr

    # peermem pulls in kunlun, with the options from modprobe.d
    sh(env, "modprobe", "kunlun_peermem", check=True)
    assert x.kunlun_modules_loaded(sh(env, "lsmod").stdout) == ["kunlun", "kunlun_peermem"]
    options = (root / "run/kunlun-kit/modules/kunlun/options").read_text()
    assert options.strip() == "KLreg_RegistryDwords=RmDisableSMMU=1;C2CHighSpeed=1"
    assert (root / "dev/xpu7").exists()

    res = sh(env, "modprobe", "--first-time", "kunlun")
    assert res.returncode != 0 and "already in kernel" in res.stderr
    sh(env, "modprobe", "kunlun", check=True)  # loaded already: success, no change
    sh(env, "rmmod", "kunlun_peermem", check=True)
    sh(env, "rmmod", "kunlun", check=True)
    assert x.kunlun_modules_loaded(sh(env, "lsmod").stdout) == []


@needs_root
def test_upgrade_while_in_use_requires_reboot(env, runs):
    root = Path(env["_root"])
    install(env, runs[VERSION])
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            'import sys, time; f = open(sys.argv[1]); print("ok", flush=True); time.sleep(60)',
            str(root / "dev/xpu3"),
        ],
        stdout=subprocess.PIPE,
        universal_newlines=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ok"
        t = x.parse_table(smi(env).stdout)
        assert [(p["xpu"], p["pid"]) for p in t["processes"]] == [(3, holder.pid)]
        assert x.parse_lsmod(sh(env, "lsmod").stdout)["kunlun"]["used"] == 2
        res = sh(env, "rmmod", "kunlun_peermem")
        assert res.returncode == 0
        res = sh(env, "rmmod", "kunlun")
        assert res.returncode != 0 and "in use" in res.stderr
        sh(env, "modprobe", "kunlun_peermem", check=True)

        res = install(env, runs[NEWER])
        assert res.returncode == 0, res.stderr
        assert "REBOOT REQUIRED" in res.stdout
        assert (root / "var/run/reboot-required").exists()
        t = x.parse_table(smi(env).stdout)
        assert t["driver_version"] == VERSION  # the old module is still loaded
        assert t["runtime_version"] == "5.0.22"  # the new user space is installed
        assert x.kunlun_modules_loaded(sh(env, "lsmod").stdout) == ["kunlun", "kunlun_peermem"]
    finally:
        holder.kill()
        holder.wait()
    (root / "var/run/reboot-required").unlink()
    res = install(env, runs[NEWER])
    assert res.returncode == 0 and "no reboot required" in res.stdout
    assert not (root / "var/run/reboot-required").exists()
    t = x.parse_table(smi(env).stdout)
    assert t["driver_version"] == NEWER and t["processes"] == []
    q = x.parse_query(smi(env, "-q").stdout)
    assert {d["firmware_version"] for d in q["devices"]} == {"1.0.2.14.1.60"}


@needs_root
def test_uninstall(env, runs):
    root = Path(env["_root"])
    install(env, runs[VERSION])
    res = install(env, runs[VERSION], "--uninstall")
    assert res.returncode == 0, res.stderr
    assert not (root / "usr/local/bin/xpu-smi").exists()
    assert not (root / "usr/local/xpu").exists()
    assert not (root / "dev/xpu0").exists()
    assert x.kunlun_modules_loaded(sh(env, "lsmod").stdout) == []
    assert sh(env, "modprobe", "kunlun").returncode != 0


def test_lspci_without_driver(env):
    """The PCI functions are there before any driver: ids only, no driver in use."""
    res = sh(env, "lspci", "-n", check=True)
    found = x.parse_lspci(res.stdout)  # without -D: domain 0000 assumed
    assert [f["slot"] for f in found][:2] == ["0000:52:00.0", "0000:56:00.0"] and len(found) == 8
    k = sh(env, "lspci", "-k", "-d", "2057:", check=True).stdout
    assert "Kernel driver in use" not in k and k.count("Kernel modules: kunlun") == 8
    assert sh(env, "lspci", "-d", "bogus").returncode != 0


@needs_root
def test_coldplug_after_restart(env, runs):
    """A restart empties /run and /dev: the boot unit loads kunlun (+ modules-load.d)."""
    root = Path(env["_root"])
    install(env, runs[VERSION])
    conf = root / "etc/modules-load.d/kunlun.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("# XPU\nkunlun_peermem\n")
    faults(env, "xpu_devices=7\n")
    for d in ("run", "dev"):
        subprocess.run(["rm", "-rf", str(root / d)], check=True)
    assert smi(env).returncode != 0
    sh(env, SBIN / "kunlun-kit-coldplug", check=True)
    assert x.kunlun_modules_loaded(sh(env, "lsmod").stdout) == ["kunlun", "kunlun_peermem"]
    assert sorted(os.listdir(str(root / "dev"))) == ["xpu%d" % i for i in range(7)] + ["xpuctrl"]
    assert len(x.parse_table(smi(env).stdout)["devices"]) == 7


def test_coldplug_without_driver_loads_nothing(env):
    sh(env, SBIN / "kunlun-kit-coldplug", check=True)
    assert x.kunlun_modules_loaded(sh(env, "lsmod").stdout) == []


SHIM_DIR = KIT / "rootfs" / "usr" / "local" / "lib" / "python3.11" / "dist-packages"
PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Load kunlun with the VD option
      community.general.modprobe:
        name: kunlun
        params: 'KLreg_RegistryDwords="RmDisableSMMU=1;C2CHighSpeed=1"'

    - name: Load it again
      community.general.modprobe:
        name: kunlun
        params: 'KLreg_RegistryDwords="RmDisableSMMU=1;C2CHighSpeed=1"'

    - name: Load kunlun_peermem in check mode
      community.general.modprobe:
        name: kunlun_peermem
      check_mode: true

    - name: Unload kunlun
      community.general.modprobe:
        name: kunlun
        state: absent
"""


@needs_root
@pytest.mark.skipif(
    os.path.exists("/proc/modules"),
    reason="not applicable: the kernel has /proc/modules, the shim that stands in for it is not used",
)
@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "ansible-playbook").exists(), reason="no .venv")
def test_community_general_modprobe_works_against_the_kit(env, runs, tmp_path):
    """community.general.modprobe reads /proc/modules, which this kernel lacks: the kit's
    start-up shim (kunlun_kit_proc.pth in the host's site dir) provides it."""
    import json

    root = Path(env["_root"])
    install(env, runs[VERSION])
    sh(env, "modprobe", "-r", "kunlun_peermem", "kunlun", check=True)
    venv = tmp_path / "hostpy"
    subprocess.run(
        [
            sys.executable if not os.path.exists("/usr/bin/python3") else "/usr/bin/python3",
            "-m",
            "venv",
            "--without-pip",
            str(venv),
        ],
        check=True,
    )
    site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
        stdout=subprocess.PIPE,
        universal_newlines=True,
        check=True,
    ).stdout.strip()
    for f in ("kunlun_kit_proc.pth", "kunlun_kit_proc.py"):
        (Path(site) / f).write_bytes((SHIM_DIR / f).read_bytes())
    probe = [str(venv / "bin" / "python"), "-c", "print(open('/proc/modules').read(), end='')"]
    assert sh(env, *probe, check=True).stdout == ""
    sh(env, "modprobe", "kunlun_peermem", check=True)
    text = sh(env, *probe, check=True).stdout
    assert text.startswith("kunlun_peermem 16384 0 - Live")
    assert x.parse_lsmod(text)["kunlun"]["used_by"] == ["kunlun_peermem"]
    sh(env, "modprobe", "-r", "kunlun_peermem", "kunlun", check=True)

    play = tmp_path / "play.yml"
    play.write_text(PLAYBOOK)
    e = dict(
        env,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_CACHE_PLUGIN="memory",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
    )
    res = sh(
        e,
        ROOT / ".venv" / "bin" / "ansible-playbook",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-e",
        "ansible_python_interpreter=%s" % (venv / "bin" / "python"),
        play,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    doc, _ = json.JSONDecoder().raw_decode(res.stdout[res.stdout.index("{") :])
    changed = [t["hosts"]["localhost"]["changed"] for t in doc["plays"][0]["tasks"]]
    assert changed == [True, False, True, True]  # load, again (no change), check mode, unload
    assert x.kunlun_modules_loaded(sh(env, "lsmod").stdout) == []
    assert not (root / "run/kunlun-kit/modules/kunlun_peermem").exists()  # check mode loaded nothing


@pytest.mark.skipif(
    os.path.exists("/proc/modules") or not os.path.isdir("/sys/module/overlay"),
    reason="not applicable: the kit answers for built-in modules only on a kernel without "
    "loadable modules that has overlay built in",
)
def test_builtin_modules_on_a_kernel_without_modules(env):
    assert sh(env, "modprobe", "overlay").returncode == 0
    res = sh(env, "modprobe", "-r", "overlay")
    assert res.returncode != 0 and "is builtin" in res.stderr


def holds(pid, path):
    """Whether process pid has path open (its /proc/PID/fd links)."""
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink("/proc/%d/fd/%s" % (pid, fd)) == path:
                return True
        except OSError:
            continue
    return False


def wait_until(predicate, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "%s: not within %d s" % (what, timeout)
        time.sleep(0.05)


def test_xpu_smi_figures_move_with_the_holders_load(env, runs, tmp_path):
    """A process holding /dev/xpu2 (a serving container's vllm) with the stand-in's load file
    in its root: device 2's memory, utilisation, power and temperature follow the load; the
    other devices stay idle; without a holder device 2 is idle again."""
    assert install(env, runs[VERSION]).returncode == 0
    load = Path("/tmp/kunlun-sim-load.json")  # the holder's root here is the controller's /
    saved = load.read_bytes() if load.exists() else None
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; f = open(sys.argv[1]); time.sleep(60)",
            str(Path(env["_root"]) / "dev" / "xpu2"),
        ]
    )
    try:

        def device(n):
            return next(d for d in x.parse_table(smi(env).stdout)["devices"] if d["index"] == n)

        idle = device(2)
        load.write_text('{"running": 0, "waiting": 0, "kv_usage": 0.0}')
        node = str(Path(env["_root"]) / "dev" / "xpu2")
        wait_until(lambda: holds(holder.pid, node), "the holder has /dev/xpu2 open")
        held = device(2)
        assert held["memory_used_mib"] == 4864 and held["utilization"] == "0%", held
        load.write_text('{"running": 25, "waiting": 3, "kv_usage": 0.5}')
        busy, other = device(2), device(3)
        pool = int(98304 * 0.9) - 4864
        assert busy["memory_used_mib"] == 4864 + pool // 2, busy
        assert busy["utilization"] == "60%", busy
        assert busy["power_draw_w"] > held["power_draw_w"] and busy["power_draw_w"] <= busy["power_cap_w"]
        assert int(busy["temperature"].rstrip("C")) > int(idle["temperature"].rstrip("C"))
        assert other["memory_used_mib"] == 0 and other["utilization"] == "0%"
        q = next(d for d in x.parse_query(smi(env, "-q").stdout)["devices"] if d["index"] == 2)
        assert q["memory_used_mib"] == busy["memory_used_mib"], q
    finally:
        holder.kill()
        holder.wait()
        if saved is None:
            load.unlink()
        else:
            load.write_bytes(saved)
    after = device(2)
    assert after["memory_used_mib"] == 0 and after["utilization"] == "0%"


def test_standin_vllm_writes_its_load_for_xpu_smi(tmp_path, monkeypatch):
    """The stand-in vllm's side: with KUNLUN_SIM_LOAD_FILE set, its load is written there (at
    most once a second while busy, at once when it falls idle); without it, nothing."""
    metrics = _load("standin_metrics", ROOT / "kunlun_fleet/sim/artifacts/vllm_src/vllm/engine/metrics.py")
    path = tmp_path / "load.json"
    monkeypatch.setenv("KUNLUN_SIM_LOAD_FILE", str(path))
    m = metrics.Metrics("model")
    m.set_queue(5, 1, 0.25)
    assert json.loads(path.read_text()) == {"running": 5, "waiting": 1, "kv_usage": 0.25}
    m.set_queue(6, 0, 0.3)  # busy, within the second: not rewritten
    assert json.loads(path.read_text())["running"] == 5
    m.set_queue(0, 0, 0.0)  # idle: at once
    assert json.loads(path.read_text()) == {"running": 0, "waiting": 0, "kv_usage": 0.0}
    monkeypatch.delenv("KUNLUN_SIM_LOAD_FILE")
    other = tmp_path / "other.json"
    metrics.Metrics("model").set_queue(3, 0, 0.1)
    assert not other.exists() and json.loads(path.read_text())["running"] == 0
