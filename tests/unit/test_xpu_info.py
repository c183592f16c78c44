"""Unit tests of library/xpu_info.py: its main logic on recorded outputs, and one real run
through `ansible localhost -m xpu_info` against a fake xpu-smi."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

from ansible.module_utils import basic

# tests/driver/test_xpu_info_minimums.py loads this file by path: its helper, beside it.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_xpu_smi import write_fake_smi  # noqa: E402 (path set just above)
from kunlun_fleet.bundle import load_pins as stack_pins  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "xpu"


def _load_module():
    spec = importlib.util.spec_from_file_location("xpu_info", str(ROOT / "library" / "xpu_info.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


xpu_info = _load_module()

try:
    from ansible.module_utils.testing import patch_module_args
except ImportError:  # ansible-core < 2.19
    import contextlib

    from ansible.module_utils.common.text.converters import to_bytes

    @contextlib.contextmanager
    def patch_module_args(args=None):
        with mock.patch.object(basic, "_ANSIBLE_ARGS", to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": args or {}}))):
            yield


class ExitJson(Exception):
    pass


class FailJson(Exception):
    pass


def exit_json(self, **kwargs):
    kwargs.setdefault("changed", False)
    raise ExitJson(kwargs)


def fail_json(self, msg, **kwargs):
    kwargs["msg"] = msg
    raise FailJson(kwargs)


def fx(name):
    return (FIXTURES / name).read_text()


SMI = "/usr/local/bin/xpu-smi"
BINS = {"xpu-smi": SMI, "lspci": "/usr/bin/lspci", "lsmod": "/usr/sbin/lsmod"}


def host(
    table="xpu-smi_8_vc.txt",
    query="xpu-smi-q_8_vc.txt",
    listing="xpu-smi-L_8.txt",
    lspci="lspci-Dn_8.txt",
    lsmod="lsmod_kunlun.txt",
    smi_rc=0,
    smi_err="",
):
    """Recorded answers of a host, keyed by argv."""
    answers = {
        (SMI,): (smi_rc, fx(table) if smi_rc == 0 else "", smi_err),
        (SMI, "-q"): (smi_rc, fx(query) if smi_rc == 0 else "", smi_err),
        (SMI, "-L"): (smi_rc, fx(listing) if smi_rc == 0 else "", smi_err),
        ("/usr/bin/lspci", "-Dn"): (0, fx(lspci), ""),
        ("/usr/sbin/lsmod",): (0, fx(lsmod), ""),
    }
    return answers


def make_dev(tmp_path, count=8, skip=(), ctrl=True):
    dev = tmp_path / "dev"
    dev.mkdir()
    for i in range(count):
        if i not in skip:
            (dev / ("xpu%d" % i)).write_text("")
    if ctrl:
        (dev / "xpuctrl").write_text("")
    (dev / "null").write_text("")
    return dev


def make_proc(tmp_path, version=None, states=None, modules=None):
    proc = tmp_path / "proc"
    proc.mkdir()
    if version is not None:
        (proc / "kunlun").mkdir()
        (proc / "kunlun" / "version").write_text(version)
    for index, state in (states or {}).items():
        d = proc / "xpu" / ("dev%d" % index)
        d.mkdir(parents=True)
        (d / "state").write_text(state + "\n")
    if modules is not None:
        (proc / "modules").write_text(modules)
    return proc


def run(tmp_path, answers, args=None, bins=None, dev=None, proc=None, check_mode=False):
    """Run the module's main() with a fake run_command; returns (result, calls)."""
    bins = BINS if bins is None else bins
    dev = dev or make_dev(tmp_path)
    proc = proc or make_proc(tmp_path)
    module_args = {"dev_dir": str(dev), "proc_dir": str(proc)}
    module_args.update(args or {})
    if check_mode:
        module_args["_ansible_check_mode"] = True
    calls = []

    def run_command(self, cmd, *a, **kw):
        calls.append(tuple(cmd))
        if tuple(cmd) not in answers:
            raise AssertionError("unexpected command %r" % (cmd,))
        return answers[tuple(cmd)]

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return bins.get(name)

    with (
        patch_module_args(module_args),
        mock.patch.multiple(
            basic.AnsibleModule,
            exit_json=exit_json,
            fail_json=fail_json,
            run_command=run_command,
            get_bin_path=get_bin_path,
        ),
    ):
        with pytest.raises((ExitJson, FailJson)) as exc:
            xpu_info.main()
    if exc.type is FailJson:
        return ("failed", exc.value.args[0]), calls
    return exc.value.args[0], calls


