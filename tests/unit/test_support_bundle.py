"""kunlun-fleet support-bundle's parts: the secrets masked on the host (collect_outputs'
mask_secrets and its diagnostics), the controller's second masking and its check of the
archive, the last run picked, the refusals before any run, the engine watchdog's state and
evidence taken from the gateways. The bundle from a served sim host:
tests/status/test_support_bundle_sim.py; from local hosts with a watchdog's files:
tests/unit/test_status.py."""

import base64
import io
import json
import os
import stat
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "library"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import collect_outputs  # noqa: E402
from module_docs import documented_spec  # noqa: E402

from kunlun_fleet import runner, support  # noqa: E402

MASK = collect_outputs.SECRET_MASK


@pytest.mark.parametrize(
    "text, masked, n",
    [
        ("VLLM_API_KEY=sk-live-123", "VLLM_API_KEY=" + MASK, 1),
        ('"Env": ["VLLM_API_KEY=sk-1", "PATH=/usr/bin"]', '"Env": ["VLLM_API_KEY=%s", "PATH=/usr/bin"]' % MASK, 1),
        ("vllm serve m --api-key s3cr3t --port 8000", "vllm serve m --api-key %s --port 8000" % MASK, 1),
        ("--api-key=s3cr3t", "--api-key=" + MASK, 1),
        ('["--api-key", "zzz"]', '["--api-key", "%s"]' % MASK, 1),
        ("Authorization: Bearer abc.def", "Authorization: Bearer " + MASK, 1),
        ('HF_TOKEN: "two words"', 'HF_TOKEN: "%s"' % MASK, 1),
        ('{"api_key": "foo", "n": 1}', '{"api_key": "%s", "n": 1}' % MASK, 1),
        ("AWS_SECRET_ACCESS_KEY=x DB_PASSWORD='p w'", "AWS_SECRET_ACCESS_KEY=%s DB_PASSWORD='%s'" % (MASK, MASK), 2),
        # figures and names that only contain the words stay
        ("max_tokens=64 num_tokens=5 token_count=3 KEYS=4", "max_tokens=64 num_tokens=5 token_count=3 KEYS=4", 0),
        ("VLLM_API_KEY=" + MASK, "VLLM_API_KEY=" + MASK, 0),
        ("", "", 0),
    ],
)
def test_mask_secrets(text, masked, n):
    assert collect_outputs.mask_secrets(text) == (masked, n)


class FakeModule(object):
    """AnsibleModule enough for collect_outputs.gather: canned outputs per tool and argv."""

    def __init__(self, outputs, params):
        self.outputs = outputs
        self.params = dict(
            {"mount_point": "/home", "xpu_smi_path": None, "timeout": 30, "diagnostics": True},
            **params,
        )

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return "/usr/bin/" + name if name in self.outputs else None

    def run_command(self, argv, **kwargs):
        tool = argv[0].rsplit("/", 1)[-1]
        return self.outputs[tool].get(tuple(argv[1:]), (1, "", "unexpected %s" % argv))


