"""Run playbooks/image.yml (or only its controller-side validation) against a throw-away
inventory whose hosts are unreachable (TEST-NET-1 addresses): anything that tried to
contact a host would fail as UNREACHABLE, so a refusal seen here happened on the
controller, before any host changed."""

import atexit
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import yaml
from kunlun_fleet.bundle import load_pins as stack_pins

ROOT = Path(__file__).resolve().parents[2]
PINS = stack_pins()


def write_manifest(bundle):
    lines = []
    for path in sorted(p for p in bundle.rglob("*") if p.is_file() and p.name != "MANIFEST.sha256"):
        lines.append("%s  %s\n" % (hashlib.sha256(path.read_bytes()).hexdigest(), path.relative_to(bundle).as_posix()))
    (bundle / "MANIFEST.sha256").write_text("".join(lines))


def base_archive(path, tags, extra=b""):
    """A small `docker save`-shaped archive: manifest.json naming the image's tags."""
    manifest = json.dumps([{"Config": "c0ffee.json", "RepoTags": tags, "Layers": []}]).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in (("c0ffee.json", b"{}" + extra), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))


_SOURCES = []


def sources():
    """The sim's stand-in vendor files and a wheel directory standing for the package index,
    made once per test process."""
    if not _SOURCES:
        from kunlun_fleet.sim import bundle as sim
        from kunlun_fleet.sim.artifacts.wheel import build_wheel

        root = Path(tempfile.mkdtemp(prefix="kf-image-sources-"))
        atexit.register(shutil.rmtree, str(root), True)
        vendor, index = root / "vendor", root / "index"
        sim.build_small_wheels(PINS, str(vendor))
        sim.build_torch(PINS, str(vendor))
        sim.build_vllm_kunlun(PINS, str(vendor))
        sim.build_model(PINS, str(vendor))
        sim.build_driver(PINS, str(vendor))
        base_archive(vendor / "vllm-kunlun-exp-base.tar", [PINS["kunlun_stack_base_image"]])
        sim.build_vllm_wheel(PINS, str(index))
        build_wheel(
            str(index / "transformers-5.2.0-py3-none-any.whl"),
            "transformers",
            "5.2.0",
            {"transformers/__init__.py": b""},
            "py3-none-any",
            purelib=True,
        )
        _SOURCES.append(root)
    return _SOURCES[0]


class Site:
    """A bundle made by `kunlun-fleet bundle build` from stand-in vendor files (its own copy
    in vendor/, to change and build again: rebuild()), and an inventory."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.bundle = tmp / "bundle"
        self.inventory = tmp / "inventory"
        self.vendor = tmp / "vendor"
        shutil.copytree(sources() / "vendor", self.vendor)
        # The index's files here are stand-ins: the index's sha256 does not apply.
        self.vars = {"kunlun_stack_bundle_dir": str(self.bundle), "kunlun_stack_index_sha256": {}}
        self.hosts = {
            "all": {
                "children": {
                    "image_builders": {"hosts": {"b1": {"ansible_host": "192.0.2.10"}}},
                    "xpu_servers": {"hosts": {"b1": {}, "s2": {"ansible_host": "192.0.2.11"}}},
                    "gateways": {"hosts": {"b1": {}}},
                }
            }
        }
        self.rebuild()

    def rebuild(self):
        """`kunlun-fleet bundle build` of vendor/ with the pins as this site's vars set them
        (the gateway's router is not needed here)."""
        from kunlun_fleet import bundle as product

        pins = product.load_pins()
        pins.update({k: v for k, v in self.vars.items() if k in product.PIN_VARS})
        pins.pop("kunlun_stack_gateway_router", None)
        lines = []
        rc, _ = product.build(
            str(self.bundle),
            vendor=str(self.vendor),
            find_links=[str(sources() / "index")],
            no_index=True,
            pins=pins,
            cache_path=str(self.tmp / "sums.json"),
            log=lines.append,
        )
        assert rc == 0, "\n".join(lines)

    def files(self):
        """{pin key: file in the bundle} from its bundle.yml."""
        index = yaml.safe_load((self.bundle / "bundle.yml").read_text())
        return {key: entry["path"] for key, entry in index["artifacts"].items()}

    def drop(self, key):
        """The bundle as a build without that artifact leaves it: not in bundle.yml, not there."""
        index = yaml.safe_load((self.bundle / "bundle.yml").read_text())
        (self.bundle / index["artifacts"].pop(key)["path"]).unlink()
        (self.bundle / "bundle.yml").write_text(yaml.safe_dump(index, sort_keys=False))
        write_manifest(self.bundle)

    def write(self):
        (self.inventory / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
        (self.inventory / "hosts.yml").write_text(yaml.safe_dump(self.hosts))
        (self.inventory / "group_vars" / "all" / "test.yml").write_text(yaml.safe_dump(self.vars))

    def run(self, playbook=ROOT / "playbooks/image.yml", *extra):
        self.write()
        env = dict(
            os.environ,
            ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_FORCE_COLOR="0",
            ANSIBLE_CACHE_PLUGIN_CONNECTION=str(self.tmp / "facts"),
            ANSIBLE_TIMEOUT="3",
        )
        proc = subprocess.run(
            [
                str(ROOT / ".venv/bin/ansible-playbook"),
                "-i",
                str(self.inventory),
                str(playbook),
                "-e",
                "kunlun_stack_bundle_sum_cache=%s" % (self.tmp / "sums.json"),
                *extra,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        return proc.returncode, proc.stdout + proc.stderr