def test_eight_vc_devices(tmp_path):
    result, calls = run(tmp_path, host())
    facts = result["ansible_facts"]
    assert result["changed"] is False
    assert facts["xpu_driver_version"] == "5.0.21.26"
    assert facts["xpu_driver_version_source"] == "xpu-smi"
    assert facts["xpu_runtime_version"] == "5.0.21"
    assert facts["xpu_device_count"] == 8
    assert facts["xpu_pci_functions"] == 8
    assert facts["xpu_modules_loaded"] == ["kunlun", "kunlun_peermem"]
    assert facts["xpu_ctrl_node_present"] is True
    assert facts["xpu_card_variants"] == ["VC"]
    assert facts["xpu_smi_error"] is None
    assert len(facts["xpu_device_nodes"]) == 8
    d = facts["xpu_devices"][4]
    assert d["index"] == 4
    assert d["name"] == "P800 OAM"
    assert d["bus_id"] == "00000000:d1:00.0"
    assert d["memory_total_mib"] == 98304
    assert d["part_number"] == "B00100300110112"
    assert d["card_variant"] == "VC"
    assert d["firmware_version"] == "1.0.2.14.1.54"
    assert d["device_id"] == "0x36862057"
    assert d["node_present"] is True
    assert d["state"] == "ok"
    assert d["serial"] and d["uuid"].startswith("XPU-")
    assert (SMI, "-q") in calls and (SMI, "-L") in calls


def test_seven_of_eight(tmp_path):
    result, _ = run(
        tmp_path,
        host(table="xpu-smi_7.txt", query="xpu-smi-q_7.txt", listing="xpu-smi-L_7.txt", lspci="lspci-Dn_7.txt"),
        dev=make_dev(tmp_path, count=7),
    )
    facts = result["ansible_facts"]
    assert facts["xpu_device_count"] == 7
    assert facts["xpu_pci_functions"] == 7
    assert [d["index"] for d in facts["xpu_devices"]] == list(range(7))


def test_device_missing_its_node(tmp_path):
    result, _ = run(tmp_path, host(), dev=make_dev(tmp_path, skip=(5,), ctrl=False))
    facts = result["ansible_facts"]
    assert facts["xpu_device_count"] == 8
    assert [d["index"] for d in facts["xpu_devices"] if not d["node_present"]] == [5]
    assert facts["xpu_ctrl_node_present"] is False
    assert [os.path.basename(n) for n in facts["xpu_device_nodes"]] == [
        "xpu0",
        "xpu1",
        "xpu2",
        "xpu3",
        "xpu4",
        "xpu6",
        "xpu7",
    ]


def test_mixed_vc_vd(tmp_path):
    result, _ = run(tmp_path, host(query="xpu-smi-q_mixed.txt"))
    facts = result["ansible_facts"]
    assert facts["xpu_card_variants"] == ["VC", "VD"]
    assert [d["card_variant"] for d in facts["xpu_devices"]] == ["VC"] * 4 + ["VD"] * 4


# ------------------------------------------------- the XRE release in both xpu-smi forms


def test_first_form_release_from_the_header(tmp_path):
    result, _ = run(tmp_path, host(), proc=make_proc(tmp_path, version="Kunlun XPU driver version: 5.0.21.10\n"))
    facts = result["ansible_facts"]
    assert (facts["xpu_driver_version"], facts["xpu_driver_version_source"]) == ("5.0.21.26", "xpu-smi")
    assert facts["xpu_driver_version_read"]["xpu-smi"] == "Driver Version: 5.0.21.26 XPU-RT Version: 5.0.21"
    assert facts["xpu_proc_driver_version"] == "5.0.21.10"


