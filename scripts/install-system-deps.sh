#!/usr/bin/env bash
# What the test suites need on the controller (a Debian 12 machine, as root), installed
# here so that no suite skips for lack of it. The sim fleet's own needs (docker.io,
# debootstrap) are installed by `kunlun-fleet sim-up`; tests/suites.py checks the rest
# before it runs anything and says what is missing. gnupg: the signed apt repository of the
# engine's docker-repo test. chromium: the bench report's page check
# (tests/bench/test_bench_page.py opens report.html headless and screenshots it).
set -euo pipefail
want=(xfsprogs rsync acl attr util-linux e2fsprogs kmod chromium gnupg)
missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# XFS: built into some kernels, a module in others (this machine's kernel has no modules).
if ! grep -qw xfs /proc/filesystems; then
  modprobe xfs || echo "XFS is neither built into this kernel nor loadable: the storage suites will fail" >&2
fi
