"""The gateway stage refuses bad input on the controller, before any host is contacted,
and the sim bundle carries the router's wheelhouse, listed in the manifest."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from kunlun_fleet.sim import bundle

ROOT = Path(__file__).resolve().parents[2]
PINS = yaml.safe_load((ROOT / "roles/kunlun_stack/defaults/main.yml").read_text())


def run_playbook(inventory, playbook, tmp_path, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(inventory), str(ROOT / playbook),
                           *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture
def inventory(tmp_path):
    dest = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventories/example", dest)
    return dest


def test_empty_gateways_group_is_refused(inventory, tmp_path):
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["gateways"]["hosts"] = {}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    rc, out = run_playbook(inventory, "playbooks/gateway.yml", tmp_path)
    assert rc != 0, out
    assert "the gateways group has no hosts: add one in hosts.yml" in out, out[-3000:]
    assert "gw-01" not in out


def test_missing_api_key_is_refused_before_hosts(inventory, tmp_path):
    # The example inventory has no vault: the key check fails on the controller first.
    rc, out = run_playbook(inventory, "playbooks/gateway.yml", tmp_path, "-e", "vault_kunlun_api_key=")
    assert rc != 0, out
    assert "The gateway has no API key" in out, out[-3000:]
    assert "kunlun-fleet api-key" in out
    assert "Install | " not in out


def test_worker_urls_from_the_inventory(inventory, tmp_path):
    """Every xpu_servers host at http://<ansible_host>:<serving port>; the host name when
    it has no ansible_host."""
    play = tmp_path / "urls.yml"
    play.write_text(yaml.safe_dump([{
        "name": "urls", "hosts": "gw-01", "gather_facts": False,
        "tasks": [{"name": "urls", "ansible.builtin.include_role": {"name": "gateway", "tasks_from": "controller"},
                   "vars": {"gateway_install_from": "index", "vault_kunlun_api_key": "k" * 20}},
                  {"name": "show", "ansible.builtin.debug": {"msg": "URLS={{ gateway_worker_urls | to_json }}"}}]}]))
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["xpu_servers"]["hosts"]["p800-a04"] = None
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    rc, out = run_playbook(inventory, str(play), tmp_path)
    assert rc == 0, out[-3000:]
    shown = " ".join(out.split("URLS=", 1)[1].split())
    assert shown.startswith('["http://10.20.1.11:8000", "http://10.20.1.12:8000", "http://10.20.1.13:8000", '
                            '"http://p800-a04:8000"]'), out[-3000:]


def test_bundle_wheelhouse_holds_the_router_and_its_dependencies(tmp_path):
    out = tmp_path / "bundle"
    bundle.build(str(out), force=True, log=lambda *_: None)
    gw = PINS["kunlun_stack_gateway_router"]
    router = out / gw["artifact"]
    assert router.is_file()
    manifest = (out / "MANIFEST.sha256").read_text()
    wheels = sorted(p.name for p in (out / "wheelhouse").glob("*.whl"))
    for name in wheels:
        assert "  wheelhouse/%s\n" % name in manifest
    names = {w.split("-")[0].lower() for w in wheels}
    # vllm-router's own requirements (METADATA Requires-Dist), all there for pip --no-index.
    with zipfile.ZipFile(router) as zf:
        meta = zf.read("vllm_router-%s.dist-info/METADATA" % gw["version"]).decode()
    required = [line.split(":", 1)[1].strip().split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip()
                for line in meta.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert required
    for req in required:
        assert req.lower().replace("-", "_") in names, (req, names)
    # Installable offline, as the role does it (with this machine's CPython 3.11, the hosts' minor).
    if sys.version_info[:2] == tuple(int(x) for x in str(gw["python"]).split(".")):
        venv = tmp_path / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        proc = subprocess.run([str(venv / "bin/pip"), "install", "--quiet", "--no-index", "--find-links",
                               str(out / "wheelhouse"), "%s==%s" % (gw["package"], gw["version"])],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (venv / "bin/vllm-router").exists()
    # A second build changes nothing (cached download, same bytes).
    assert bundle.build(str(out), log=lambda *_: None)["changed"] is False
