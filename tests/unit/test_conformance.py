"""status --collect and conformance without a fleet: the masking of serials and addresses
(library/collect_outputs.py), the collection at the module level (a stand-in AnsibleModule),
the files status writes (kunlun_fleet/status.write_collection), and `conformance DIR` over the
sim kit's reference outputs (all ok) and over copies with one format changed (exit 2)."""

import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest

import collect_outputs
from kunlun_fleet import cli, conformance, status

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "tests/fixtures/conformance/sim/kf-node-1"
XPU = ROOT / "tests/unit/fixtures/xpu"
KIT_SERIAL = re.compile(r"02K[0-9A-F]{6}\d{4}")


# ---------------------------------------------------------------- masking
def test_serials_are_replaced_by_stable_placeholders_everywhere():
    query = (XPU / "xpu-smi-q_8_vc.txt").read_text()
    serials = KIT_SERIAL.findall(query)
    assert len(set(serials)) == 8
    other = "disk serial seen elsewhere: %s\n" % serials[2]
    outputs = [{"stdout": query, "stderr": ""}, {"stdout": other, "stderr": ""}]
    masker = collect_outputs.mask_outputs(outputs)
    assert not KIT_SERIAL.search(outputs[0]["stdout"] + outputs[1]["stdout"])
    placeholders = re.findall(r"Serial Number\s*:\s*(\S+)", outputs[0]["stdout"])
    assert placeholders == ["SERIAL-%04d" % n for n in range(1, 9)]
    assert outputs[1]["stdout"] == "disk serial seen elsewhere: SERIAL-0003\n"  # equal values stay equal
    assert masker.counts()["serial"] == 8
    # What the parsers read is untouched: versions, firmware, bus ids, part numbers, UUIDs.
    for kept in (
        "Driver Version                            : 5.0.21.26",
        "1.0.2.14.1.54",
        "00000000:52:00.0",
        "B00100300110112",
        "XPU-7c15324f-f867-54f0-a54f-1854e1deb257",
        "0x36862057",
    ):
        assert kept in outputs[0]["stdout"], kept


def test_addresses_are_masked_stably_and_versions_are_kept():
    masker = collect_outputs.Masker()
    text = (
        "eth0 mac 0c:42:a1:7e:11:02 inet 10.20.30.41/24 peer 10.20.30.41 gw 10.20.30.1\n"
        "inet6 fe80::e42:a1ff:fe7e:1102/64 and 2409:8a1e:4c1:10::5\n"
        "lo 127.0.0.1 any 0.0.0.0 mask 255.255.255.0\n"
        "Kunlun XPU driver version: 5.0.21.26 (built Nov 12 2025)\n"
        "proxy http://alice:s3cret@proxy.example:3128 bus 0000:52:00.0 at 16:59:05\n"
    )
    out = masker.text(text)
    assert "0c:42:a1:7e:11:02" not in out and "02:00:00:00:00:01" in out
    assert "10.20.30.41" not in out and out.count("192.0.2.1") == 2 and "192.0.2.2" in out
    assert "fe80::e42:a1ff:fe7e:1102" not in out and "2409:8a1e:4c1:10::5" not in out
    assert "2001:db8::1" in out and "2001:db8::2" in out
    assert "127.0.0.1" in out and "0.0.0.0" in out and "255.255.255.0" in out
    assert "driver version: 5.0.21.26" in out
    assert "alice" not in out and "s3cret" not in out and "http://USER:PASSWORD@proxy.example:3128" in out
    assert "0000:52:00.0" in out and "16:59:05" in out
    # The same value in a later text gets the same placeholder; masking again changes nothing.
    assert masker.text("again 10.20.30.41") == "again 192.0.2.1"
    assert collect_outputs.Masker().text(out) == out


# ---------------------------------------------------------------- the collection (module level)
class FakeModule(object):
    """AnsibleModule enough for collect_outputs.gather: some tools installed, canned outputs."""

    def __init__(self, outputs, params=None):
        self.outputs = outputs  # {tool: {args tuple: (rc, out, err)}}
        self.params = dict({"mount_point": "/home", "xpu_smi_path": None, "timeout": 30}, **(params or {}))
        self.ran = []

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return "/usr/bin/" + name if name in self.outputs else None

    def run_command(self, argv, **kwargs):
        self.ran.append(argv)
        tool = argv[0].rsplit("/", 1)[-1]
        return self.outputs[tool].get(tuple(argv[1:]), (1, "", "unexpected %s" % argv))