def test_second_form_release_from_proc(tmp_path):
    """Driver Version: 515.58 / XPU-RT Version: N/A (table and -q): 515.58 is not the
    release; /proc/kunlun/version gives it."""
    result, _ = run(
        tmp_path,
        host(table="xpu-smi_515_na.txt", query="xpu-smi-q_515_na.txt"),
        proc=make_proc(tmp_path, version=fx("proc_kunlun_version.txt")),
    )
    facts = result["ansible_facts"]
    assert facts["xpu_driver_version"] == "5.0.21.26"
    assert facts["xpu_driver_version_source"] == "/proc/kunlun/version"
    assert facts["xpu_driver_version_read"] == {
        "xpu-smi": "Driver Version: 515.58 XPU-RT Version: N/A",
        "xpu-smi -q": "Driver Version : 515.58",
        "/proc/kunlun/version": "Kunlun XPU driver version: 5.0.21.26 (built Nov 12 2025)",
    }
    assert facts["xpu_runtime_version"] is None
    assert facts["xpu_device_count"] == 8
    assert facts["xpu_card_variants"] == ["VC"]


def test_second_form_release_from_query(tmp_path):
    result, _ = run(tmp_path, host(table="xpu-smi_515_na.txt"))
    facts = result["ansible_facts"]
    assert (facts["xpu_driver_version"], facts["xpu_driver_version_source"]) == ("5.0.21.26", "xpu-smi -q")


def test_second_form_without_query(tmp_path):
    answers = host(table="xpu-smi_515_na.txt")
    answers[(SMI, "-q")] = (1, "", "query not supported")
    result, _ = run(tmp_path, answers, proc=make_proc(tmp_path, version=fx("proc_kunlun_version.txt")))
    facts = result["ansible_facts"]
    assert facts["xpu_driver_version"] == "5.0.21.26"
    assert facts["xpu_runtime_version"] is None
    assert facts["xpu_device_count"] == 8
    # without -q nothing tells the part number: no variant is invented
    assert facts["xpu_card_variants"] == []
    assert facts["xpu_devices"][0]["part_number"] is None


@pytest.mark.parametrize("check_mode", [False, True])
def test_second_form_without_a_release_fails_naming_what_was_read(tmp_path, check_mode):
    result, _ = run(tmp_path, host(table="xpu-smi_515_na.txt", query="xpu-smi-q_515_na.txt"), check_mode=check_mode)
    assert result[0] == "failed"
    msg = result[1]["msg"]
    assert msg.startswith(
        "no source gives the XRE release of the loaded driver: "
        "xpu-smi printed 'Driver Version: 515.58 XPU-RT Version: N/A'; "
        "xpu-smi -q printed 'Driver Version : 515.58'; "
        "/proc/kunlun/version does not exist."
    )
    assert "Fix: check that the kunlun module is loaded" in msg
    assert result[1]["xpu_driver_version_read"]["xpu-smi -q"] == "Driver Version : 515.58"


def _set_fact(path, var):
    """The Jinja expression a task file's set_fact gives ``var``."""
    for task in yaml.safe_load((ROOT / path).read_text()):
        body = task.get("ansible.builtin.set_fact")
        if isinstance(body, dict) and var in body:
            return body[var]
    raise AssertionError("%s sets no %s" % (path, var))


def _assertion(path, marker):
    """The condition of a task file's assert that mentions ``marker``."""
    for task in yaml.safe_load((ROOT / path).read_text()):
        body = task.get("ansible.builtin.assert")
        for that in (body or {}).get("that", []) if isinstance(body, dict) else []:
            if marker in that:
                return that
    raise AssertionError("%s asserts nothing about %s" % (path, marker))


def _render(expression, facts):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    try:
        from ansible.template import trust_as_template
    except ImportError:  # ansible-core < 2.19 templates every string

        def trust_as_template(value):
            return value

    pins = stack_pins()
    variables = {"ansible_facts": facts, "kunlun_stack_driver": pins["kunlun_stack_driver"]}
    value = Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression))
    return value if isinstance(value, bool) else str(value).strip() == "True"


