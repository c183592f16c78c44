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
  - Reads with findmnt, blkid -p (the device itself, not the blkid cache), vgs, lvs and xfs_info.
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
author:
  - kunlun-fleet contributors
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
"""

import json
import os
import re

from ansible.module_utils.basic import AnsibleModule


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
    return {"source": top.get("source") or "", "fstype": top.get("fstype") or "",
            "options": top.get("options") or ""}


def parse_xfs_ftype(text):
    match = re.search(r"\bftype=([01])\b", text)
    return int(match.group(1)) if match else None


def parse_lvs_size(text):
    value = text.strip().split()
    return int(float(value[0])) if value else 0


def read(module, mount_point, lv):
    def run(argv):
        return module.run_command(argv, environ_update={"LC_ALL": "C"})

    vg_name, _, lv_name = lv.partition("/")
    lv_path = "/dev/%s/%s" % (vg_name, lv_name)

    rc, out, err = run(["findmnt", "-J", "--output", "SOURCE,FSTYPE,OPTIONS", "--mountpoint", mount_point])
    if rc not in (0, 1):
        module.fail_json(msg="findmnt %s failed: %s" % (mount_point, err.strip()))
    mount = parse_findmnt_json(out) if rc == 0 else {}
    if mount:
        rc, out, _ = run(["blkid", "-p", "-o", "value", "-s", "UUID", mount["source"]])
        mount["uuid"] = out.strip() if rc == 0 else ""

    rc, _, _ = run(["vgs", "--noheadings", "--options", "vg_name", vg_name])
    vg_exists = rc == 0

    # The volume exists for use when its device node does (an LV in the metadata but not
    # activated cannot be mounted).
    lv_info = {"path": lv_path, "exists": os.path.exists(lv_path), "uuid": "", "fstype": "", "size_bytes": 0}
    if lv_info["exists"]:
        rc, out, _ = run(["lvs", "--noheadings", "--nosuffix", "--units", "b", "--options", "lv_size", lv])
        lv_info["size_bytes"] = parse_lvs_size(out) if rc == 0 else 0
        rc, out, err = run(["blkid", "-p", "-o", "export", lv_path])
        # 2: no signature on the volume (not made yet).
        if rc not in (0, 2):
            module.fail_json(msg="blkid %s failed: %s" % (lv_path, err.strip()))
        found = parse_blkid_export(out) if rc == 0 else {}
        lv_info.update(uuid=found.get("UUID", ""), fstype=found.get("TYPE", ""))

    ftype = None
    if mount.get("fstype") == "xfs":
        rc, out, _ = run(["xfs_info", mount_point])
        ftype = parse_xfs_ftype(out) if rc == 0 else None
    return {"mount": mount, "vg_exists": vg_exists, "lv": lv_info, "xfs_ftype": ftype}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mount_point=dict(type="path", required=True),
            lv=dict(type="str", required=True),
        ),
        supports_check_mode=True,
    )
    lv = module.params["lv"]
    if not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*/[A-Za-z0-9_][A-Za-z0-9_.+-]*$", lv):
        module.fail_json(msg="lv %r is not <volume group>/<logical volume>" % lv)
    module.exit_json(changed=False, **read(module, module.params["mount_point"], lv))


if __name__ == "__main__":
    main()
