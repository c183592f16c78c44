#!/usr/bin/env bash
# What `make setup` needs on a bare Debian 12 or 13 controller before it can build .venv:
# Python 3.11 or newer with venv (Debian splits ensurepip into python3-venv) and the
# compiler and headers for the pinned packages that build from source when no wheel fits.
# As root, with apt. Everything else comes pinned from requirements.txt into .venv.
set -euo pipefail
if ! command -v apt-get >/dev/null; then
  echo "no apt-get: install Python 3.11+ with its venv module yourself, then run make setup again" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "python3 cannot make a venv (no ensurepip): as root, apt-get install python3-venv, then make setup" >&2
  exit 1
fi
want=(python3 python3-venv python3-dev gcc)
missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "python3 is $(python3 -V 2>&1): the controller needs Python 3.11 or newer (Debian 12 or 13)" >&2; exit 1; }