@pytest.mark.parametrize(
    "proc, needed",
    [
        (None, False),  # the pin, read from /proc
        ("Kunlun XPU driver version: 5.0.21.10\n", True),  # an older driver: installed
    ],
)
def test_second_form_driver_stage_decision(tmp_path, proc, needed):
    """The driver stage's "installed version == pinned" on a 515.58 / N/A host: with the
    pinned XRE loaded nothing is reinstalled (idempotence) and verify's check passes."""
    result, _ = run(
        tmp_path,
        host(table="xpu-smi_515_na.txt", query="xpu-smi-q_515_na.txt"),
        proc=make_proc(tmp_path, version=proc or fx("proc_kunlun_version.txt")),
        args={"driver_minimum": "5.0.21.26"},
    )
    facts = result["ansible_facts"]
    assert _render(_set_fact("roles/driver/tasks/read.yml", "driver_install_needed"), facts) is needed
    pinned = _assertion("roles/driver/tasks/verify.yml", "kunlun_stack_driver.version")
    assert _render("{{ %s }}" % pinned, facts) is not needed


def test_device_in_error_err_fields(tmp_path):
    result, _ = run(tmp_path, host(table="xpu-smi_error3.txt", query="xpu-smi-q_error3.txt"))
    devices = result["ansible_facts"]["xpu_devices"]
    assert [d["index"] for d in devices if d["state"] == "error"] == [3]
    assert "temp" in devices[3]["err_fields"]


def test_device_in_error_proc_state(tmp_path):
    states = dict((i, "RUNNING") for i in range(8))
    states[6] = "HANG"
    result, _ = run(tmp_path, host(), proc=make_proc(tmp_path, states=states))
    devices = result["ansible_facts"]["xpu_devices"]
    assert [d["index"] for d in devices if d["state"] == "error"] == [6]
    assert devices[6]["proc_state"] == "HANG"
    assert devices[0]["proc_state"] == "RUNNING"


def test_processes(tmp_path):
    result, _ = run(tmp_path, host(table="xpu-smi_busy3.txt"))
    procs = result["ansible_facts"]["xpu_processes"]
    assert [(p["xpu"], p["name"]) for p in procs] == [(3, "sleep")]


def test_no_xpu_smi(tmp_path):
    bins = {"lspci": "/usr/bin/lspci", "lsmod": "/usr/sbin/lsmod"}
    result, calls = run(tmp_path, host(lsmod="lsmod_none.txt"), bins=bins, dev=make_dev(tmp_path, count=0, ctrl=False))
    facts = result["ansible_facts"]
    assert facts["xpu_smi_path"] is None
    assert facts["xpu_device_count"] == 0
    assert facts["xpu_driver_version"] is None
    assert facts["xpu_devices"] == []
    assert facts["xpu_modules_loaded"] == []
    assert facts["xpu_pci_functions"] == 8  # the cards are there, the driver is not
    assert not any(c[0] == SMI for c in calls)


def test_driver_not_loaded(tmp_path):
    result, calls = run(
        tmp_path,
        host(smi_rc=9, smi_err=fx("xpu-smi_nodriver.stderr"), lsmod="lsmod_none.txt"),
        dev=make_dev(tmp_path, count=0, ctrl=False),
    )
    facts = result["ansible_facts"]
    assert result["changed"] is False
    assert facts["xpu_device_count"] == 0
    assert facts["xpu_smi_error"].startswith("xpu-smi exited 9: No XPU device found")
    assert facts["xpu_modules_loaded"] == []
    assert calls[0] == (SMI,) and (SMI, "-q") not in calls


def test_proc_fallbacks(tmp_path):
    """No lsmod: /proc/modules; no xpu-smi: the driver version of /proc/kunlun/version."""
    bins = {}
    proc = make_proc(tmp_path, version=fx("proc_kunlun_version.txt"), modules=fx("proc_modules.txt"))
    result, calls = run(tmp_path, {}, bins=bins, proc=proc)
    facts = result["ansible_facts"]
    assert calls == []
    assert facts["xpu_modules_loaded"] == ["kunlun", "kunlun_peermem"]
    assert facts["xpu_driver_version"] == "5.0.21.26"
    assert facts["xpu_driver_version_source"] == "/proc/kunlun/version"
    assert facts["xpu_proc_driver_version"] == "5.0.21.26"
    assert facts["xpu_pci_functions"] is None


