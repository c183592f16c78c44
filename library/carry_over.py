#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: carry_over
short_description: Carry an existing directory onto a new filesystem without losing a byte
description:
  - Copies the content of I(src) onto a new filesystem, verifies the copy entry by entry,
    and only then switches over. The source is never deleted or modified.
  - "With I(device): the device is mounted at I(staging), I(src) is copied there, the copy
    is verified, then the device is mounted AT I(src) and an fstab line by filesystem UUID
    is written. The old content stays on the old filesystem, underneath the mount point."
  - "With I(dest): I(src) is copied into the directory I(dest) (already on the new
    filesystem, e.g. /var/lib/docker into /home/docker) and verified; the caller then
    points its service at I(dest)."
  - Copy engine is C(rsync -aHAXS --numeric-ids --one-file-system --delete) (owners, modes,
    times, ACLs, extended attributes, hard links, sparse files, device nodes, FIFOs).
  - Verification compares every entry of both trees - type, permission bits, owner, group,
    size, mtime in ns, symlink target, device numbers, extended attributes (ACLs included),
    a sha256 of the content of every regular file, and the hard-link groups. Entries that
    differ are removed from the COPY and copied again once; if they still differ the
    module fails and does not switch.
  - Resumable at any point. A journal on the new filesystem (C(.kunlun-carry-over.json) at
    the copy's root) records the phase (copying, copied, verified, switching, switched); a
    copy of it is kept in I(state_dir). A re-run after an interruption stops rsync
    processes left by the interrupted run, copies again (rsync only sends what is missing)
    and verifies again before switching. Once switched, a re-run changes nothing.
  - Refuses, before changing anything, when the new filesystem lacks room for the content
    plus I(room_margin_percent), when I(src) is already a mount point of another device,
    when the device holds another filesystem type, a partition table or foreign content,
    when I(src) has other filesystems mounted below it, or when processes hold files
    below I(src) open for writing.
version_added: "0.1.0"
author: kunlun-fleet contributors (@kunlun-fleet)
options:
  src:
    description: Directory whose content is carried. Never deleted or changed.
    type: path
    required: true
  device:
    description:
      - Block device holding the new (already created, empty or partly carried) filesystem,
        e.g. C(/dev/data/home). Mutually exclusive with I(dest).
    type: path
  dest:
    description:
      - Directory on the new filesystem to copy into, e.g. C(/home/docker). Must be absent,
        empty, or an earlier carry-over of the same I(src). Mutually exclusive with
        I(device).
    type: path
  staging:
    description:
      - Where the device is mounted during copy and verification (with I(device)).
      - Default C(/mnt/kunlun-carry-<src, / replaced by ->), e.g. C(/mnt/kunlun-carry-home).
    type: path
  fstype:
    description: Filesystem type the device must hold.
    type: str
    default: xfs
  mount_opts:
    description: Mount options for the staging mount, the final mount and the fstab line.
    type: str
    default: defaults
  switch:
    description:
      - With I(device), after verification mount the device at I(src) and write the fstab
        line. C(false) stops after a verified copy (the staging mount is removed).
    type: bool
    default: true
  fstab:
    description: The fstab file to write (with I(device) and I(switch)).
    type: path
    default: /etc/fstab
  state_dir:
    description:
      Directory on the system disk for a copy of the journal (the lock is /run/lock/kunlun-carry-over-<src>.lock).
    type: path
    default: /var/lib/kunlun-fleet/carry-over
  room_margin_percent:
    description: Free space required on the new filesystem beyond the allocated size of the content, in percent.
    type: int
    default: 5
  lock_timeout:
    description: Seconds to wait for another run carrying the same I(src) to finish.
    type: int
    default: 600
  allow_writers:
    description:
      - Proceed although processes hold files below I(src) open for writing. What they
        write after the copy is NOT carried. Leave C(false) unless you know.
    type: bool
    default: false
  state:
    description: C(carried) is the only state.
    type: str
    choices: [carried]
    default: carried
notes:
  - Supports check mode (reports entries and bytes that would move and the planned fstab
    and mount changes) and diff mode (fstab before/after, mount state before/after).
  - Requires rsync, mount, umount and blkid on the host.
"""

EXAMPLES = r"""
- name: Carry /home onto the new LV and mount it at /home (fstab by UUID)
  carry_over:
    src: /home
    device: /dev/data/home
    staging: /mnt/kunlun-carry-home
    fstype: xfs

- name: Carry the Docker data-root onto the /home volume (docker stopped first)
  carry_over:
    src: /var/lib/docker
    dest: /home/docker
"""

RETURN = r"""
phase:
  description: Journal phase reached (verified, switched, ...).
  returned: always
  type: str
  sample: switched
journal:
  description: Path of the journal on the new filesystem.
  returned: when known
  type: str
  sample: /home/.kunlun-carry-over.json
moved:
  description: What was (or in check mode would be) carried.
  returned: when the content was scanned
  type: dict
  sample:
    {"entries": 1203, "files": 1100, "dirs": 100, "bytes": 52428800, "allocated_bytes": 53000000,
     "hardlink_groups": 3}
uuid:
  description: Filesystem UUID of the device.
  returned: with device, when it holds a filesystem
  type: str
rsync:
  description: Counters of the last rsync run (created, deleted, transferred, files, transferred_bytes).
  returned: when rsync ran
  type: dict
verified:
  description: Number of entries compared and the manifest digest of the verified copy.
  returned: when verification ran
  type: dict
healed:
  description: Copy entries that differed after the first pass and were copied again.
  returned: when verification ran
  type: list
  elements: str
stopped_leftovers:
  description: PIDs of rsync processes of an interrupted earlier run that were stopped.
  returned: always
  type: list
  elements: int
actions:
  description: Steps done (or in check mode planned), in order.
  returned: always
  type: list
  elements: str
"""

import fcntl
import json
import os
import shutil
import signal
import stat
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.carry_over_tree import (
    JOURNAL_NAME,
    TreeScan,
    ancestors,
    compare_scans,
    display,
    fstab_line,
    fstab_plan,
    human,
    mismatched_paths,
    mount_at,
    mounts_of,
    new_journal,
    parse_mountinfo,
    parse_rsync_stats,
    read_journal,
    room_problem,
    rsync_pids_for,
    set_phase,
    slug,
    write_journal,
    writers_below,
)


class Carry(object):
    def __init__(self, module):
        self.m = module
        p = module.params
        self.check = module.check_mode
        self.src = os.path.normpath(os.path.abspath(p["src"]))
        self.device = p["device"]
        self.dest = os.path.normpath(os.path.abspath(p["dest"])) if p["dest"] else None
        self.staging = p["staging"] or "/mnt/kunlun-carry-%s" % slug(self.src)
        self.staging = os.path.normpath(os.path.abspath(self.staging))
        self.fstype = p["fstype"]
        self.opts = p["mount_opts"]
        self.switch = p["switch"]
        self.fstab = p["fstab"]
        self.state_dir = p["state_dir"]
        self.margin = p["room_margin_percent"]
        self.actions = []
        self.result = {"changed": False, "actions": self.actions, "stopped_leftovers": []}
        self.cleanup = []
        self.lock_fd = None

    # ------------------------------------------------------------------ helpers
    def fail(self, msg, **kw):
        for fn in reversed(self.cleanup):
            try:
                fn()
            except Exception:  # cleanup is best effort; the message matters more
                pass
        self.result.update(kw)
        self.result.pop("changed", None)
        self.m.fail_json(
            msg=msg,
            changed=self.result.get("_did_change", False),
            **{k: v for k, v in self.result.items() if not k.startswith("_")},
        )

    def done(self, changed):
        self.result["changed"] = changed
        self.result.pop("_did_change", None)
        self.m.exit_json(**self.result)

    def run(self, argv, what):
        rc, out, err = self.m.run_command(argv)
        if rc != 0:
            self.fail("%s failed (rc=%d): %s: %s" % (what, rc, " ".join(argv), (err or out).strip()[-2000:]))
        return out

    def mounts(self):
        with open("/proc/self/mountinfo") as f:
            return parse_mountinfo(f.read())

    def blkid(self, device):
        blkid = self.m.get_bin_path("blkid", required=True)
        rc, out, err = self.m.run_command([blkid, "-p", "-o", "export", device])
        info = {}
        if rc == 0:
            for line in out.splitlines():
                k, sep, v = line.partition("=")
                if sep:
                    info[k] = v
        elif rc != 2:  # 2: nothing found on the device
            self.fail("blkid -p %s failed (rc=%d): %s; check that the device is readable" % (device, rc, err.strip()))
        return info

    def lock(self, name):
        if self.lock_fd is not None:
            return
        # In /run (volatile): taking the lock leaves nothing behind on a refused run.
        lock_dir = "/run/lock" if os.path.isdir("/run/lock") else "/run"
        path = os.path.join(lock_dir, "kunlun-carry-over-%s.lock" % name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.time() + self.m.params["lock_timeout"]
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except (IOError, OSError):
                if time.time() >= deadline:
                    holder = os.read(fd, 64).decode("ascii", "replace").strip()
                    self.fail(
                        "another carry-over of %s is running (lock %s held by pid %s) for "
                        "longer than lock_timeout=%ss; wait for it to finish, or raise "
                        "lock_timeout" % (self.src, path, holder or "?", self.m.params["lock_timeout"])
                    )
                time.sleep(1)
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, str(os.getpid()).encode("ascii"))
        self.lock_fd = fd

    def stop_leftovers(self, target):
        pids = rsync_pids_for(target)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for _attempt in range(100):
            if not rsync_pids_for(target):
                break
            time.sleep(0.1)
        if pids:
            self.actions.append("stopped rsync left by an interrupted run: %s" % ", ".join(map(str, pids)))
        self.result["stopped_leftovers"] = pids

    def check_writers(self):
        if self.m.params["allow_writers"]:
            return
        w = writers_below(self.src, skip_pids=ancestors())
        if w:
            self.fail(
                "processes hold files below %s open for writing: %s; what they write after "
                "the copy would not be carried. Stop them (e.g. the service owning them) and "
                "re-run, or set allow_writers=true if you accept that."
                % (self.src, "; ".join("pid %d (%s) %s" % (p, c, display(f)) for p, c, f in w[:10]))
            )

    def scan_source(self):
        try:
            s = TreeScan(self.src).scan()
        except OSError as e:
            self.fail(
                "cannot read %s: %s; run as root" % (display(getattr(e, "filename", None) or self.src), e.strerror)
            )
        if s.submounts:
            self.fail(
                "%s has other filesystems mounted below it (%s); the carry-over stays on one "
                "filesystem and the new mount would hide them. Unmount them (and carry them "
                "separately) first." % (self.src, ", ".join(display(p) for p in s.submounts[:10]))
            )
        if s.excluded_present:
            self.fail(
                "%s already contains %s at its top, the journal name of this module: it looks "
                "like an earlier carry-over target. Check what is mounted at %s." % (self.src, JOURNAL_NAME, self.src)
            )
        self.result["moved"] = s.summary()
        return s

    def write_state(self, journal, journal_path):
        rec = dict(journal)
        rec["journal_path"] = journal_path
        os.makedirs(self.state_dir, exist_ok=True)
        path = os.path.join(self.state_dir, slug(self.src) + ".json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(rec, indent=2, sort_keys=True) + "\n")
        os.rename(tmp, path)

    def journal_step(self, journal, path, phase, **extra):
        set_phase(journal, phase, **extra)
        write_journal(path, journal)
        self.write_state(journal, path)
        self.result["phase"] = phase
        self.result["_did_change"] = True

    def room(self, src_scan, target_dir):
        try:
            target = TreeScan(target_dir).scan()
        except OSError as e:
            self.fail("cannot read %s: %s" % (display(target_dir), e.strerror))
        vfs = os.statvfs(target_dir)
        avail = vfs.f_bavail * vfs.f_frsize
        problem = room_problem(
            src_scan.allocated,
            avail + target.allocated,
            self.margin,
            "the content of %s" % self.src,
            "the new filesystem at %s" % target_dir,
            "give the volume more space (add a data disk) or free space in %s" % self.src,
        )
        if problem:
            self.fail(problem)
        if vfs.f_files and src_scan.entries > vfs.f_favail + target.entries:
            self.fail(
                "not enough inodes: %s has %d entries but the new filesystem at %s has %d free "
                "inodes; make the filesystem with more inodes" % (self.src, src_scan.entries, target_dir, vfs.f_favail)
            )

    def rsync(self, target):
        rsync = self.m.get_bin_path("rsync", required=True)
        argv = [
            rsync,
            "-aHAXS",
            "--numeric-ids",
            "--one-file-system",
            "--no-inc-recursive",
            "--delete",
            # XFS lists its on-disk ACLs to root as trusted.SGI_ACL_*: a second rsync
            # would "remove" them as extra xattrs and so strip the copy's ACLs.
            "--filter=-x trusted.SGI_ACL_FILE",
            "--filter=-x trusted.SGI_ACL_DEFAULT",
            "--exclude=/%s" % JOURNAL_NAME,
            "--exclude=/%s.tmp" % JOURNAL_NAME,
            "--stats",
            self.src.rstrip("/") + "/",
            target.rstrip("/") + "/",
        ]
        rc, out, err = self.m.run_command(argv)
        if rc == 24:
            self.fail(
                "files vanished from %s while copying it: something is changing it. Stop "
                "what writes there and re-run (the carry-over resumes)." % self.src
            )
        if rc != 0:
            self.fail(
                "copying %s to %s failed (rsync rc=%d): %s. Fix the cause and re-run: the "
                "carry-over resumes where it stopped." % (self.src, target, rc, (err or out).strip()[-2000:])
            )
        stats = parse_rsync_stats(out)
        self.result["rsync"] = stats
        return stats

    def remove_in_copy(self, target, rels):
        """Remove entries of the COPY (never the source) so rsync sends them again."""
        real_target = os.path.realpath(target)
        for rel in rels:
            path = os.path.join(target, rel)
            if os.path.commonpath([os.path.realpath(os.path.dirname(path)), real_target]) != real_target:
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(path)
            else:
                os.unlink(path)

    def verify(self, target):
        """Compare src and target; copy differing entries again once. Returns the scans."""
        src_scan = TreeScan(self.src, hash_content=True).scan()
        dst_scan = TreeScan(target, hash_content=True).scan()
        diffs = compare_scans(src_scan, dst_scan)
        healed = []
        if diffs:
            healed = mismatched_paths(src_scan, dst_scan)
            self.actions.append(
                "copy differed from the source in %d entries: removed them from "
                "the copy and copied them again" % len(healed)
            )
            self.remove_in_copy(target, healed)
            self.rsync(target)
            src_scan = TreeScan(self.src, hash_content=True).scan()
            dst_scan = TreeScan(target, hash_content=True).scan()
            diffs = compare_scans(src_scan, dst_scan)
        self.result["healed"] = [display(p) for p in healed[:50]]
        return src_scan, dst_scan, diffs

    # ------------------------------------------------------------------ device mode
    def run_device(self):
        device = self.device
        for a, b, what in ((self.staging, self.src, "staging"),):
            if a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/"):
                self.fail("%s=%s and src=%s are nested; choose a staging directory outside %s" % (what, a, b, b))
        mounts = self.mounts()
        m_src = mount_at(mounts, self.src)
        if not os.path.exists(device):
            if self.check:
                self.actions.append(
                    "device %s does not exist yet: would mount it at %s, copy %s, "
                    "verify, then mount it at %s" % (device, self.staging, self.src, self.src)
                )
                if m_src:
                    self.fail(
                        "%s is already a mount point of %s (%s), not of %s; unmount it or "
                        "remove it from fstab if the new volume is to replace it"
                        % (self.src, m_src["source"], m_src["fstype"], device)
                    )
                if self.switch:
                    self.fstab_conflict(None)
                self.check_writers()
                self.scan_source()
                self.result["phase"] = "new"
                return self.done(True)
            self.fail(
                "device %s does not exist; create the volume first (storage role: LV on the "
                "data disks) or fix the device path" % device
            )
        st = os.stat(device)
        if not stat.S_ISBLK(st.st_mode):
            self.fail("device %s is not a block device; give the block device of the new filesystem" % device)
        ident = (os.major(st.st_rdev), os.minor(st.st_rdev))
        info = self.blkid(device)
        uuid = info.get("UUID")
        self.result["uuid"] = uuid

        def is_ours(m):
            if m is None:
                return False
            if (m["major"], m["minor"]) == ident:
                return True
            if uuid and m["source"].startswith("/dev/") and os.path.exists(m["source"]):
                return self.blkid(m["source"]).get("UUID") == uuid
            return False

        if m_src is not None:
            if is_ours(m_src):
                return self.finalize(uuid, mounts)
            self.fail(
                "%s is already a mount point of %s (%s), not of %s (UUID=%s); unmount it or "
                "remove it from fstab if the new volume is to replace it, or point the role "
                "at the device that is mounted there" % (self.src, m_src["source"], m_src["fstype"], device, uuid)
            )
        if info.get("PTTYPE"):
            self.fail(
                "device %s holds a %s partition table, not a %s filesystem; it was not made "
                "for this carry-over. Point at the right device." % (device, info["PTTYPE"], self.fstype)
            )
        if not info.get("TYPE"):
            if self.check:
                self.actions.append(
                    "device %s has no filesystem yet: would copy %s onto it once it "
                    "holds %s" % (device, self.src, self.fstype)
                )
                self.scan_source()
                self.result["phase"] = "new"
                return self.done(True)
            self.fail(
                "device %s holds no filesystem; create the %s filesystem first "
                "(community.general.filesystem) and re-run" % (device, self.fstype)
            )
        if info["TYPE"] != self.fstype:
            self.fail(
                "device %s holds a %s filesystem, not %s; refusing to use it. Point at the new "
                "volume, or set fstype if %s is intended." % (device, info["TYPE"], self.fstype, info["TYPE"])
            )
        elsewhere = [m["mount_point"] for m in mounts_of(mounts, *ident) if m["mount_point"] != self.staging]
        if elsewhere:
            self.fail(
                "device %s is mounted at %s; unmount it there and re-run (it is mounted at "
                "%s while being filled and at %s afterwards)" % (device, ", ".join(elsewhere), self.staging, self.src)
            )
        m_stage = mount_at(mounts, self.staging)
        if m_stage is not None and not is_ours(m_stage):
            self.fail(
                "staging directory %s is a mount point of %s; choose another staging path"
                % (self.staging, m_stage["source"])
            )
        fstab_text, new_fstab = self.fstab_conflict(uuid)
        self.check_writers()
        src_scan = self.scan_source()

        if self.check:
            journal = None
            if m_stage is not None:
                try:
                    journal = read_journal(os.path.join(self.staging, JOURNAL_NAME))
                except (ValueError, IOError, OSError):
                    journal = None
                vfs = os.statvfs(self.staging)
                capacity = vfs.f_bavail * vfs.f_frsize
            else:
                bd = self.m.get_bin_path("blockdev")
                capacity = None
                if bd:
                    rc, out, err = self.m.run_command([bd, "--getsize64", device])
                    if rc == 0 and out.strip().isdigit():
                        capacity = int(out.strip())
            self.result["phase"] = journal["phase"] if journal else "new"
            if capacity is not None:
                problem = room_problem(
                    src_scan.allocated,
                    capacity,
                    self.margin,
                    "the content of %s" % self.src,
                    "device %s" % device,
                    "give the volume more space (add a data disk)",
                )
                if problem:
                    self.fail(problem)
            self.actions.append(
                "would mount %s at %s, copy %d entries (%s) from %s, verify them"
                % (device, self.staging, src_scan.entries, human(src_scan.bytes), self.src)
            )
            if self.switch:
                self.actions.append(
                    "would mount %s at %s and add to %s: %s"
                    % (device, self.src, self.fstab, fstab_line(uuid, self.src, self.fstype, self.opts))
                )
                self.diff(fstab_text, new_fstab, None, device, uuid)
            return self.done(True)

        # ---- real run
        self.stop_leftovers(self.staging)
        if m_stage is None:
            if not os.path.isdir(self.staging):
                os.makedirs(self.staging, mode=0o700)
            self.run(
                [self.m.get_bin_path("mount", required=True), "-t", self.fstype, "-o", self.opts, device, self.staging],
                "mounting %s at %s" % (device, self.staging),
            )
            self.actions.append("mounted %s at %s" % (device, self.staging))
        umount = self.m.get_bin_path("umount", required=True)

        def unmount_staging():
            self.m.run_command([umount, self.staging])
            try:
                os.rmdir(self.staging)
            except OSError:
                pass

        self.cleanup.append(unmount_staging)

        jpath = os.path.join(self.staging, JOURNAL_NAME)
        try:
            journal = read_journal(jpath)
        except ValueError as e:
            self.fail("%s; it is not ours to overwrite. Inspect the device %s." % (e, device))
        if journal is None:
            foreign = sorted(n for n in os.listdir(self.staging) if n not in ("lost+found",))
            if foreign:
                self.fail(
                    "device %s (UUID=%s) already holds content (%s) and no carry-over journal: "
                    "it is not an empty new volume. Refusing to copy over it; point at the "
                    "right device or empty it yourself." % (device, uuid, ", ".join(display(n) for n in foreign[:10]))
                )
            journal = new_journal(self.src, self.staging, device, uuid)
        elif journal.get("src") != self.src:
            self.fail(
                "device %s holds a carry-over of %s, not of %s; point at the right device"
                % (device, journal.get("src"), self.src)
            )
        self.result["journal"] = jpath
        self.room(src_scan, self.staging)
        if journal["phase"] != "new":
            self.actions.append("resuming from phase %s" % journal["phase"])
        self.copy_and_verify(journal, jpath, self.staging)
        if not self.switch:
            unmount_staging()
            self.cleanup = []
            self.actions.append("verified copy left on %s (switch=false)" % device)
            return self.done(True)

        # ---- switch
        self.check_writers()
        self.journal_step(journal, jpath, "switching")
        if new_fstab != fstab_text:
            self.write_fstab(new_fstab)
            self.actions.append("added to %s: %s" % (self.fstab, fstab_line(uuid, self.src, self.fstype, self.opts)))
        self.cleanup = []
        self.run(
            [self.m.get_bin_path("mount", required=True), "-t", self.fstype, "-o", self.opts, device, self.src],
            "mounting %s at %s" % (device, self.src),
        )
        self.actions.append(
            "mounted %s at %s (the old content stays on the old filesystem underneath)" % (device, self.src)
        )
        self.diff(fstab_text, new_fstab, None, device, uuid)
        self.finish_switch(journal, uuid)
        return self.done(True)

    def finish_switch(self, journal, uuid):
        umount = self.m.get_bin_path("umount", required=True)
        if mount_at(self.mounts(), self.staging) is not None:
            rc, out, err = self.m.run_command([umount, self.staging])
            if rc == 0:
                self.actions.append("unmounted %s" % self.staging)
            else:
                self.m.warn("could not unmount the staging mount %s: %s" % (self.staging, err.strip()))
        if os.path.isdir(self.staging) and mount_at(self.mounts(), self.staging) is None:
            try:
                os.rmdir(self.staging)
            except OSError:
                pass
        jpath = os.path.join(self.src, JOURNAL_NAME)
        self.result["journal"] = jpath
        if journal is not None and journal.get("phase") != "switched":
            self.journal_step(journal, jpath, "switched", mounted_at=self.src, uuid=uuid)
            self.actions.append("journal: switched")
        self.result["phase"] = "switched"

    def finalize(self, uuid, mounts):
        """src is already our device: make fstab and the journal agree; change nothing else."""
        fstab_text, new_fstab = self.fstab_conflict(uuid)
        jpath = os.path.join(self.src, JOURNAL_NAME)
        try:
            journal = read_journal(jpath)
        except ValueError as e:
            self.fail("%s; inspect it (the volume is mounted at %s)" % (e, self.src))
        if journal is not None and journal.get("src") not in (None, self.src):
            self.fail(
                "the volume mounted at %s holds a carry-over journal of %s; inspect %s"
                % (self.src, journal.get("src"), jpath)
            )
        staging_mounted = mount_at(mounts, self.staging) is not None
        changed = (
            new_fstab != fstab_text or staging_mounted or (journal is not None and journal.get("phase") != "switched")
        )
        self.result["phase"] = "switched"
        self.result["journal"] = jpath if journal is not None else None
        if journal is None:
            self.actions.append(
                "%s is already the mount point of %s; no carry-over journal on it" % (self.src, self.device)
            )
        if not changed:
            return self.done(False)
        if self.check:
            if new_fstab != fstab_text:
                self.actions.append(
                    "would add to %s: %s" % (self.fstab, fstab_line(uuid, self.src, self.fstype, self.opts))
                )
                self.diff(fstab_text, new_fstab, True, self.device, uuid)
            if staging_mounted:
                self.actions.append("would unmount %s" % self.staging)
            return self.done(True)
        if new_fstab != fstab_text:
            self.write_fstab(new_fstab)
            self.actions.append("added to %s: %s" % (self.fstab, fstab_line(uuid, self.src, self.fstype, self.opts)))
            self.diff(fstab_text, new_fstab, True, self.device, uuid)
        self.stop_leftovers(self.staging)
        self.finish_switch(journal, uuid)
        return self.done(True)

    def fstab_conflict(self, uuid):
        """Refuse when fstab mounts something else at src; returns (text, planned text)."""
        try:
            with open(self.fstab) as f:
                text = f.read()
        except IOError:
            text = ""
        new, problem = fstab_plan(text, self.src, uuid or "<new volume>", self.fstype, self.opts, (self.device,))
        if problem:
            self.fail(problem.replace("/etc/fstab", self.fstab))
        return text, new

    def write_fstab(self, text):
        d = os.path.dirname(self.fstab) or "."
        tmp = os.path.join(d, ".%s.kunlun-carry-over.tmp" % os.path.basename(self.fstab))
        mode = 0o644
        if os.path.exists(self.fstab):
            mode = stat.S_IMODE(os.stat(self.fstab).st_mode)
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        self.m.atomic_move(tmp, self.fstab)

    def diff(self, before_fstab, after_fstab, mounted_before, device, uuid):
        if not self.m._diff:
            return
        before_mount = (
            ("%s: mounted from %s" % (self.src, device))
            if mounted_before
            else ("%s: a directory on the filesystem of %s" % (self.src, os.path.dirname(self.src) or "/"))
        )
        after_mount = "%s: mounted from %s (UUID=%s, %s, %s)" % (self.src, device, uuid, self.fstype, self.opts)
        self.result["diff"] = [
            {"before_header": self.fstab, "after_header": self.fstab, "before": before_fstab, "after": after_fstab},
            {
                "before_header": "mount state of %s" % self.src,
                "after_header": "mount state of %s" % self.src,
                "before": before_mount + "\n",
                "after": after_mount + "\n",
            },
        ]

    def copy_and_verify(self, journal, jpath, target):
        journal["runs"] = journal.get("runs", 0) + 1
        before = journal["phase"]
        self.journal_step(journal, jpath, "copying")
        stats = self.rsync(target)
        self.actions.append(
            "copied %s to %s (rsync: %s created, %s deleted, %s files sent, %s)"
            % (
                self.src,
                target,
                stats.get("created"),
                stats.get("deleted"),
                stats.get("transferred"),
                human(stats.get("transferred_bytes") or 0),
            )
        )
        self.journal_step(journal, jpath, "copied", rsync=stats)
        src_scan, dst_scan, diffs = self.verify(target)
        if diffs:
            self.fail(
                "the copy of %s on %s does not match the source after a second copy; NOT "
                "switching. Differences: %s. Find what changes %s (or what the new "
                "filesystem cannot hold), fix it and re-run." % (self.src, target, "; ".join(diffs), self.src),
                differences=diffs,
            )
        digest = dst_scan.manifest_digest()
        self.result["verified"] = {"entries": dst_scan.entries, "bytes": dst_scan.bytes, "manifest_sha256": digest}
        self.result["moved"] = src_scan.summary()
        self.journal_step(journal, jpath, "verified", verified=self.result["verified"], moved=src_scan.summary())
        self.actions.append(
            "verified %d entries (%s): types, modes, owners, sizes, mtimes, "
            "sha256, symlinks, xattrs/ACLs, hard links" % (dst_scan.entries, human(dst_scan.bytes))
        )
        work = any((stats.get(k) or 0) for k in ("created", "deleted", "transferred")) or self.result["healed"]
        return before != "verified" or bool(work)

    # ------------------------------------------------------------------ dest mode
    def run_dest(self):
        dest = self.dest
        if (
            dest == self.src
            or dest.startswith(self.src.rstrip("/") + "/")
            or self.src.startswith(dest.rstrip("/") + "/")
        ):
            self.fail("dest=%s and src=%s are nested; dest must be outside src and src outside dest" % (dest, self.src))
        parent = os.path.dirname(dest)
        if not os.path.isdir(parent):
            self.fail("the parent of dest, %s, does not exist; mount the new filesystem (e.g. /home) first" % parent)
        if os.path.lexists(dest) and not os.path.isdir(dest):
            self.fail("dest %s exists and is not a directory; move it away or choose another dest" % dest)
        if os.path.islink(dest):
            self.fail("dest %s is a symlink; give the real directory" % dest)
        jpath = os.path.join(dest, JOURNAL_NAME)
        try:
            journal = read_journal(jpath) if os.path.isdir(dest) else None
        except ValueError as e:
            self.fail("%s; it is not ours to overwrite. Inspect %s." % (e, dest))
        if journal is None and os.path.isdir(dest):
            foreign = sorted(os.listdir(dest))
            if foreign:
                self.fail(
                    "dest %s already holds content (%s) and no carry-over journal; refusing to "
                    "copy over it. Move that content away, or point the service at it yourself."
                    % (dest, ", ".join(display(n) for n in foreign[:10]))
                )
        elif journal is not None and journal.get("src") != self.src:
            self.fail(
                "dest %s holds a carry-over of %s, not of %s; choose another dest"
                % (dest, journal.get("src"), self.src)
            )
        self.check_writers()
        src_scan = self.scan_source()
        self.result["journal"] = jpath
        if self.check:
            self.result["phase"] = journal["phase"] if journal else "new"
            vfs = os.statvfs(dest if os.path.isdir(dest) else parent)
            problem = room_problem(
                src_scan.allocated,
                vfs.f_bavail * vfs.f_frsize,
                self.margin,
                "the content of %s" % self.src,
                "the filesystem of %s" % dest,
                "give the volume more space (add a data disk) or free space in %s" % self.src,
            )
            if problem:
                self.fail(problem)
            self.actions.append(
                "would copy %d entries (%s) from %s to %s and verify them"
                % (src_scan.entries, human(src_scan.bytes), self.src, dest)
            )
            return self.done(True)
        self.stop_leftovers(dest)
        if not os.path.isdir(dest):
            os.mkdir(dest, 0o700)
            self.actions.append("created %s" % dest)
        if journal is None:
            journal = new_journal(self.src, dest)
        self.room(src_scan, dest)
        if journal["phase"] != "new":
            self.actions.append("resuming from phase %s" % journal["phase"])
        changed = self.copy_and_verify(journal, jpath, dest)
        return self.done(changed)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="path", required=True),
            device=dict(type="path"),
            dest=dict(type="path"),
            staging=dict(type="path"),
            fstype=dict(type="str", default="xfs"),
            mount_opts=dict(type="str", default="defaults"),
            switch=dict(type="bool", default=True),
            fstab=dict(type="path", default="/etc/fstab"),
            state_dir=dict(type="path", default="/var/lib/kunlun-fleet/carry-over"),
            room_margin_percent=dict(type="int", default=5),
            lock_timeout=dict(type="int", default=600),
            allow_writers=dict(type="bool", default=False),
            state=dict(type="str", default="carried", choices=["carried"]),
        ),
        mutually_exclusive=[("device", "dest")],
        required_one_of=[("device", "dest")],
        supports_check_mode=True,
    )
    c = Carry(module)
    src = c.src
    if src == "/":
        c.fail("src=/ cannot be carried; give the directory to move (e.g. /home)")
    if not os.path.isdir(src) or os.path.islink(src):
        c.fail(
            "src %s does not exist or is not a directory (symlinks are not followed); give the "
            "directory whose content is to be carried" % src
        )
    if module.params["room_margin_percent"] < 0:
        c.fail("room_margin_percent must be >= 0")
    if not module.check_mode:
        # Everything below reads the state after the lock is held: a run interrupted
        # while its module went on (ansible-playbook killed) is waited for, then seen.
        c.lock(slug(src))
    if c.device:
        c.run_device()
    else:
        c.run_dest()


if __name__ == "__main__":
    main()
