#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: data_disk_info
short_description: Tell what the data disks named in the inventory hold, without touching them
description:
  - For each path given, reports whether it exists and is a block device, its size, the
    signatures on it (C(wipefs --no-act) and C(blkid -p)), its partitions (C(lsblk)) and the LVM
    volume group it belongs to, and classifies it as C(empty), C(ours) (a physical volume of the
    expected volume group) or C(foreign) (anything else, which nobody may take unless told to).
  - Works from the paths given, not from C(ansible_devices) (sysfs is not trustworthy inside
    containers and device names move between boots).
  - Read-only; safe in check mode.
options:
  disks:
    description: Device paths of the data disks (C(storage_data_disks)).
    type: list
    elements: path
    required: true
  vg_name:
    description: The volume group kunlun-fleet builds; a disk already in it is C(ours).
    type: str
    default: data
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Read the data disks
  data_disk_info:
    disks: "{{ storage_data_disks }}"
    vg_name: data
  register: preflight_disks
"""

RETURN = r"""
disks:
  description: One entry per disk, in the order given.
  returned: always
  type: list
  elements: dict
  sample:
    - path: /dev/vdb
      exists: true
      block: true
      size_bytes: 15393162788864
      signatures: []
      partitions: []
      vg: null
      state: empty
      summary: empty
total_bytes:
  description: The summed size of the disks that exist.
  returned: always
  type: int
"""

import os
import stat

from ansible.module_utils.basic import AnsibleModule


class DiskReader(object):
    """Reads one disk with the standard tools (wipefs, blkid, lsblk, pvs)."""

    def __init__(self, module):
        self.module = module
        self.wipefs = module.get_bin_path("wipefs", required=True)
        self.blkid = module.get_bin_path("blkid", required=True)
        self.lsblk = module.get_bin_path("lsblk", required=True)
        self.blockdev = module.get_bin_path("blockdev", required=True)
        self.pvs = module.get_bin_path("pvs")

    def run(self, args):
        rc, out, err = self.module.run_command(args)
        return rc, out, err

    def size(self, path):
        rc, out, err = self.run([self.blockdev, "--getsize64", path])
        if rc != 0:
            self.module.fail_json(msg="cannot read the size of %s: %s" % (path, err.strip() or out.strip()))
        return int(out.strip())

    def signatures(self, path):
        """Signatures wipefs and blkid see: [{'type':..., 'offset':..., 'source':...}]."""
        found = []
        rc, out, err = self.run([self.wipefs, "--no-act", "--noheadings", "--output", "OFFSET,TYPE", path])
        if rc != 0:
            self.module.fail_json(msg="wipefs --no-act could not read %s: %s" % (path, err.strip()))
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 2:
                found.append({"offset": parts[0], "type": parts[1], "source": "wipefs"})
        # blkid -p probes low-level superblocks; rc 2 means "nothing found".
        rc, out, err = self.run([self.blkid, "-p", "-o", "export", path])
        if rc == 0:
            info = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
            kind = info.get("TYPE") or info.get("PTTYPE")
            if kind and not any(s["type"] == kind for s in found):
                found.append({"offset": "", "type": kind, "source": "blkid"})
        return found

    def partitions(self, path):
        rc, out, err = self.run([self.lsblk, "--noheadings", "--raw", "--output", "NAME,TYPE", path])
        if rc != 0:
            return []
        return [line.split()[0] for line in out.splitlines()[1:] if line.split()[1:2] == ["part"]]

    def volume_group(self, path):
        if not self.pvs:
            return None
        rc, out, err = self.run([self.pvs, "--noheadings", "--options", "vg_name", path])
        if rc != 0:
            return None
        return out.strip() or None


def classify(entry, vg_name):
    """(state, summary) for one disk entry."""
    if not entry["exists"]:
        return "missing", "does not exist"
    if not entry["block"]:
        return "not_block", "is not a block device"
    if entry["partitions"]:
        return "foreign", "holds partitions %s" % ", ".join(entry["partitions"])
    types = [s["type"] for s in entry["signatures"]]
    if not types:
        return "empty", "empty"
    if types == ["LVM2_member"] and entry["vg"] == vg_name:
        return "ours", "physical volume of volume group %s" % vg_name
    if types == ["LVM2_member"]:
        if entry["vg"]:
            return "foreign", "physical volume of another volume group %s" % entry["vg"]
        return "foreign", "an LVM physical volume in no volume group"
    return "foreign", "holds %s" % ", ".join(sorted(set(types)))


def read_disk(reader, path, vg_name):
    entry = {
        "path": path,
        "exists": os.path.exists(path),
        "block": False,
        "size_bytes": 0,
        "signatures": [],
        "partitions": [],
        "vg": None,
    }
    if entry["exists"]:
        entry["block"] = stat.S_ISBLK(os.stat(path).st_mode)
    if entry["block"]:
        entry["size_bytes"] = reader.size(path)
        entry["signatures"] = reader.signatures(path)
        entry["partitions"] = reader.partitions(path)
        entry["vg"] = reader.volume_group(path)
    entry["state"], entry["summary"] = classify(entry, vg_name)
    return entry


def main():
    module = AnsibleModule(
        argument_spec=dict(
            disks=dict(type="list", elements="path", required=True),
            vg_name=dict(type="str", default="data"),
        ),
        supports_check_mode=True,
    )
    reader = DiskReader(module)
    disks = [read_disk(reader, path, module.params["vg_name"]) for path in module.params["disks"]]
    module.exit_json(changed=False, disks=disks, total_bytes=sum(d["size_bytes"] for d in disks))


if __name__ == "__main__":
    main()
