#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: volume_info
short_description: Read a data volume and its mount point in one call, without changing anything
description:
  - Reports what is mounted at I(mount_point) (source device, filesystem type, filesystem UUID,
    mount options; the top one when several are stacked), whether the volume group and the
    logical volume I(lv) exist, the logical volume's filesystem UUID, type and size, and for a
    mounted XFS its C(ftype) (overlay2 needs 1).
  - Finds which LVM logical volume, of any volume group, is mounted at I(mount_point) (matched by
    device number, so C(/dev/mapper/...), C(/dev/VG/LV) and C(/dev/dm-N) sources all match), with
    its volume group's size, free space and physical volumes (the volume the storage stage adopts).
  - Reads the I(fstab) line of the mount point and how it names the device (UUID, LABEL, path).
  - Reads with findmnt, blkid -p (the device itself, not the blkid cache), vgs, lvs, pvs and xfs_info.
  - Read-only; safe in check mode.
options:
  mount_point:
    description: The mount point (C(storage_mount_point)).
    type: path
    required: true
  lv:
    description: The logical volume as C(<vg>/<lv>).
    type: str
    required: true
  fstab:
    description: The fstab file whose line for I(mount_point) is reported.
    type: path
    default: /etc/fstab
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Read the volume and the mount point
  volume_info:
    mount_point: /home
    lv: data/home
  register: storage_volume
"""

RETURN = r"""
mount:
  description: What is mounted at the mount point; empty when nothing is.
  returned: always
  type: dict
  sample: {source: /dev/mapper/data-home, fstype: xfs, uuid: 0b9c..., options: "rw,noatime,..."}
vg_exists:
  description: Whether the volume group exists.
  returned: always
  type: bool
lv:
  description: The logical volume (path, exists, uuid, fstype, size_bytes; empty strings and 0 when absent).
  returned: always
  type: dict
xfs_ftype:
  description: The C(ftype) of the XFS mounted at the mount point, or null (not mounted, not XFS).
  returned: always
  type: int
mounted_lv:
  description:
    - The logical volume mounted at the mount point, whatever its names; empty when the mount point
      is not mounted from a logical volume. Sizes in bytes; C(pvs) the volume group's physical volumes.
  returned: always
  type: dict
  sample: {vg: vg0, lv: lv_home, path: /dev/vg0/lv_home, size_bytes: 15393162788864,
           vg_size_bytes: 15393162788864, vg_free_bytes: 0, pvs: [/dev/sdb]}
fstab:
  description:
    - The fstab line of the mount point (C(spec), C(fstype), C(options), C(line)) and how it names the
      device (C(by) is C(uuid), C(label), C(path) or C(other)); empty when fstab has no line for it.
  returned: always
  type: dict
  sample: {spec: /dev/mapper/vg0-lv_home, fstype: xfs, options: defaults, dump: "0", passno: "2", by: path,
           line: /dev/mapper/vg0-lv_home /home xfs defaults 0 2}
"""

import json
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.data_disks import LVS_COLUMNS, match_lv, parse_fstab, parse_lvs_rows, same_device


def parse_blkid_export(text):
    """{KEY: value} from `blkid -o export`."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def parse_findmnt_json(text):
    """The top filesystem mounted at the mount point from `findmnt -J`, or {}."""
    try:
        systems = (json.loads(text) if text.strip() else {}).get("filesystems") or []
    except ValueError:
        return {}
    if not systems:
        return {}
    top = systems[-1]
    return {
        "source": top.get("source") or "",
        "fstype": top.get("fstype") or "",
        "options": top.get("options") or "",
        "devno": top.get("maj:min") or "",
    }


def parse_xfs_ftype(text):
    match = re.search(r"\bftype=([01])\b", text)
    return int(match.group(1)) if match else None


def parse_lvs_size(text):
    value = text.strip().split()
    return int(float(value[0])) if value else 0


