"""Run playbooks/image.yml (or only its controller-side validation) against a throw-away
inventory whose hosts are unreachable (TEST-NET-1 addresses): anything that tried to
contact a host would fail as UNREACHABLE, so a refusal seen here happened on the
controller, before any host changed."""

import hashlib
import os
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PINS = yaml.safe_load((ROOT / "roles/kunlun_stack/defaults/main.yml").read_text())


def write_manifest(bundle):
    lines = []
    for path in sorted(p for p in bundle.rglob("*") if p.is_file() and p.name != "MANIFEST.sha256"):
        lines.append("%s  %s\n" % (hashlib.sha256(path.read_bytes()).hexdigest(), path.relative_to(bundle).as_posix()))
    (bundle / "MANIFEST.sha256").write_text("".join(lines))


class Site:
    """A bundle with a small file under every pinned artifact name, and an inventory."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.bundle = tmp / "bundle"
        self.inventory = tmp / "inventory"
        rels = [c["artifact"] for c in PINS["kunlun_stack_components"].values() if "artifact" in c]
        for rel in rels + [PINS["kunlun_stack_base_image_archive"]]:
            path = self.bundle / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(("stand-in for %s\n" % rel).encode())
        write_manifest(self.bundle)
        self.vars = {"kunlun_stack_bundle_dir": str(self.bundle)}
        self.hosts = {"all": {"children": {
            "image_builders": {"hosts": {"b1": {"ansible_host": "192.0.2.10"}}},
            "xpu_servers": {"hosts": {"b1": {}, "s2": {"ansible_host": "192.0.2.11"}}},
            "gateways": {"hosts": {"b1": {}}}}}}

    def write(self):
        (self.inventory / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
        (self.inventory / "hosts.yml").write_text(yaml.safe_dump(self.hosts))
        (self.inventory / "group_vars" / "all" / "test.yml").write_text(yaml.safe_dump(self.vars))

    def run(self, playbook=ROOT / "playbooks/image.yml", *extra):
        self.write()
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_FORCE_COLOR="0", ANSIBLE_CACHE_PLUGIN_CONNECTION=str(self.tmp / "facts"),
                   ANSIBLE_TIMEOUT="3")
        proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(self.inventory), str(playbook),
                               "-e", "kunlun_stack_bundle_sum_cache=%s" % (self.tmp / "sums.json"), *extra],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        return proc.returncode, proc.stdout + proc.stderr

