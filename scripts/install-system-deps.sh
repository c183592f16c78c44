#!/usr/bin/env bash
# What the test suites need on the controller (a Debian 12 machine, as root), installed
# here so that no suite skips for lack of it. The sim fleet's engine (docker.io) is
# installed by `kunlun-fleet sim-up`; debootstrap too, but the fast tier's bundle tests
# read its minbase list on the controller from the run's first minute, beside sim-up (a
# new machine failed them before sim-up had run), so it is here as well. tests/suites.py checks the rest
# before it runs anything and says what is missing. gnupg: the signed apt repository of the
# engine's docker-repo test. chromium: the bench report's page check
# (tests/bench/test_bench_page.py opens report.html headless and screenshots it). haproxy:
# the gateway's client keys in Debian's HAProxy, the one the gateway role installs
# (tests/unit/test_gateway_clients_haproxy.py starts its own on loopback ports); the service
# the package starts is stopped and disabled below, nothing on the controller needs it.
set -euo pipefail
want=(xfsprogs rsync acl attr util-linux e2fsprogs kmod chromium gnupg debootstrap haproxy)
missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  if [[ " ${missing[*]} " == *" haproxy "* ]] && [[ -d /run/systemd/system ]]; then
    systemctl disable --now haproxy.service
  fi
fi
# XFS: built into some kernels, a module in others (this machine's kernel has no modules).
if ! grep -qw xfs /proc/filesystems; then
  modprobe xfs || echo "XFS is neither built into this kernel nor loadable: the storage suites will fail" >&2
fi
# promtool, Prometheus's config and rule checker, for the monitoring role's unit tests
# (tests/unit/test_monitoring_*.py), and prometheus, the server the real-engine lane starts
# on loopback for one live alert of the project's rules (tests/real_engine). Only the
# binaries, taken out of Debian's prometheus package (the version the role installs on the
# monitoring hosts): installing the package would start a Prometheus server on this machine.
prometheus_version=2.42.0
stale=()
for tool in promtool prometheus; do
  "/usr/local/bin/$tool" --version 2>&1 | grep -q "version $prometheus_version" || stale+=("$tool")
done
if ((${#stale[@]})); then
  echo "installing: ${stale[*]} into /usr/local/bin (from Debian's prometheus package)"
  deb_dir=$(mktemp -d)
  (cd "$deb_dir" && apt-get download -qq -o APT::Sandbox::User=root prometheus) \
    || { apt-get update -qq && (cd "$deb_dir" && apt-get download -qq -o APT::Sandbox::User=root prometheus); }
  for tool in "${stale[@]}"; do
    dpkg-deb --fsys-tarfile "$deb_dir"/prometheus_*.deb | tar -x -C "$deb_dir" "./usr/bin/$tool"
    install -m 0755 "$deb_dir/usr/bin/$tool" "/usr/local/bin/$tool"
    "/usr/local/bin/$tool" --version 2>&1 | grep -q "version $prometheus_version" \
      || { echo "/usr/local/bin/$tool is not $tool $prometheus_version: Debian's prometheus package changed version" >&2; exit 1; }
  done
  rm -rf "$deb_dir"
fi
