# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a data disk holds, and the LVM volume and fstab line of a mount point: the reading
and the rules the storage stage, preflight and the inventory's discovery share.

- DiskReader, read_disk and classify: one disk read with wipefs, blkid -p, lsblk and pvs and
  judged empty, ours (a physical volume of the volume group given) or foreign (anything
  else, which nobody may take unless told to). library/data_disk_info.py (preflight, the
  storage stage) and library/data_disk_candidates.py (`kunlun-fleet inventory --discover`)
  say the same words for the same disk.
- parse_lvs_rows, same_device, match_lv: which logical volume, of any volume group, is the
  device mounted somewhere (by device number, so /dev/mapper/..., /dev/VG/LV and /dev/dm-N
  sources all match).
- parse_fstab: the fstab line of a mount point and how it names its device.

Standard library and the module's run_command only; runs on the managed hosts' Python.
"""

from __future__ import absolute_import, division, print_function

import os
import re
import stat

__metaclass__ = type


# ---------------------------------------------------------------- one disk


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


# ---------------------------------------------------------------- logical volumes

# The columns parse_lvs_rows reads, in its order (`lvs --separator '|' --options LVS_COLUMNS`).
LVS_COLUMNS = "vg_name,lv_name,lv_path,lv_size,vg_size,vg_free"


def parse_lvs_rows(text):
    """[{vg, lv, path, size_bytes, vg_size_bytes, vg_free_bytes}] from `lvs --separator '|'`."""
    rows = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) != 6 or not fields[0]:
            continue
        vg, lv, path, size, vg_size, vg_free = fields
        try:
            rows.append(
                {
                    "vg": vg,
                    "lv": lv,
                    "path": path or "/dev/%s/%s" % (vg, lv),
                    "size_bytes": int(float(size)),
                    "vg_size_bytes": int(float(vg_size)),
                    "vg_free_bytes": int(float(vg_free)),
                }
            )
        except ValueError:
            continue
    return rows


def same_device(path, devno):
    """Whether the block device at path is the device devno ("MAJ:MIN")."""
    try:
        rdev = os.stat(path).st_rdev
    except OSError:
        return False
    return "%d:%d" % (os.major(rdev), os.minor(rdev)) == devno


def match_lv(rows, devno, source="", same=same_device):
    """The row of parse_lvs_rows whose logical volume is the device devno ("MAJ:MIN"), or,
    failing that, whose path resolves to source (an absolute device path); None."""
    source = os.path.realpath(source) if source and source.startswith("/") else ""
    for row in rows:
        if (devno and same(row["path"], devno)) or (
            source and os.path.exists(row["path"]) and os.path.realpath(row["path"]) == source
        ):
            return row
    return None


# ---------------------------------------------------------------- fstab


def unescape_fstab(field):
    """fstab's octal escapes (\\040 for a space)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_fstab(text, mount_point):
    """The last fstab line mounting at mount_point (mount -a takes them in order), or {}."""
    found = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[0].startswith("#"):
            continue
        if unescape_fstab(fields[1]).rstrip("/") != mount_point.rstrip("/"):
            continue
        spec = fields[0].replace('"', "")
        if spec.upper().startswith("UUID="):
            by = "uuid"
        elif spec.upper().startswith("LABEL="):
            by = "label"
        elif spec.startswith("/dev/"):
            by = "path"
        else:
            by = "other"
        found = {
            "spec": spec,
            "fstype": fields[2],
            "options": fields[3] if len(fields) > 3 else "defaults",
            "dump": fields[4] if len(fields) > 4 else "0",
            "passno": fields[5] if len(fields) > 5 else "0",
            "by": by,
            "line": " ".join(fields),
        }
    return found
