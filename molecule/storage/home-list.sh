#!/bin/bash
# Checksum list of /home for the storage scenario: every entry's type, mode, owner, group,
# size (not of directories), mtime and link target; sha256 of every file; ACLs; user xattrs; hard-link groups.
# Leaves out what the role itself adds (/home/newdata, the carry-over journal) and the
# mtime of /home itself (the role adds newdata below it).
set -euo pipefail
cd /home
list() { find . -xdev -mindepth 1 \( -path ./newdata -o -path ./.kunlun-carry-over.json \) -prune -o "$@"; }
list ! -type d -printf '%y %m %U %G %s %T@ %l %p\n' | LC_ALL=C sort
# a directory's st_size is the filesystem's business (ext4 4096, XFS its entries)
list -type d -printf '%y %m %U %G %T@ %p\n' | LC_ALL=C sort
list -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum
list -print0 | LC_ALL=C sort -z | xargs -0 -r getfacl -P -n --absolute-names 2>/dev/null
list -print0 | LC_ALL=C sort -z | xargs -0 -r getfattr -P -d -m 'user\.' --absolute-names 2>/dev/null || true
list -type f -links +1 -printf '%i %p\n' | LC_ALL=C sort | awk '{g[$1] = g[$1] " " $2} END {for (k in g) print g[k]}' | LC_ALL=C sort
