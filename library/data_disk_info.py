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
  - The reading and the rules are C(module_utils/data_disks.py), which C(data_disk_candidates)
    shares, so both say the same words for the same disk.
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

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.data_disks import DiskReader, read_disk


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