def read(module, mount_point, lv, fstab="/etc/fstab"):
    def run(argv):
        return module.run_command(argv, environ_update={"LC_ALL": "C"})

    vg_name, _sep, lv_name = lv.partition("/")
    lv_path = "/dev/%s/%s" % (vg_name, lv_name)

    rc, out, err = run(["findmnt", "-J", "--output", "SOURCE,FSTYPE,OPTIONS,MAJ:MIN", "--mountpoint", mount_point])
    if rc not in (0, 1):
        module.fail_json(msg="findmnt %s failed: %s" % (mount_point, err.strip()))
    mount = parse_findmnt_json(out) if rc == 0 else {}
    if mount:
        rc, out, _err = run(["blkid", "-p", "-o", "value", "-s", "UUID", mount["source"]])
        mount["uuid"] = out.strip() if rc == 0 else ""

    # A host without the LVM tools (a bare server before the storage stage installs them;
    # preflight reads it too) has no volume group.
    lvm = module.get_bin_path("vgs") is not None
    rc = run(["vgs", "--noheadings", "--options", "vg_name", vg_name])[0] if lvm else 1
    vg_exists = rc == 0

    # The volume exists for use when its device node does (an LV in the metadata but not
    # activated cannot be mounted).
    lv_info = {"path": lv_path, "exists": lvm and os.path.exists(lv_path), "uuid": "", "fstype": "", "size_bytes": 0}
    if lv_info["exists"]:
        rc, out, _err = run(["lvs", "--noheadings", "--nosuffix", "--units", "b", "--options", "lv_size", lv])
        lv_info["size_bytes"] = parse_lvs_size(out) if rc == 0 else 0
        rc, out, err = run(["blkid", "-p", "-o", "export", lv_path])
        # 2: no signature on the volume (not made yet).
        if rc not in (0, 2):
            module.fail_json(msg="blkid %s failed: %s" % (lv_path, err.strip()))
        found = parse_blkid_export(out) if rc == 0 else {}
        lv_info.update(uuid=found.get("UUID", ""), fstype=found.get("TYPE", ""))

    ftype = None
    if mount.get("fstype") == "xfs" and module.get_bin_path("xfs_info"):
        rc, out, _err = run(["xfs_info", mount_point])
        ftype = parse_xfs_ftype(out) if rc == 0 else None
    return {
        "mount": mount,
        "vg_exists": vg_exists,
        "lv": lv_info,
        "xfs_ftype": ftype,
        "mounted_lv": mounted_lv(module, run, mount) if lvm else {},
        "fstab": read_fstab(module, fstab, mount_point),
    }


def mounted_lv(module, run, mount):
    """The logical volume (any volume group) whose device is mounted, or {}."""
    if not mount:
        return {}
    rc, out, err = run(
        ["lvs", "--noheadings", "--nosuffix", "--units", "b", "--separator", "|", "--options", LVS_COLUMNS]
    )
    if rc != 0:
        # No LVM tools or no volume group: nothing mounted can be a logical volume.
        return {}
    # same_device is looked up here, at call time (the unit tests stand in for it).
    row = match_lv(parse_lvs_rows(out), mount.get("devno"), mount["source"], same=same_device)
    if not row:
        return {}
    rc, out, err = run(["pvs", "--noheadings", "--options", "pv_name", "--select", "vg_name=" + row["vg"]])
    if rc != 0:
        module.fail_json(msg="pvs (volume group %s) failed: %s" % (row["vg"], err.strip()))
    row["pvs"] = sorted(line.strip() for line in out.splitlines() if line.strip())
    return row


def read_fstab(module, path, mount_point):
    try:
        with open(path) as fh:
            return parse_fstab(fh.read(), mount_point)
    except (IOError, OSError) as exc:
        if getattr(exc, "errno", None) == 2:
            return {}
        module.fail_json(msg="cannot read %s: %s" % (path, exc))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mount_point=dict(type="path", required=True),
            lv=dict(type="str", required=True),
            fstab=dict(type="path", default="/etc/fstab"),
        ),
        supports_check_mode=True,
    )
    lv = module.params["lv"]
    if not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*/[A-Za-z0-9_][A-Za-z0-9_.+-]*$", lv):
        module.fail_json(msg="lv %r is not <volume group>/<logical volume>" % lv)
    module.exit_json(changed=False, **read(module, module.params["mount_point"], lv, module.params["fstab"]))


if __name__ == "__main__":
    main()