def test_gather_masks_and_records_missing_commands(tmp_path):
    proc, etc = tmp_path / "proc", tmp_path / "etc"
    (proc / "kunlun").mkdir(parents=True)
    (proc / "kunlun" / "version").write_text((XPU / "proc_kunlun_version.txt").read_text())
    for n in (0, 1, 10):
        (proc / "xpu" / ("dev%d" % n)).mkdir(parents=True)
        (proc / "xpu" / ("dev%d" % n) / "state").write_text("RUNNING\n")
    etc.mkdir()
    (etc / "os-release").write_text((REFERENCE / "os-release.txt").read_text())
    findmnt = (REFERENCE / "findmnt.json").read_text()
    module = FakeModule(
        {
            "xpu-smi": {
                (): (0, (XPU / "xpu-smi_8_vc.txt").read_text(), ""),
                ("-q",): (0, (XPU / "xpu-smi-q_8_vc.txt").read_text(), ""),
                ("-L",): (0, (XPU / "xpu-smi-L_8.txt").read_text(), ""),
            },
            "findmnt": {("-J", "--output", "SOURCE,FSTYPE,OPTIONS", "--mountpoint", "/home"): (0, findmnt, "")},
            "blkid": {("-p", "-o", "export", "/dev/mapper/data-home"): (0, "UUID=abc\nTYPE=xfs\n", "")},
            "uname": {("-a",): (0, "Linux h 6.8.0 #1 SMP x86_64 GNU/Linux eth0 10.1.2.3\n", "")},
        }
    )
    outputs, counts = collect_outputs.gather(module, proc_dir=str(proc), etc_dir=str(etc))
    by_name = dict((o["name"], o) for o in outputs)
    for name in ("lspci-Dn.txt", "lsmod.txt", "lsblk.txt", "docker-info.json"):
        assert by_name[name]["missing"] is True and "not installed" in by_name[name]["reason"], name
    assert by_name["proc_modules.txt"]["missing"] is True
    assert [n for n in by_name if n.startswith("proc_xpu_")] == [
        "proc_xpu_dev0_state.txt",
        "proc_xpu_dev1_state.txt",
        "proc_xpu_dev10_state.txt",
    ]
    assert by_name["xpu-smi-q.txt"]["rc"] == 0 and "SERIAL-0001" in by_name["xpu-smi-q.txt"]["stdout"]
    assert not any(KIT_SERIAL.search(o["stdout"]) for o in outputs)
    assert "10.1.2.3" not in by_name["uname-a.txt"]["stdout"]
    assert counts["serial"] == 8 and counts["ipv4"] == 1
    assert by_name["blkid.txt"]["command"] == "blkid -p -o export /dev/mapper/data-home"
    assert by_name["os-release.txt"]["stdout"].startswith('PRETTY_NAME="Ubuntu')


def test_gather_without_xpu_smi_or_a_mount(tmp_path):
    module = FakeModule({"findmnt": {}})  # findmnt exits 1: nothing mounted at /home
    outputs, _ = collect_outputs.gather(module, proc_dir=str(tmp_path), etc_dir=str(tmp_path))
    by_name = dict((o["name"], o) for o in outputs)
    assert all(by_name[n]["missing"] for n in ("xpu-smi.txt", "xpu-smi-q.txt", "xpu-smi-L.txt"))
    assert by_name["findmnt.json"]["rc"] == 1
    assert by_name["blkid.txt"]["missing"] and "no block device mounted at /home" in by_name["blkid.txt"]["reason"]


