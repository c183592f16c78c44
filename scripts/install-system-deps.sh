#!/usr/bin/env bash
# Debian packages the test suites need on the controller (a Debian 12 machine, as root).
# The sim fleet's own needs (docker.io, debootstrap) are installed by `kunlun-fleet sim-up`.
set -euo pipefail
want=(xfsprogs rsync acl attr util-linux e2fsprogs)
missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
