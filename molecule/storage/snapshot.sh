#!/bin/bash
# What the storage and engine roles may change, in one text: LVM, block devices, mounts,
# fstab, the /home tree, daemon.json, the data-roots, systemd drop-ins. Check mode must
# leave it identical.
set -uo pipefail
echo "== pvs/vgs/lvs"; pvs --noheadings 2>&1; vgs --noheadings 2>&1; lvs --noheadings 2>&1
echo "== blkid"; blkid -p /dev/vdb 2>&1
echo "== lsblk"; lsblk -rno NAME,SIZE,FSTYPE,MOUNTPOINT /dev/vdb 2>&1
echo "== mounts"; findmnt -rn -o TARGET,SOURCE,FSTYPE | grep -E ' (/home|/mnt)' ; findmnt -rn /home
echo "== fstab"; cat /etc/fstab
echo "== /home"; find /home -xdev -printf '%y %m %U %G %s %T@ %p\n' | LC_ALL=C sort | sha256sum
echo "== docker"; cat /etc/docker/daemon.json 2>&1; ls -la /home/docker 2>&1 | head -3
find /var/lib/docker -printf '%y %m %s %T@ %p\n' 2>/dev/null | LC_ALL=C sort | sha256sum
ls /etc/systemd/system/docker.service.d 2>&1
dpkg-query -W -f '${Package} ${Status}\n' docker.io lvm2 xfsprogs rsync 2>&1
echo "== state"; ls /var/lib/kunlun-fleet 2>&1
exit 0
