"""`kunlun-fleet support-bundle` on the served sim fleet (suite "bench-sim", lane "fleet"):
one tar.gz for kf-node-2 with its diagnostics (xpu-smi -q; the /proc state files, missing on
the sim and said so; dmesg, the serving unit, its journal and vLLM's log, docker inspect,
serve.env, the facts), the status of the same moment and the last deploy's report, readable
as plain files; the fleet's API key - which the host does hold, in the engine's --config
file mounted into its container - nowhere in it; nothing changed on the host."""

import json
import tarfile
from pathlib import Path

import pytest

from kunlun_fleet import support, vault
from kunlun_fleet.sim.testing import INVENTORY, ssh
from test_collect_sim import UNTOUCHED, kunlun_fleet

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.sim, pytest.mark.slow]
HOST = "kf-node-2"
DIAGNOSTICS = (
    "xpu-smi-q.txt",
    "dmesg-tail.txt",
    "unit.txt",
    "unit-status.txt",
    "journal-tail.txt",
    "vllm-log-tail.txt",
    "docker-inspect.json",
    "serve.env",
    "xpu-facts.json",
)


def test_support_bundle_of_a_served_host(sim_fleet, tmp_path):
    key = vault.read_api_key(INVENTORY)
    # The host holds the key (the engine's --config file, mounted into its container).
    held = ssh(2, "grep -qF -e '%s' /etc/kunlun-serve/api-keys.yaml; echo $?" % key, check=False).stdout.strip()
    assert held == "0", "the host does not hold the key: nothing to keep out"
    last = support.last_run(ROOT, "inventories/sim")
    assert last is not None, "no deploy or stage run in reports/runs (the demo that served the fleet makes one)"
    before = ssh(2, UNTOUCHED).stdout
    out = tmp_path / "bundle.tar.gz"
    proc = kunlun_fleet("support-bundle", "-i", "inventories/sim", "--limit", HOST, "-o", str(out))
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    assert key not in proc.stdout + proc.stderr
    assert "support bundle: %s" % out in proc.stdout and "1 of 1 host(s) collected" in proc.stdout, proc.stdout

    with tarfile.open(out, "r:gz") as tar:
        members = dict((m.name, tar.extractfile(m).read().decode()) for m in tar.getmembers() if m.isfile())
    top = "bundle"
    leaked = [name for name, text in members.items() if key in text]
    assert not leaked, "the API key is in %s" % leaked
    for name in DIAGNOSTICS:
        text = members.get("%s/hosts/%s/%s" % (top, HOST, name))
        assert text, (name, sorted(members))
    files = lambda name: members["%s/hosts/%s/%s" % (top, HOST, name)]  # noqa: E731
    # The engine's keys are in its --config file (never read), not in its environment.
    assert "VLLM_API_KEY" not in files("docker-inspect.json") and "/etc/kunlun-serve/api-keys.yaml" in files(
        "docker-inspect.json"
    )
    assert "ExecStart=" in files("unit.txt") and "kunlun-serve" in files("unit-status.txt")
    assert "Serial Number" in files("xpu-smi-q.txt") and "SERIAL-0001" in files("xpu-smi-q.txt")
    index = json.loads(files("index.json"))
    assert index["error"] is None, index["masked"]
    # The driver's /proc files: read where they exist; the sim's kernel has none, and the
    # index says so rather than leaving them out.
    proc = [c for c in index["commands"] if c["command"].startswith(("cat /proc/kunlun", "cat /proc/xpu"))]
    assert len(proc) >= 2 and all(c["file"] or (c["missing"] and c["reason"]) for c in proc), proc
    status = json.loads(members["%s/status.json" % top])
    assert [r["host"] for r in status["hosts"]] == [HOST] and status["hosts"][0]["reachable"]
    assert members["%s/last-run/summary.md" % top] == (last / "summary.md").read_text()
    assert "hosts/<host>/index.json" in members["%s/README.txt" % top]
    # Read-only on the host.
    assert ssh(2, UNTOUCHED).stdout == before
