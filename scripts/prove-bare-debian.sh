#!/usr/bin/env bash
# The proof that a bare Debian 12 machine runs both README commands' set-up (`make demo`,
# `make test`) up to their first suite, from nothing but root and the package registries
# (docs/testing.md, "From nothing"). In a chroot made from the sim fleet's debootstrap
# tarball (Debian 12 minbase: Debian's python3 and nothing else, no pyenv), with a clone of
# this checkout's HEAD plus its uncommitted changes, as root:
#   apt-get install make git            the README's stated prerequisites
#   make setup                          python3-venv installed by it, then .venv
#   make system-deps                    the suites' Debian packages
#   make bench-setup real-engine-setup  the bench's and the real vLLM's venvs
#   engine.ensure_packages()            what `kunlun-fleet sim-up` installs first (docker.io,
#                                       debootstrap, ...); its engine is not started: a chroot
#                                       has no systemd and dockerd needs its own root
#   base_python.resolve()               the stand-in base image's Python: no CPython 3.10
#                                       here, so the fallback (kunlun_fleet/sim/base_python.py)
# No service starts in the root (policy-rc.d answers 101): haproxy's and docker's maintainer
# scripts would otherwise start them on this machine's network.
# What it keeps from this machine: /etc/resolv.conf, its extra CA certificates (its egress
# proxy's, as the sim hosts get them: kunlun_fleet/sim/fleet.py) and its apt settings
# (/etc/apt/apt.conf.d), and the test fleet's download cache ($KUNLUN_FLEET_CACHE, default
# /var/lib/kunlun-sim/cache, the one the Makefile's pip and uv use): its pip/ and uv/ bound
# read-write as the root's /root/.cache/pip and /root/.cache/uv, its bare-debian-apt/ as
# apt's archives, so a warm run downloads nothing. Not its venvs/: the root makes its own.
# The root itself is new every run.
# Usage: scripts/prove-bare-debian.sh [ROOT]   (default /var/lib/kunlun-sim/build/bare-debian)
# It leaves ROOT in place (unmounted) with ROOT/proof.json for tests/bare/; --remove ROOT
# removes it. The times of each step go to ROOT/proof.json.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
unmount() {
  for m in var/cache/apt/archives root/.cache/uv root/.cache/pip dev sys proc; do
    if mountpoint -q "$root/$m"; then umount -l "$root/$m"; fi
  done
}
# Removing the root with the cache still bound in it would remove the cache too.
remove_root() {
  unmount
  if grep -q " $root/" /proc/mounts; then
    echo "something is still mounted under $root: unmount it, then run again" >&2
    exit 1
  fi
  rm -rf --one-file-system "$root"
}
if [ "${1:-}" = --remove ]; then
  root=${2:-/var/lib/kunlun-sim/build/bare-debian}
  remove_root
  exit 0
fi
root=${1:-/var/lib/kunlun-sim/build/bare-debian}
cache=${KUNLUN_FLEET_CACHE:-/var/lib/kunlun-sim/cache}
[ "$(id -u)" = 0 ] || { echo "prove-bare-debian.sh needs root (chroot, mounts)" >&2; exit 1; }
trap unmount EXIT

# A new root from the sim fleet's cached debootstrap tarball (made once by its inputs).
remove_root
mkdir -p "$root" "$cache"
tarball=$("$here/.venv/bin/python" -c 'from kunlun_fleet.sim import image; print(image._debootstrap_tarball())')
tar -C "$root" --numeric-owner -xf "$tarball"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
for d in pip uv; do
  mkdir -p "$cache/$d" "$root/root/.cache/$d"
  mount --bind "$cache/$d" "$root/root/.cache/$d"
done
mkdir -p "$cache/bare-debian-apt" "$root/var/cache/apt/archives"
mount --bind "$cache/bare-debian-apt" "$root/var/cache/apt/archives"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mkdir -p "$root/usr/local/share/ca-certificates"
cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
for f in /etc/apt/apt.conf.d/*; do
  grep -q '^Acquire::' "$f" 2>/dev/null && cp "$f" "$root/etc/apt/apt.conf.d/"
done
printf '#!/bin/sh\n# prove-bare-debian.sh: no service starts in this root\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 0755 "$root/usr/sbin/policy-rc.d"

# The checkout as a fresh clone: HEAD, then the uncommitted changes and the new files.
git clone --quiet --no-hardlinks "$here" "$root/root/kunlun-fleet"
(cd "$here" && git diff HEAD --binary) | git -C "$root/root/kunlun-fleet" apply --allow-empty --whitespace=nowarn
(cd "$here" && git ls-files --others --exclude-standard -z) | tar -C "$here" --null -T - -cf - | tar -C "$root/root/kunlun-fleet" -xf -

# The steps, each timed (wall and the CPU of its processes), in a clean environment.
cat >"$root/root/steps.sh" <<'EOF'
set -euo pipefail
cd /root/kunlun-fleet
update-ca-certificates >/dev/null
step() {
  local name=$1; shift
  local t0 c0 t1 c1
  t0=$(date +%s.%N)
  c0=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)
  echo "== $name: $*"
  "$@"
  t1=$(date +%s.%N)
  # the children's CPU (utime+stime of the waited-for children, in ticks)
  c1=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)
  echo "$name $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}') $(( (c1 - c0) / $(getconf CLK_TCK) ))" >>/root/steps.times
}
: >/root/steps.times
step prerequisites bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends make git >/dev/null'
step setup make setup
step system-deps make system-deps
step venvs make bench-setup real-engine-setup
step sim-packages .venv/bin/python -c 'from kunlun_fleet.sim import engine; engine.ensure_packages()'
step version bash -c '.venv/bin/kunlun-fleet --version >/root/version.txt'
step base-python .venv/bin/python -c 'import json; from kunlun_fleet.sim import base_python; open("/root/base-python.json", "w").write(json.dumps(base_python.resolve()))'
EOF
start=$(date +%s)
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 TERM=dumb UV_LINK_MODE=copy \
  SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
  REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
  bash /root/steps.sh
echo "bare Debian 12 set-up done in $(($(date +%s) - start)) s; steps (name, wall s, CPU s):"
cat "$root/root/steps.times"
"$here/.venv/bin/python" - "$root" <<'EOF'
import json, os, sys
root = sys.argv[1]
steps = {}
with open(os.path.join(root, "root/steps.times")) as fh:
    for line in fh:
        name, wall, cpu = line.split()
        steps[name] = {"wall_s": round(float(wall), 1), "cpu_s": int(cpu)}
with open(os.path.join(root, "root/base-python.json")) as fh:
    base = json.load(fh)
with open(os.path.join(root, "root/version.txt")) as fh:
    version = fh.read().strip()
with open(os.path.join(root, "proof.json"), "w") as fh:
    json.dump({"steps": steps, "version": version, "base_python": base}, fh, indent=1)
EOF