def test_given_xpu_smi_path_must_exist(tmp_path):
    result, _ = run(tmp_path, {}, args={"xpu_smi_path": str(tmp_path / "nope" / "xpu-smi")})
    assert result[0] == "failed"
    assert "xpu_smi_path" in result[1]["msg"] and "not an executable file" in result[1]["msg"]


def test_check_mode_same_facts(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    normal, _ = run(tmp_path / "a", host())
    checked, _ = run(tmp_path / "b", host(), check_mode=True)
    assert checked["changed"] is False
    assert checked["ansible_facts"]["xpu_device_count"] == 8

    def strip(facts):  # the node paths differ (two temporary dirs)
        return dict((k, v) for k, v in facts.items() if k != "xpu_device_nodes")

    assert strip(checked["ansible_facts"]) == strip(normal["ansible_facts"])


# ---------------------------------------------------------------- power caps


def test_power_figures_without_a_full_cap_judge_nothing(tmp_path):
    result, _ = run(tmp_path, host(table="xpu-smi_power120.txt", query="xpu-smi-q_power120.txt"))
    facts = result["ansible_facts"]
    assert [d["power_cap_w"] for d in facts["xpu_devices"]] == [120] * 8
    assert [d["power_draw_w"] for d in facts["xpu_devices"]][:3] == [84, 85, 86]
    assert all(d["power_cap_ok"] is None for d in facts["xpu_devices"])
    assert facts["xpu_low_power_devices"] == [] and facts["xpu_power_cap_unknown"] == []
    assert facts["xpu_low_power_message"] is None


def test_full_power_cards_pass(tmp_path):
    result, _ = run(tmp_path, host(), args={"power_cap_full": 400})
    facts = result["ansible_facts"]
    assert [d["power_cap_w"] for d in facts["xpu_devices"]] == [400] * 8
    assert all(d["power_cap_ok"] is True for d in facts["xpu_devices"])
    assert facts["xpu_low_power_devices"] == [] and facts["xpu_power_cap_unknown"] == []
    assert facts["xpu_low_power_message"] is None


def test_cards_in_the_low_power_mode_are_named(tmp_path):
    result, _ = run(
        tmp_path, host(table="xpu-smi_power120.txt", query="xpu-smi-q_power120.txt"), args={"power_cap_full": 400}
    )
    facts = result["ansible_facts"]
    assert result["changed"] is False
    assert all(d["power_cap_ok"] is False for d in facts["xpu_devices"])
    low = facts["xpu_low_power_devices"]
    assert [d["index"] for d in low] == list(range(8))
    assert low[3] == {
        "index": 3,
        "serial": "02KE5E61F0013",
        "bus_id": "00000000:61:00.0",
        "power_cap_w": 120,
        "label": "device 3 (serial 02KE5E61F0013)",
    }
    msg = facts["xpu_low_power_message"]
    assert msg.startswith("8 of 8 cards are capped below the full 400 W: device 0 (serial 02KE5E61F0010) at 120 W")
    assert "set each card's power limit back to 400 W with the vendor's tool (xpu-smi) and re-run" in msg


def test_one_low_card_and_one_unreadable_cap(tmp_path):
    result, _ = run(
        tmp_path,
        host(table="xpu-smi_power3_120_5_na.txt", query="xpu-smi-q_power3_120_5_na.txt"),
        args={"power_cap_full": 400},
    )
    facts = result["ansible_facts"]
    assert [d["power_cap_ok"] for d in facts["xpu_devices"]] == [True] * 3 + [False, True, None, True, True]
    assert [d["index"] for d in facts["xpu_low_power_devices"]] == [3]
    assert [d["index"] for d in facts["xpu_power_cap_unknown"]] == [5]
    assert facts["xpu_low_power_message"].startswith(
        "1 of 8 cards is capped below the full 400 W: device 3 (serial 02KE5E61F0013) at 120 W."
    )


def test_low_cap_without_query_is_named_by_bus_id(tmp_path):
    answers = host(table="xpu-smi_power3_120_5_na.txt")
    answers[(SMI, "-q")] = (1, "", "query not supported")
    result, _ = run(tmp_path, answers, args={"power_cap_full": 400})
    facts = result["ansible_facts"]
    assert facts["xpu_low_power_devices"][0]["serial"] is None
    assert "device 3 (00000000:61:00.0) at 120 W" in facts["xpu_low_power_message"]


def test_device_in_error_cap_from_query(tmp_path):
    """ERR! in the table's power column: the -q Power Limit is used, so no false alarm."""
    result, _ = run(
        tmp_path, host(table="xpu-smi_error3.txt", query="xpu-smi-q_error3.txt"), args={"power_cap_full": 400}
    )
    facts = result["ansible_facts"]
    assert facts["xpu_devices"][3]["power_cap_w"] == 400
    assert facts["xpu_devices"][3]["power_draw_w"] is None
    assert facts["xpu_low_power_devices"] == [] and facts["xpu_power_cap_unknown"] == []


def test_no_driver_judges_no_power(tmp_path):
    result, _ = run(
        tmp_path,
        host(smi_rc=9, smi_err=fx("xpu-smi_nodriver.stderr"), lsmod="lsmod_none.txt"),
        args={"power_cap_full": 400},
        dev=make_dev(tmp_path, count=0, ctrl=False),
    )
    facts = result["ansible_facts"]
    assert facts["xpu_devices"] == []
    assert facts["xpu_low_power_devices"] == [] and facts["xpu_power_cap_unknown"] == []
    assert facts["xpu_low_power_message"] is None


def test_power_check_mode_same_facts(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    answers = host(table="xpu-smi_power120.txt", query="xpu-smi-q_power120.txt")
    normal, _ = run(tmp_path / "a", answers, args={"power_cap_full": 400})
    checked, _ = run(tmp_path / "b", answers, args={"power_cap_full": 400}, check_mode=True)
    assert checked["changed"] is False
    assert checked["ansible_facts"]["xpu_low_power_devices"] == normal["ansible_facts"]["xpu_low_power_devices"]
    assert checked["ansible_facts"]["xpu_low_power_message"] == normal["ansible_facts"]["xpu_low_power_message"]


# ---------------------------------------------------------------- through ansible


def through_ansible(tmp_path, table, query, dev, module_args="", *extra):
    """The module run by `ansible localhost -m xpu_info` with a fake xpu-smi; its result."""
    smi = write_fake_smi(tmp_path, table, query)
    proc = make_proc(tmp_path)
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
        ANSIBLE_CACHE_PLUGIN="memory",
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"),
        ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-remote"),
    )
    cmd = [
        str(ROOT / ".venv" / "bin" / "ansible"),
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-e",
        "ansible_python_interpreter=%s" % sys.executable,
        *extra,
        "-m",
        "xpu_info",
        "-a",
        "xpu_smi_path=%s dev_dir=%s proc_dir=%s %s" % (smi, dev, proc, module_args),
    ]
    out = subprocess.run(
        cmd,
        cwd=str(ROOT),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        universal_newlines=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    doc, _ = json.JSONDecoder().raw_decode(out.stdout[out.stdout.index("{") :])
    return smi, doc["plays"][0]["tasks"][0]["hosts"]["localhost"]


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "ansible").exists(), reason="no .venv/bin/ansible")
def test_through_ansible(tmp_path):
    smi, res = through_ansible(tmp_path, "xpu-smi_8_vc.txt", "xpu-smi-q_mixed.txt", make_dev(tmp_path, skip=(2,)))
    facts = res["ansible_facts"]
    assert res["changed"] is False
    assert facts["xpu_smi_path"] == str(smi)
    assert facts["xpu_device_count"] == 8
    assert facts["xpu_driver_version"] == "5.0.21.26"
    assert facts["xpu_card_variants"] == ["VC", "VD"]
    assert [d["index"] for d in facts["xpu_devices"] if not d["node_present"]] == [2]


# power_cap_full as a role passes it (a templated string) reaching the module as a number:
# tests/unit/test_full_power_tasks.py, whose run names the card below the cap and the one
# whose cap xpu-smi does not give (the facts of that table: test_one_low_card_and_one_unreadable_cap).
