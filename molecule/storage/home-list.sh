#!/bin/bash
# Checksum list of /home for the storage scenario: every entry's type, mode, owner, group,
# size (not of directories), mtime and link target; sha256 of every file's content; ACLs;
# user xattrs; hard-link groups. The content is hashed as the carry-over module verifies it:
# holes are not read (the seed's 2 GiB sparse file cost sha256sum ~10 CPU-s a list), and a
# block of zeros counts the same whether it is a hole or written.
# Leaves out what the role itself adds (/home/newdata, the carry-over journal) and the
# mtime of /home itself (the role adds newdata below it).
set -euo pipefail
cd /home
list() { find . -xdev -mindepth 1 \( -path ./newdata -o -path ./.kunlun-carry-over.json \) -prune -o "$@"; }
list ! -type d -printf '%y %m %U %G %s %T@ %l %p\n' | LC_ALL=C sort
# a directory's st_size is the filesystem's business (ext4 4096, XFS its entries)
list -type d -printf '%y %m %U %G %T@ %p\n' | LC_ALL=C sort
list -type f -print0 | LC_ALL=C sort -z | python3 -c '
import hashlib, os, sys
BLOCK = 1 << 16
ZERO = bytes(BLOCK)
for path in sys.stdin.buffer.read().split(b"\0"):
    if not path:
        continue
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    size, pos = os.fstat(fd).st_size, 0
    while pos < size:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:  # only a hole is left
            break
        hole = os.lseek(fd, data, os.SEEK_HOLE)
        off = os.lseek(fd, data - data % BLOCK, os.SEEK_SET)
        while off < hole:
            chunk = os.read(fd, BLOCK)
            if not chunk:
                break
            if chunk != ZERO[: len(chunk)]:
                h.update(b"%d:" % off + chunk)
            off += len(chunk)
        pos = max(off, hole)
    os.close(fd)
    h.update(b"size:%d" % size)
    sys.stdout.buffer.write(h.hexdigest().encode() + b"  " + path + b"\n")
'
list -print0 | LC_ALL=C sort -z | xargs -0 -r getfacl -P -n --absolute-names 2>/dev/null
list -print0 | LC_ALL=C sort -z | xargs -0 -r getfattr -P -d -m 'user\.' --absolute-names 2>/dev/null || true
list -type f -links +1 -printf '%i %p\n' | LC_ALL=C sort | awk '{g[$1] = g[$1] " " $2} END {for (k in g) print g[k]}' | LC_ALL=C sort