def test_status_writes_the_files_and_the_index(tmp_path):
    res = {
        "mount_point": "/home",
        "masked": {"serial": 1},
        "outputs": [
            {
                "name": "xpu-smi-q.txt",
                "command": "xpu-smi -q",
                "rc": 0,
                "missing": False,
                "reason": "",
                "stdout": "    Serial Number : 02KE5E61F0010\nip 10.9.8.7\n",
                "stderr": "",
            },
            {
                "name": "lspci-Dn.txt",
                "command": "lspci -Dn",
                "rc": None,
                "missing": True,
                "reason": "lspci is not installed",
                "stdout": "",
                "stderr": "",
            },
        ],
    }
    written = status.write_collection(str(tmp_path), {"kf-node-1": res}, {"kf-node-2": "unreachable: no route"})
    assert written == {"kf-node-1": 1, "kf-node-2": 0}
    text = (tmp_path / "kf-node-1" / "xpu-smi-q.txt").read_text()
    assert "02KE5E61F0010" not in text and "10.9.8.7" not in text  # masked again before writing
    index = json.loads((tmp_path / "kf-node-1" / "index.json").read_text())
    assert [(c["command"], c["rc"], c["file"]) for c in index["commands"]] == [
        ("xpu-smi -q", 0, "xpu-smi-q.txt"),
        ("lspci -Dn", None, None),
    ]
    assert index["commands"][1]["missing"] is True
    other = json.loads((tmp_path / "kf-node-2" / "index.json").read_text())
    assert other["commands"] == [] and other["error"] == "unreachable: no route"


def test_state_takes_collect_outputs_results():
    state = status.new_state()
    status.collect(
        state,
        {
            "event": "runner_on_ok",
            "event_data": {
                "host": "kf-node-1",
                "task_action": "collect_outputs",
                "res": {"outputs": [], "mount_point": "/home"},
            },
        },
    )
    assert state["outputs"] == {"kf-node-1": {"outputs": [], "mount_point": "/home"}}
    assert state["results"] == {}


# ---------------------------------------------------------------- conformance
@pytest.fixture
def collected(tmp_path):
    """DIR as status --collect writes it: two hosts holding the sim kit's outputs."""
    for host in ("kf-node-1", "kf-node-2"):
        shutil.copytree(REFERENCE, tmp_path / host)
    return tmp_path


def run(directory, *args):
    out = io.StringIO()
    code = conformance.run(str(directory), as_json="--json" in args, out=out)
    return code, out.getvalue()


def test_the_sim_kits_outputs_are_all_ok(collected):
    code, text = run(collected)
    assert code == 0, text
    assert "2 host(s): 30 ok, 0 missing, 0 unreadable, 0 differs (exit 0)" in text
    code, text = run(collected, "--json")
    doc = json.loads(text)
    assert code == 0 and doc["exit_code"] == 0
    assert {f["verdict"] for h in doc["hosts"].values() for f in h["files"]} == {"ok"}


def test_the_reference_itself_conforms():
    assert conformance.check(REFERENCE.parent)["exit_code"] == 0


def _edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def _verdicts(doc):
    return dict(
        ((host, f["file"]), (f["verdict"], f["reason"]))
        for host, h in doc["hosts"].items()
        for f in h["files"]
        if f["verdict"] not in ("ok", "missing")
    )


def test_a_changed_format_is_named_with_its_host_and_file(collected):
    # -q with a renamed key: the power cap is no longer read from the Power Readings block.
    _edit(collected / "kf-node-2" / "xpu-smi-q.txt", "Power Limit", "Power Cap")
    # The table with a renamed header field: no driver version from the table.
    _edit(collected / "kf-node-2" / "xpu-smi.txt", "Driver Version:", "KMD Version:")
    # -L in another layout: nothing the parser can use.
    (collected / "kf-node-1" / "xpu-smi-L.txt").write_text("GPU 0: P800 OAM\nGPU 1: P800 OAM\n")
    code, text = run(collected, "--json")
    doc = json.loads(text)
    assert code == 2 and doc["exit_code"] == 2
    found = _verdicts(doc)
    assert set(found) == {
        ("kf-node-2", "xpu-smi-q.txt"),
        ("kf-node-2", "xpu-smi.txt"),
        ("kf-node-1", "xpu-smi-L.txt"),
    }, found
    assert found[("kf-node-2", "xpu-smi-q.txt")][0] == "differs"
    assert "device.power_cap_w" in found[("kf-node-2", "xpu-smi-q.txt")][1]
    assert (
        found[("kf-node-2", "xpu-smi.txt")][0] == "differs"
        and "driver_version" in found[("kf-node-2", "xpu-smi.txt")][1]
    )
    assert found[("kf-node-1", "xpu-smi-L.txt")] == ("unreadable", "parse_list found no 'XPU <n>: ...' line")
    code, text = run(collected)
    assert code == 2
    assert re.search(r"kf-node-2\n(.*\n)*  xpu-smi-q\.txt\s+differs .*device\.power_cap_w", text), text
    assert "differs" in text and "unreadable" in text