def test_diagnostics_are_read_cut_and_masked_on_the_host(tmp_path):
    logs, conf = tmp_path / "logs", tmp_path / "conf"
    logs.mkdir()
    conf.mkdir()
    (logs / "vllm.log.1").write_text("old\n")
    os.utime(logs / "vllm.log.1", (1, 1))
    (logs / "vllm.log").write_text("".join("line %d\n" % i for i in range(50)) + "api_key=from-a-log\n")
    (logs / "vllm.log.2.gz").write_bytes(b"\x1f\x8b")
    (conf / "serve.env").write_text("VLLM_LOGGING_LEVEL=INFO\nVLLM_API_KEY=sk-in-serve-env\n")
    (conf / "api-keys.yaml").write_text('{"api-key": ["sk-never-read"]}\n')
    facts = tmp_path / "xpu.fact"
    facts.write_text('{"count": 8}\n')
    inspect = json.dumps([{"Config": {"Env": ["VLLM_API_KEY=sk-in-docker", "PATH=/usr/bin"]}}])
    module = FakeModule(
        {
            "dmesg": {("--ctime",): (0, "".join("[k] msg %d\n" % i for i in range(30)), "")},
            "systemctl": {
                ("cat", "kunlun-serve"): (0, "[Service]\nEnvironmentFile=/etc/kunlun-serve/api-key.env\n", ""),
                ("status", "--no-pager", "--full", "kunlun-serve"): (0, "active (running)\n", ""),
            },
            "journalctl": {
                ("--unit", "kunlun-serve", "--lines", "20", "--no-pager", "--output", "short-iso"): (
                    0,
                    "curl -H 'Authorization: Bearer sk-in-journal'\n",
                    "",
                )
            },
            "docker": {("inspect", "kunlun-serve"): (0, inspect, "")},
            "findmnt": {},
        },
        {
            "service": "kunlun-serve",
            "container": "kunlun-serve",
            "log_dir": str(logs),
            "config_dir": str(conf),
            "facts_file": str(facts),
            "tail_lines": 20,
        },
    )
    outputs, counts = collect_outputs.gather(module, proc_dir=str(tmp_path), etc_dir=str(tmp_path))
    by_name = dict((o["name"], o) for o in outputs)
    everything = json.dumps(outputs)
    for secret in ("sk-in-serve-env", "sk-in-docker", "sk-in-journal", "from-a-log", "sk-never-read"):
        assert secret not in everything, secret
    assert counts["secret"] == 4
    assert by_name["serve.env"]["stdout"] == "VLLM_LOGGING_LEVEL=INFO\nVLLM_API_KEY=%s\n" % MASK
    assert "VLLM_API_KEY=%s" % MASK in by_name["docker-inspect.json"]["stdout"]
    log = by_name["vllm-log-tail.txt"]
    assert log["command"] == "tail -n 20 %s" % (logs / "vllm.log")  # the newest, not the rotated ones
    assert log["stdout"].startswith("[... the last 20 of 51 lines]\nline 31\n")
    assert by_name["dmesg-tail.txt"]["stdout"].count("\n") == 21  # 20 lines and the note
    assert by_name["unit.txt"]["stdout"].startswith("[Service]")
    assert by_name["xpu-facts.json"]["stdout"] == '{"count": 8}\n'


def test_diagnostics_say_what_is_missing(tmp_path):
    module = FakeModule({"findmnt": {}}, {"log_dir": str(tmp_path / "none"), "config_dir": str(tmp_path)})
    module.params.update(service="kunlun-serve", container="kunlun-serve", facts_file=str(tmp_path / "f"), tail_lines=5)
    outputs, counts = collect_outputs.gather(module, proc_dir=str(tmp_path), etc_dir=str(tmp_path))
    by_name = dict((o["name"], o) for o in outputs)
    for name in ("dmesg-tail.txt", "unit.txt", "journal-tail.txt", "docker-inspect.json"):
        assert by_name[name]["missing"] and "not installed" in by_name[name]["reason"], name
    assert by_name["vllm-log-tail.txt"]["missing"] and "no log file in" in by_name["vllm-log-tail.txt"]["reason"]
    assert by_name["serve.env"]["missing"] and counts["secret"] == 0


def test_without_diagnostics_nothing_more_is_read(tmp_path):
    module = FakeModule({"findmnt": {}}, {"diagnostics": False})
    outputs, counts = collect_outputs.gather(module, proc_dir=str(tmp_path), etc_dir=str(tmp_path))
    assert "serve.env" not in [o["name"] for o in outputs] and "secret" not in counts


def test_the_modules_documentation_matches_its_spec(monkeypatch):
    doc, spec = documented_spec(monkeypatch, collect_outputs)
    assert spec["diagnostics"]["default"] is False


# ---------------------------------------------------------------- the controller's side
def _run_dir(base, run_id, command, inventory="inventories/site"):
    path = runner.runs_dir(base) / run_id
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({"id": run_id, "command": command, "inventory": inventory}))
    (path / "summary.md").write_text("# %s\n" % run_id)
    return path


