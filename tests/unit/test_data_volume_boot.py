"""A host whose data disk failed still boots, reachable, and serves nothing: the data
volume's fstab line as the storage role writes it (nofail and a bounded device wait, for a
volume it builds and for an adopted one), templated as Ansible templates the role's
variables, and everything that lives on the volume bound to its mount (RequiresMountsFor=).
The boot itself, with the disk taken away and given back, on a sim host:
tests/storage/test_dead_disk_boot_sim.py."""

import re
from pathlib import Path
from unittest import mock

import pytest
import yaml
from ansible.module_utils import basic

import model_share
from kunlun_fleet.monitoring import _trust
from test_model_peer_modules import run_main

ROOT = Path(__file__).resolve().parents[2]
STORAGE = ROOT / "roles" / "storage"


def load(path):
    return yaml.safe_load(Path(path).read_text())


def template(expr, **extra):
    """expr templated with the storage role's defaults and derived variables (and
    kunlun_stack's, which they name), the inventory's ``extra`` over the defaults."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables = dict(load(ROOT / "roles/kunlun_stack/defaults/main.yml"))
    variables.update(load(STORAGE / "defaults/main.yml"))
    variables.update(extra)
    variables.update(load(ROOT / "roles/kunlun_stack/vars/main.yml"))
    variables.update(load(STORAGE / "vars/main.yml"))
    return Templar(loader=DataLoader(), variables=_trust(variables)).template(trust_as_template(expr))


def test_the_defaults_give_nofail_and_systemds_own_device_wait():
    defaults = load(STORAGE / "defaults/main.yml")
    assert defaults["storage_mount_nofail"] is True and defaults["storage_mount_device_timeout"] == 90
    specs = load(STORAGE / "meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    assert specs["storage_mount_nofail"]["type"] == "bool" and specs["storage_mount_device_timeout"]["type"] == "int"
    assert template("{{ storage_fstab_opts }}") == "defaults,nofail,x-systemd.device-timeout=90s"


@pytest.mark.parametrize(
    "extra, opts",
    [
        ({"storage_mount_device_timeout": 20}, "defaults,nofail,x-systemd.device-timeout=20s"),
        # The role's two options replace the same kind of option in storage_mount_opts.
        (
            {"storage_mount_opts": "noatime,nofail,x-systemd.device-timeout=0,inode64"},
            "noatime,inode64,nofail,x-systemd.device-timeout=90s",
        ),
        # Turned off: storage_mount_opts alone, as written.
        ({"storage_mount_nofail": False, "storage_mount_opts": "defaults,noatime"}, "defaults,noatime"),
    ],
)
def test_the_built_volumes_line(extra, opts):
    assert template("{{ storage_fstab_opts }}", **extra) == opts


def test_the_build_path_mounts_and_writes_fstab_with_them():
    build = load(STORAGE / "tasks/build.yml")
    carried = [t for t in build if "carry_over" in t]
    assert carried and all(t["carry_over"]["mount_opts"] == "{{ storage_fstab_opts }}" for t in carried)
    (mount,) = [t for t in build if "ansible.posix.mount" in t]
    assert mount["ansible.posix.mount"]["opts"] == "{{ storage_fstab_opts }}"
    assert mount["ansible.posix.mount"]["src"] == "UUID={{ storage_lv_uuid_now.stdout | trim }}"


def adopted(line=None, by=None, options=None):
    """storage_volume as disks.yml reads it (volume_info): the mounted XFS and its fstab line."""
    volume = {"mount": {"uuid": "0b9c-77aa", "fstype": "xfs", "source": "/dev/mapper/vg0-lv_home"}, "fstab": {}}
    if line:
        spec, _, fstype, opts, dump, passno = line.split()
        volume["fstab"] = dict(spec=spec, fstype=fstype, options=opts, dump=dump, passno=passno, by=by, line=line)
    return volume


ADOPT_TASK = "Adopt | fstab mounts the volume at boot (nofail, a bounded device wait; by UUID when it had no line)"


@pytest.mark.parametrize(
    "volume, extra, written",
    [
        # As delivered: the line by path keeps its device, type, options, dump and pass.
        (
            adopted("/dev/mapper/vg0-lv_home /home xfs defaults,noatime 0 2", "path"),
            {},
            ("/dev/mapper/vg0-lv_home", "defaults,noatime,nofail,x-systemd.device-timeout=90s"),
        ),
        # ... and by UUID when asked.
        (
            adopted("/dev/mapper/vg0-lv_home /home xfs defaults 0 2", "path"),
            {"storage_fstab_by_uuid": True},
            ("UUID=0b9c-77aa", "defaults,nofail,x-systemd.device-timeout=90s"),
        ),
        # An operator's nofail and device wait of their own: the wait is the role's.
        (
            adopted("UUID=0b9c-77aa /home xfs nofail,x-systemd.device-timeout=5min 0 2", "uuid"),
            {},
            ("UUID=0b9c-77aa", "nofail,x-systemd.device-timeout=90s"),
        ),
        # No line at all: one by UUID.
        (adopted(), {}, ("UUID=0b9c-77aa", "defaults,nofail,x-systemd.device-timeout=90s")),
        # Already as it should be: nothing to write (a second run changes nothing).
        (adopted("UUID=0b9c-77aa /home xfs defaults,nofail,x-systemd.device-timeout=90s 0 2", "uuid"), {}, None),
        (adopted("/dev/vg0/lv_home /home ext4 defaults,nofail,x-systemd.device-timeout=90s 0 2", "path"), {}, None),
        # Turned off: an adopted line is left as it is.
        (adopted("/dev/vg0/lv_home /home ext4 defaults 0 2", "path"), {"storage_mount_nofail": False}, None),
    ],
)
def test_the_adopted_volumes_line(volume, extra, written):
    (task,) = [t for t in load(STORAGE / "tasks/adopt.yml") if t["name"] == ADOPT_TASK]
    args = task["ansible.builtin.mount" if "ansible.builtin.mount" in task else "ansible.posix.mount"]
    assert args["state"] == "present", "an adopted volume is mounted already: only its line is written"
    values = dict(extra, storage_volume=volume)
    writes = template("{{ %s }}" % task["when"].replace("\n", " "), **values)
    assert writes is (written is not None)
    if written:
        assert (template(args["src"], **values), template(args["opts"], **values)) == written


def test_the_device_wait_is_bounded():
    (check,) = [t for t in load(STORAGE / "tasks/main.yml") if t["name"] == "Storage | The variables make sense"]
    that = check["ansible.builtin.assert"]["that"]
    assert "storage_mount_device_timeout | int >= 1" in that, "0 would let the boot wait for the volume forever"
    assert "storage_mount_device_timeout" in check["ansible.builtin.assert"]["fail_msg"]


# ---------------------------------------------------------------- bound to the mount
def unit_section(text):
    return re.search(r"^\[Unit\]\n(.*?)(?=^\[)", text, re.M | re.S).group(1)


@pytest.mark.parametrize(
    "template_path, path",
    [
        # The serving container: the model, its logs (StandardOutput=append:) and the engine's images.
        ("roles/serve/templates/kunlun-serve.service.j2", "serve_data_dir"),
        # The fleet registry's storage (image_fleet_registry_dir, under the data root).
        ("roles/image/templates/kunlun-registry.service.j2", "image_fleet_registry_dir"),
        # The router's logs (gateway_log_dir, under the data tree).
        ("roles/gateway/templates/kunlun-gateway.service.j2", "gateway_log_dir"),
    ],
)
def test_the_units_that_live_on_the_volume_require_its_mount(template_path, path):
    # The path as the role's variable, quoted for systemd or not.
    assert re.search(
        r"^RequiresMountsFor=\{\{ %s( \| systemd_quote\(command=false\))? \}\}$" % path,
        unit_section((ROOT / template_path).read_text()),
        re.M,
    )


def test_dockers_drop_in_requires_the_data_roots_mount():
    (dropin,) = [
        t for t in load(ROOT / "roles/engine/tasks/main.yml") if "starts only once its data-root" in t.get("name", "")
    ]
    assert "[Unit]\nRequiresMountsFor={{ engine_data_root }}\n" in dropin["ansible.builtin.copy"]["content"]


def test_the_model_share_requires_the_models_mount(tmp_path):
    """The transient unit of the model share (systemd-run) gets RequiresMountsFor= its root."""
    for name in ("share.py", "m.sha256"):
        (tmp_path / name).write_text("x\n")
    (tmp_path / "model").mkdir()
    calls = []

    def run_command(self, argv, **kw):
        calls.append(argv)
        return (3, "inactive\n", "") if "is-active" in argv else (0, "", "")

    with (
        mock.patch.object(basic.AnsibleModule, "run_command", run_command),
        mock.patch.object(basic.AnsibleModule, "get_bin_path", lambda self, name, **kw: "/usr/bin/" + name),
        mock.patch.object(model_share, "_answers", lambda *a: True),
    ):
        result = run_main(
            model_share,
            {
                "state": "started",
                "script": str(tmp_path / "share.py"),
                "address": "10.0.0.1",
                "root": str(tmp_path / "model"),
                "manifest": str(tmp_path / "m.sha256"),
            },
        )
    assert result.get("failed") is not True, result
    (run,) = [c for c in calls if c[0].endswith("systemd-run")]
    assert run[run.index("RequiresMountsFor=%s" % (tmp_path / "model")) - 1] == "--property"