def test_failed_commands_missing_ones_and_raising_parsers(collected, monkeypatch):
    index_path = collected / "kf-node-1" / "index.json"
    index = json.loads(index_path.read_text())
    for c in index["commands"]:
        if c["file"] == "docker-info.json":
            c["rc"], c["stderr"] = 1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.\n"
        if c["file"] == "lspci-Dn.txt":
            c.update(file=None, rc=None, missing=True, reason="lspci is not installed")
        if c["file"] == "blkid.txt":
            c["rc"] = 2
    index_path.write_text(json.dumps(index))
    (collected / "kf-node-1" / "blkid.txt").write_text("")
    (collected / "kf-node-1" / "lspci-Dn.txt").unlink()
    (collected / "kf-node-2" / "findmnt.json").write_text('{"filesystems": "not a list"}')
    doc = conformance.check(str(collected))
    files = dict(((h, f["file"] or f["command"]), f) for h, d in doc["hosts"].items() for f in d["files"])
    assert files[("kf-node-1", "docker-info.json")]["verdict"] == "unreadable"
    assert "exited 1: Cannot connect" in files[("kf-node-1", "docker-info.json")]["reason"]
    assert files[("kf-node-1", "lspci -Dn")]["verdict"] == "missing"
    assert files[("kf-node-1", "blkid.txt")]["verdict"] == "ok"  # blkid 2: no signature, as the product reads it
    assert files[("kf-node-2", "findmnt.json")]["verdict"] == "unreadable"
    assert "raised" in files[("kf-node-2", "findmnt.json")]["reason"]
    assert doc["counts"]["missing"] == 1 and doc["exit_code"] == 2


def test_a_host_not_collected_fails_the_check(tmp_path):
    (tmp_path / "kf-node-3").mkdir()
    (tmp_path / "kf-node-3" / "index.json").write_text(
        json.dumps({"host": "kf-node-3", "commands": [], "error": "unreachable: no route to host"})
    )
    code, text = run(tmp_path)
    assert code == 2 and "not collected: unreachable: no route to host" in text


def test_bad_input_exits_3(tmp_path, capsys):
    assert run(tmp_path / "nope")[0] == 3
    assert run(tmp_path)[0] == 3  # no <host>/index.json
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "index.json").write_text("{not json")
    assert run(tmp_path)[0] == 3
    assert "index.json is unreadable" in capsys.readouterr().err


def test_the_cli_runs_it(collected, capsys):
    assert cli.main(["conformance", str(collected)]) == 0
    assert "(exit 0)" in capsys.readouterr().out
    assert cli.main(["conformance", str(collected / "nope"), "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["exit_code"] == 3


@pytest.mark.parametrize("how", ["../ in the name", "an absolute name", "a link at the name", "a linked host"])
def test_an_entry_that_leads_out_of_dir_is_refused_naming_it(collected, tmp_path_factory, capsys, how):
    """DIR comes from elsewhere (an operator's collection, sent in): nothing in it may make
    conformance read a file outside DIR. Refused, exit 3, naming the entry and the fix."""
    outside = tmp_path_factory.mktemp("outside")
    shutil.copy(REFERENCE / "xpu-smi.txt", outside / "secret.txt")  # readable as xpu-smi's table
    host = collected / "kf-node-2"
    index = json.loads((host / "index.json").read_text())
    (entry,) = [c for c in index["commands"] if c["file"] == "xpu-smi.txt"]
    if how == "../ in the name":
        entry["file"] = os.path.relpath(outside / "secret.txt", host)
    elif how == "an absolute name":
        entry["file"] = str(outside / "secret.txt")
    elif how == "a link at the name":
        (host / "xpu-smi.txt").unlink()
        (host / "xpu-smi.txt").symlink_to(outside / "secret.txt")
    else:
        shutil.move(str(host), str(outside / "kf-node-2"))
        host.symlink_to(outside / "kf-node-2")
    if how in ("../ in the name", "an absolute name"):
        (host / "index.json").write_text(json.dumps(index))
    code, text = run(collected)
    err = capsys.readouterr().err
    assert code == 3 and text == "", text
    assert "kf-node-2" in err and "status --collect DIR" in err, err
    if how in ("../ in the name", "an absolute name"):
        assert "index.json: the entry of %r names the file %r" % (entry["command"], entry["file"]) in err, err
    else:
        assert "is a link (to %s" % outside in err, err