def test_the_last_deploy_or_stage_run_of_the_inventory_is_picked(tmp_path):
    assert support.last_run(tmp_path, "inventories/site") is None
    _run_dir(tmp_path, "20261201T000000Z-deploy", "deploy")
    stage = _run_dir(tmp_path, "20261202T000000Z-stage-serve", "stage")
    _run_dir(tmp_path, "20261203T000000Z-status", "status")
    _run_dir(tmp_path, "20261204T000000Z-support-bundle", "support-bundle")
    # Another inventory's deploy from the same checkout, newer: not this fleet's.
    other = _run_dir(tmp_path, "20261205T000000Z-deploy", "deploy", "/srv/other-site")
    assert support.last_run(tmp_path, "inventories/site") == stage
    assert support.last_run(tmp_path, "/srv/other-site") == other


def test_a_vaulted_value_is_masked_and_a_survivor_found(tmp_path):
    masker = runner.Masker(["the-fleet-key-123"])
    tree = tmp_path / "b"
    (tree / "hosts" / "h1").mkdir(parents=True)
    (tree / "hosts" / "h1" / "journal-tail.txt").write_text("key the-fleet-key-123 in a log\n")
    support.mask_tree(tree, masker)
    assert (tree / "hosts" / "h1" / "journal-tail.txt").read_text() == "key ******** in a log\n"
    good, bad = tmp_path / "good.tar.gz", tmp_path / "bad.tar.gz"
    with tarfile.open(good, "w:gz") as tar:
        tar.add(str(tree), arcname="b")
    assert support.secrets_in(good, masker) == []
    (tree / "late.txt").write_text("the-fleet-key-123")
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(str(tree), arcname="b")
    assert support.secrets_in(bad, masker) == ["b/late.txt"]


def test_refused_before_any_run(tmp_path, capsys):
    existing = tmp_path / "x.tar.gz"
    existing.write_text("")
    assert support.run(str(tmp_path), output=str(existing), base=tmp_path) == runner.REFUSED
    assert "exists; give another -o FILE" in capsys.readouterr().err
    assert support.run(str(tmp_path), output=str(tmp_path / "x.zip"), base=tmp_path) == runner.REFUSED
    assert "name the file *.tar.gz" in capsys.readouterr().err
    assert not (tmp_path / "reports" / "runs").exists()


