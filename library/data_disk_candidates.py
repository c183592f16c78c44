#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: data_disk_candidates
short_description: List the host's whole disks that could hold its data volume, and what each holds
description:
  - Lists the host's whole disks as the host itself sees them, leaves out the ones its system
    uses, and says of each of the others what it holds, with the words and rules of
    C(data_disk_info) (preflight and the storage stage), C(empty), C(ours) (a physical volume
    of the volume group the storage stage uses) or C(foreign) (anything else, which nobody may
    take unless told to). C(kunlun-fleet inventory --discover) writes each serving host's
    C(storage_data_disks) from it.
  - The disks are the block device nodes directly under C(/dev), not C(/sys/block) or
    C(ansible_devices) (which read sysfs). Inside a container sysfs is the machine's, not the
    container's, so it lists disks the host cannot open and misses the names the host has
    (the sim's C(/dev/vdb) is the machine's C(loop0) there); C(/dev) holds the nodes the host
    can use, under the names it uses for them.
  - Left out by name, as not whole disks, partitions (C(sda1), C(nvme0n1p1), C(mmcblk0p1)) and
    C(loop), C(ram), C(zram), C(dm-), C(sr), C(fd), C(nbd), C(md), C(zd), C(rbd) and C(drbd)
    devices; a disk of size 0 (no medium) too.
  - Left out as the system's, each with the reason in RV(excluded), a disk that holds C(/),
    C(/boot), swap, or any mounted filesystem (from C(/proc/self/mountinfo) and
    C(/proc/swaps); through LVM, the disks of the volume group of a mounted logical volume),
    except the LVM volume mounted at O(mount_point) (the data volume of a delivered server,
    which the storage stage adopts); a filesystem at O(mount_point) that is not on LVM is the
    system's too (its content is carried over onto the new volume, the disk is not taken).
  - Names each disk by a stable C(/dev/disk/by-id/) link when one points at it, preferring the
    model and serial name (C(nvme-SAMSUNG_MZWLR7T6HALA-00007_S6EWNE0T100001), C(ata-...),
    C(scsi-S...)), the form the example inventory uses and the one printed on the drive and on
    the vendor's delivery sheet, over the C(wwn-) and C(nvme-eui.) names, which are as stable
    but say nothing a person can check against the hardware; then the shortest. Without a link
    (the sim's hosts have none) the kernel name, which may change between boots.
  - Reports the LVM logical volume mounted at O(mount_point), of any volume group, with its
    physical volumes and its fstab line; its disks are classified against its own volume group,
    as preflight does when it adopts that volume.
  - Read-only; safe in check mode.
options:
  mount_point:
    description: Where the data volume is mounted (C(storage_mount_point)).
    type: path
    default: /home
  vg_name:
    description: The volume group the storage stage builds (C(storage_vg_name)); a disk already in it is C(ours).
    type: str
    default: data
  lv_name:
    description:
      - The logical volume the storage stage builds (C(storage_lv_name)). A volume at O(mount_point)
        of another name is one the storage stage adopts (C(home_volume.adopt)).
    type: str
    default: home
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: The host's candidate data disks
  data_disk_candidates:
    mount_point: /home
    vg_name: data
    lv_name: home
  register: discovered_disks
"""

RETURN = r"""
disks:
  description:
    - One entry per candidate disk, in the order of their kernel names. C(path) is the kernel
      name, C(by_id) the preferred C(/dev/disk/by-id/) link or null, C(name) the one to put in
      C(storage_data_disks) (C(by_id), else C(path)), C(by_id_links) every link to it; C(home)
      whether it holds the volume at O(mount_point); the rest as C(data_disk_info) reports a disk.
  returned: always
  type: list
  elements: dict
  sample:
    - path: /dev/nvme0n1
      by_id: /dev/disk/by-id/nvme-SAMSUNG_MZWLR7T6HALA-00007_S6EWNE0T100001
      name: /dev/disk/by-id/nvme-SAMSUNG_MZWLR7T6HALA-00007_S6EWNE0T100001
      by_id_links: [/dev/disk/by-id/nvme-SAMSUNG_MZWLR7T6HALA-00007_S6EWNE0T100001,
                    /dev/disk/by-id/nvme-eui.36344730529001230025384100000001]
      size_bytes: 7681501126656
      state: empty
      summary: empty
      signatures: []
      partitions: []
      vg: null
      home: false
excluded:
  description: The whole disks left out as the system's, each with why (C(path), C(by_id), C(reason)).
  returned: always
  type: list
  elements: dict
  sample:
    - path: /dev/sda
      by_id: /dev/disk/by-id/ata-INTEL_SSDSC2KB480G8_PHYF000000480BGN
      reason: holds /, /boot/efi, swap
home_volume:
  description:
    - The LVM logical volume mounted at O(mount_point); empty when nothing is mounted there or it is
      not a logical volume. C(own) is true for the volume the storage stage builds
      (O(vg_name)/O(lv_name)), C(adopt) for any other (kept as it is, grown, never rebuilt);
      C(disks) the kernel paths of the disks holding its physical volumes; C(fstab) its fstab line
      and how it names the device (C(by) C(uuid), C(label), C(path) or C(other)).
  returned: always
  type: dict
  sample: {vg: vg0, lv: lv_home, path: /dev/vg0/lv_home, fstype: ext4, size_bytes: 15393162788864,
           vg_size_bytes: 15393162788864, vg_free_bytes: 0, pvs: [/dev/vdb], disks: [/dev/vdb], own: false,
           adopt: true, fstab: {spec: /dev/mapper/vg0-lv_home, by: path}}
mount_point:
  description: The mount point read (O(mount_point), without a trailing slash).
  returned: always
  type: str
home_mount:
  description: What is mounted at O(mount_point) (C(source), C(fstype), C(devno)); empty when nothing is.
  returned: always
  type: dict
vg_classified:
  description:
    - The volume group a disk must be a physical volume of to be C(ours) (the adopted volume's, else O(vg_name)).
  returned: always
  type: str
"""

import os
import re
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.data_disks import (
    LVS_COLUMNS,
    DiskReader,
    match_lv,
    parse_fstab,
    parse_lvs_rows,
    read_disk,
    same_device,
)

DEV = "/dev"
BY_ID = "/dev/disk/by-id"
MOUNTINFO = "/proc/self/mountinfo"
SWAPS = "/proc/swaps"
FSTAB = "/etc/fstab"

# Block devices that are not whole disks (by kernel name).
NOT_DISKS = re.compile(r"^(loop|ram|zram|dm-|sr|fd|nbd|md|zd|rbd|drbd)\d")
# Partitions by name alone (the parent's node may not be in this /dev).
PARTITION = re.compile(r"^((?:sd|vd|xvd|hd)[a-z]+)(\d+)$|^((?:nvme\d+n\d+|mmcblk\d+|nvme\d+c\d+n\d+))p(\d+)$")
# by-id names that carry the drive's model and serial (preferred); anything else with a
# known prefix (wwn-, nvme-eui., nvme-nvme., scsi-3..., scsi-0...) ranks after them.
MODEL_SERIAL = re.compile(r"^(nvme-(?!eui\.|nvme\.|uuid\.)|ata-|scsi-S|usb-|mmc-|virtio-)")
OPAQUE = re.compile(r"^(wwn-|nvme-eui\.|nvme-nvme\.|nvme-uuid\.|scsi-[0-9])")


def natural(name):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def block_nodes(dev_dir=DEV):
    """{kernel name: "MAJ:MIN"} of the block device nodes directly in dev_dir (links not followed)."""
    found = {}
    try:
        names = os.listdir(dev_dir)
    except OSError:
        return found
    for name in sorted(names, key=natural):
        try:
            st = os.lstat(os.path.join(dev_dir, name))
        except OSError:
            continue
        if stat.S_ISBLK(st.st_mode):
            found[name] = "%d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev))
    return found


def parent_of(name, names):
    """The disk a partition belongs to (its kernel name), or None when name is no partition."""
    match = PARTITION.match(name)
    if match:
        return match.group(1) or match.group(3)
    for other in names:
        if other != name and name.startswith(other):
            rest = name[len(other) :]
            if (other[-1].isalpha() and rest.isdigit()) or (
                other[-1].isdigit() and rest[:1] == "p" and rest[1:].isdigit()
            ):
                return other
    return None


def whole_disks(nodes):
    """The kernel names of nodes that are whole disks: no partition, none of NOT_DISKS; one name
    per device number."""
    seen, disks = set(), []
    for name, devno in nodes.items():
        if NOT_DISKS.match(name) or parent_of(name, nodes) or devno in seen:
            continue
        seen.add(devno)
        disks.append(name)
    return disks


def rank_by_id(link):
    """Sort key of a by-id link name: model and serial first, opaque ids after, then the shortest."""
    if MODEL_SERIAL.match(link):
        kind = 0
    elif OPAQUE.match(link):
        kind = 1
    else:
        kind = 2
    return (kind, len(link), link)


def by_id_links(by_id_dir=BY_ID):
    """{kernel name: [by-id link names, preferred first]} of the links in by_id_dir."""
    found = {}
    try:
        names = os.listdir(by_id_dir)
    except OSError:
        return found
    for link in names:
        path = os.path.join(by_id_dir, link)
        if not os.path.islink(path):
            continue
        found.setdefault(os.path.basename(os.path.realpath(path)), []).append(link)
    return dict((name, sorted(links, key=rank_by_id)) for name, links in found.items())


def unescape_mountinfo(field):
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text):
    """[{devno, mount_point, fstype, source}] from /proc/self/mountinfo, in its order."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        mounts.append(
            {
                "devno": fields[2],
                "mount_point": unescape_mountinfo(fields[4]),
                "fstype": tail[0],
                "source": unescape_mountinfo(tail[1]),
            }
        )
    return mounts


def parse_swaps(text):
    """The block devices and files /proc/swaps lists."""
    return [line.split()[0] for line in text.splitlines()[1:] if line.split()]


def read_text(path):
    try:
        with open(path) as fh:
            return fh.read()
    except (IOError, OSError):
        return ""


def devno_of(path):
    """The "MAJ:MIN" of the block device at path, or of the filesystem holding a file; None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    dev = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
    return "%d:%d" % (os.major(dev), os.minor(dev))


class Discovery(object):
    """The host's disks, what its system uses and the volume at the mount point."""

    def __init__(self, module, mount_point, vg_name, lv_name):
        self.module = module
        self.mount_point = mount_point.rstrip("/") or "/"
        self.vg_name, self.lv_name = vg_name, lv_name
        self.lvm = module.get_bin_path("lvs") is not None and module.get_bin_path("pvs") is not None
        self._lv_rows = None
        self._pvs = None

    def run(self, argv):
        return self.module.run_command(argv, environ_update={"LC_ALL": "C"})

    def lv_rows(self):
        if self._lv_rows is None:
            self._lv_rows = []
            if self.lvm:
                rc, out, _err = self.run(
                    ["lvs", "--noheadings", "--nosuffix", "--units", "b", "--separator", "|", "--options", LVS_COLUMNS]
                )
                self._lv_rows = parse_lvs_rows(out) if rc == 0 else []
        return self._lv_rows

    def pvs(self):
        """[(pv path, vg name)] of every physical volume."""
        if self._pvs is None:
            self._pvs = []
            if self.lvm:
                rc, out, _err = self.run(["pvs", "--noheadings", "--separator", "|", "--options", "pv_name,vg_name"])
                for line in out.splitlines() if rc == 0 else []:
                    fields = [f.strip() for f in line.split("|")]
                    if len(fields) == 2 and fields[0]:
                        self._pvs.append((fields[0], fields[1]))
        return self._pvs

    def disk_of(self, name, nodes):
        """The whole disk (kernel name) a node is or is a partition of."""
        return parent_of(name, nodes) or name

    def disks_under(self, devno, source, nodes, by_devno):
        """(kernel names of the whole disks holding the device devno, its logical volume row or None)."""
        name = by_devno.get(devno)
        if name and not NOT_DISKS.match(name):
            return [self.disk_of(name, nodes)], None
        row = match_lv(self.lv_rows(), devno, source, same=same_device)
        if row is None:
            # Not a disk of this host (a container's bind mounts of the machine's disk), or a
            # device mapper target that is not LVM: nothing to leave out by it.
            return [], None
        disks = []
        for pv, vg in self.pvs():
            if vg != row["vg"]:
                continue
            pv_name = os.path.basename(os.path.realpath(pv))
            if pv_name in nodes:
                disk = self.disk_of(pv_name, nodes)
                if disk not in disks:
                    disks.append(disk)
        return disks, row

    def read(self):
        nodes = block_nodes(DEV)
        by_devno = {}
        for name, devno in nodes.items():
            by_devno.setdefault(devno, name)
        links = by_id_links(BY_ID)
        disks = whole_disks(nodes)

        uses = {}  # disk -> [what of the system it holds]
        home_mount, home_disks, home_row = {}, [], None
        mounts = parse_mountinfo(read_text(MOUNTINFO))
        for mount in mounts:  # the last one mounted there is the one seen (the top of a stack)
            if mount["mount_point"] == self.mount_point:
                home_mount = {"source": mount["source"], "fstype": mount["fstype"], "devno": mount["devno"]}
        for mount in mounts:
            held, row = self.disks_under(mount["devno"], mount["source"], nodes, by_devno)
            if mount["mount_point"] == self.mount_point and mount["devno"] == home_mount.get("devno"):
                if row is not None:
                    home_disks, home_row = held, row
                    continue
                what = "%s (not an LVM volume: its content is carried over, the disk is not taken)" % self.mount_point
            elif mount["mount_point"] in ("/", "/boot", "/boot/efi"):
                what = mount["mount_point"]
            else:
                what = "a filesystem mounted at %s" % mount["mount_point"]
            for disk in held:
                if what not in uses.setdefault(disk, []):
                    uses[disk].append(what)
        for swap in parse_swaps(read_text(SWAPS)):
            devno = devno_of(swap)
            held = self.disks_under(devno, swap, nodes, by_devno)[0] if devno else []
            for disk in held:
                if "swap" not in uses.setdefault(disk, []):
                    uses[disk].append("swap")

        home_volume = {}
        if home_row is not None:
            home_volume = dict(home_row)
            home_volume.update(
                fstype=home_mount.get("fstype", ""),
                pvs=sorted(pv for pv, vg in self.pvs() if vg == home_row["vg"]),
                disks=["%s/%s" % (DEV, d) for d in home_disks],
                own=(home_row["vg"], home_row["lv"]) == (self.vg_name, self.lv_name),
                fstab=parse_fstab(read_text(FSTAB), self.mount_point),
            )
            home_volume["adopt"] = not home_volume["own"]
        vg_classified = home_row["vg"] if home_row is not None else self.vg_name

        reader = DiskReader(self.module)
        candidates, excluded = [], []
        for name in disks:
            path = "%s/%s" % (DEV, name)
            names = ["%s/%s" % (BY_ID, link) for link in links.get(name, [])]
            by_id = names[0] if names else None
            if name in uses:
                excluded.append({"path": path, "by_id": by_id, "reason": "holds " + ", ".join(uses[name])})
                continue
            if reader.size(path) == 0:
                excluded.append({"path": path, "by_id": by_id, "reason": "size 0 (no medium)"})
                continue
            entry = read_disk(reader, path, vg_classified)
            entry.update(by_id=by_id, name=by_id or path, by_id_links=names, home=name in home_disks)
            candidates.append(entry)
        return {
            "disks": candidates,
            "excluded": excluded,
            "home_volume": home_volume,
            "home_mount": home_mount,
            "mount_point": self.mount_point,
            "vg_classified": vg_classified,
        }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mount_point=dict(type="path", default="/home"),
            vg_name=dict(type="str", default="data"),
            lv_name=dict(type="str", default="home"),
        ),
        supports_check_mode=True,
    )
    found = Discovery(module, module.params["mount_point"], module.params["vg_name"], module.params["lv_name"]).read()
    module.exit_json(changed=False, **found)


if __name__ == "__main__":
    main()