def test_a_large_log_is_read_from_its_end(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("".join("line %06d\n" % i for i in range(20000)))  # 12 bytes a line
    entry = collect_outputs.read_tail("vllm-log-tail.txt", str(log), 3, limit=1000)
    # the last 1000 bytes: a part of a line (dropped) and 83 whole ones
    assert entry["stdout"] == "[... the last 3 of 83 lines]\nline 019997\nline 019998\nline 019999\n"
    assert entry["rc"] == 0 and entry["command"] == "tail -n 3 %s" % log


# ---------------------------------------------------------------- the engine watchdog's files
def evidence_archive(name, members, top=True):
    """A tar.gz as the watchdog writes one: its files under a directory named after it."""
    stem = name[: -len(".tar.gz")]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for member, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(("%s/%s" % (stem, member)) if top else member)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def slurp_item(data, **loop):
    return dict(loop, content=base64.b64encode(data).decode(), encoding="base64", changed=False)


STATE = {
    "version": 1,
    "updated": 1764866400.5,
    "interval_s": 10,
    "workers": {
        "http://10.91.0.12:8000": {
            "host": "kf-node-2",
            "state": "quarantined",
            "kind": "stuck",
            "reason": "stuck: 2 rounds with requests running (3)",
            "since": 1764866380.1,
            "evidence": "/var/lib/kunlun-watchdog/evidence/kf-node-2-20261204T170000Z.tar.gz",
            "hold": False,
            "readmissions": [],
            "decode_tok_s": None,
            "fleet_decode_tok_s": 31.5,
        }
    },
}


def test_an_evidence_archive_is_of_the_longest_host_name_it_starts_with():
    hosts = ["kf-node-1", "kf-node-1-b", "kf-node-10", "gpu host"]
    assert support.evidence_host("/e/kf-node-1-20261204T170000Z.tar.gz", hosts) == "kf-node-1"
    assert support.evidence_host("/e/kf-node-1-b-20261204T170000Z.tar.gz", hosts) == "kf-node-1-b"
    assert support.evidence_host("/e/kf-node-10-20261204T170000Z.tar.gz", hosts) == "kf-node-10"
    assert support.evidence_host("/e/gpu_host-20261204T170000Z.tar.gz", hosts) == "gpu host"
    assert support.evidence_host("/e/kf-node-2-20261204T170000Z.tar.gz", hosts) is None


def test_an_evidence_archive_is_unpacked_safely():
    name = "kf-node-2-20261204T170000Z.tar.gz"
    data = evidence_archive(name, {"verdict.json": "{}\n", "metrics-1764866390.txt": "vllm:x 1\n"})
    assert support.unpack_evidence(data, "/e/" + name) == [
        ("verdict.json", "{}\n"),
        ("metrics-1764866390.txt", "vllm:x 1\n"),
    ]
    # Paths that would leave the directory stay inside it; links and devices are skipped.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for member in ("../../etc/cron.d/x", "/etc/passwd"):
            info = tarfile.TarInfo(member)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"x\n"))
        link = tarfile.TarInfo("link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
        tar.addfile(link)
    assert support.unpack_evidence(buf.getvalue(), name) == [("etc/cron.d/x", "x\n"), ("etc/passwd", "x\n")]
    with pytest.raises(ValueError, match="not a readable tar.gz"):
        support.unpack_evidence(b"\x1f\x8b not gzip", name)


def test_the_watchdogs_state_and_evidence_in_the_bundle(tmp_path):
    archive = "/var/lib/kunlun-watchdog/evidence/kf-node-2-20261204T170000Z.tar.gz"
    verdict = {"worker": "http://10.91.0.12:8000", "host": "kf-node-2", "kind": "stuck"}
    data = evidence_archive(
        os.path.basename(archive),
        {
            "verdict.json": json.dumps(verdict) + "\n",
            "metrics-1764866390.txt": "vllm:num_requests_running 3\n",
            "router-workers.json": '{"workers": [{"url": "http://10.91.0.12:8000"}]}\nAuthorization: Bearer sk-x\n',
        },
    )
    states = [
        slurp_item(json.dumps(STATE).encode(), status_gateway="gw-1"),
        {"status_gateway": "gw-2", "failed": False, "msg": "File not found: /var/lib/kunlun-watchdog/state.json"},
        {"status_gateway": "gw-3", "unreachable": True, "msg": "Failed to connect to the host via ssh"},
    ]
    evidence = [
        slurp_item(data, status_evidence_file=["gw-1", archive]),
        slurp_item(b"garbled", status_evidence_file=["gw-1", archive.replace("170000Z", "180000Z")]),
        {"status_evidence_file": ["gw-2", archive], "failed": False, "msg": "File is not readable: " + archive},
    ]
    index = support.write_watchdog(tmp_path, states, evidence, ["kf-node-1", "kf-node-2"])
    assert index["gateways"] == {
        "gw-1": {"state": "read", "file": "watchdog/gw-1/state.json", "error": ""},
        "gw-2": {"state": "absent", "file": None, "error": ""},
        "gw-3": {"state": "unreachable", "file": None, "error": "unreachable: Failed to connect to the host via ssh"},
    }
    unpacked, garbled, unreadable = index["evidence"]
    where = "hosts/kf-node-2/watchdog/gw-1/kf-node-2-20261204T170000Z"
    assert unpacked == {
        "gateway": "gw-1",
        "archive": archive,
        "host": "kf-node-2",
        "dir": where,
        "files": ["verdict.json", "metrics-1764866390.txt", "router-workers.json"],
        "error": "",
    }
    assert garbled["dir"] is None and garbled["error"].startswith("not a readable tar.gz")
    assert unreadable["error"] == "File is not readable: " + archive
    assert json.loads((tmp_path / "watchdog" / "index.json").read_text()) == index
    # Masked as the hosts' files are, one masker for all: the same address, the same placeholder.
    state = json.loads((tmp_path / "watchdog" / "gw-1" / "state.json").read_text())
    (url,) = state["workers"]
    assert url == "http://192.0.2.1:8000" and state["workers"][url]["state"] == "quarantined"
    assert json.loads((tmp_path / where / "verdict.json").read_text())["worker"] == "http://192.0.2.1:8000"
    router = (tmp_path / where / "router-workers.json").read_text()
    assert "sk-x" not in router and "Bearer ********" in router and "10.91.0.12" not in router
    assert (tmp_path / where / "metrics-1764866390.txt").read_text() == "vllm:num_requests_running 3\n"
    # Plain text all of it (the bundle reads without tools).
    for path in tmp_path.rglob("*"):
        if path.is_file():
            path.read_bytes().decode("utf-8")


def test_no_watchdog_on_any_gateway_leaves_nothing(tmp_path):
    absent = [{"status_gateway": "gw-1", "failed": False, "msg": "File not found: /var/lib/kunlun-watchdog/state.json"}]
    for states, evidence in ((None, None), ([], []), (absent, [])):
        index = support.write_watchdog(tmp_path, states, evidence, ["kf-node-1"])
        assert index["evidence"] == [] and not (tmp_path / "watchdog").exists()


class _CollectedRun:
    """The status run support-bundle reads (kunlun_fleet.status.read_fleet's second value):
    one host's collected output, the run's masker."""

    def __init__(self, base, masker):
        self.dir = base / "reports" / "runs" / "support"
        self.dir.mkdir(parents=True)
        self.summary, self.masker, self.inventory = {}, masker, str(base / "inv")
        output = {"name": "journal-tail.txt", "command": "journalctl -n 200", "rc": 0, "stdout": "a log line\n"}
        self.state = {"outputs": {"h1": {"outputs": [output]}}}


def test_the_bundle_is_private_from_its_first_byte(tmp_path, monkeypatch):
    """The archive is written 0600 whatever the umask, from its creation on (not made
    readable to everyone, then narrowed), and never through a link at its .partial name."""
    archive = tmp_path / "out" / "b.tar.gz"
    archive.parent.mkdir()
    partial = archive.with_name("b.tar.gz.partial")
    victim = tmp_path / "elsewhere.txt"
    victim.write_text("not the bundle\n")
    victim.chmod(0o644)
    partial.symlink_to(victim)  # as a local user could plant it in a shared reports/ directory
    doc = {"hosts": [{"host": "h1", "error": None}]}
    monkeypatch.setattr(
        support.status, "read_fleet", lambda *a, **k: (0, _CollectedRun(tmp_path, runner.Masker()), doc)
    )
    monkeypatch.setattr(support.status, "render_table", lambda doc: "the table\n")
    monkeypatch.setattr(support.status, "render_json", lambda doc: "{}\n")
    modes, add = [], tarfile.TarFile.add

    def recording_add(self, *args, **kwargs):  # the mode while the first members are written
        modes.append(stat.S_IMODE(os.lstat(partial).st_mode))
        return add(self, *args, **kwargs)

    monkeypatch.setattr(tarfile.TarFile, "add", recording_add)
    umask = os.umask(0o022)
    try:
        code = support.run(str(tmp_path / "inv"), output=str(archive), base=tmp_path, out=io.StringIO())
    finally:
        os.umask(umask)
    assert code == runner.OK
    assert modes and set(modes) == {0o600}, modes
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600 and not os.path.lexists(partial)
    assert victim.read_text() == "not the bundle\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    with tarfile.open(archive) as tar:
        assert "b/hosts/h1/journal-tail.txt" in tar.getnames()
