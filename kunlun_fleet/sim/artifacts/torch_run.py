"""The torch 2.5.1 stand-in as a Kunlunxin-style xpytorch `.run` installer.

Like the vendor's file it is a makeself archive: a POSIX shell header, then a gzip'd tar
holding `setup.sh` and two wheels (torch 2.5.1, torch_xmlir). Command line (makeself's):

    bash xpytorch-cp310-torch251-ubuntu2004-x64.run            extract to a temp dir, run setup.sh
    bash xpytorch-...run --noexec --target DIR                 only extract into DIR
    bash xpytorch-...run --keep --target DIR                   extract into DIR, run, keep DIR
    bash xpytorch-...run --list | --check | --info | --help

setup.sh installs both wheels with `pip install` into the active conda environment
(`$CONDA_PREFIX`), as the vendor's does. For a uv-managed venv (no pip), the documented
way is the vendor's own recipe:

    bash xpytorch-...run --noexec --target xpytorch_unpack
    sed -i 's/pip/uv pip/g; s/CONDA_PREFIX/VIRTUAL_ENV/g' xpytorch_unpack/setup.sh
    VIRTUAL_ENV=/opt/vllm_kunlun bash xpytorch_unpack/setup.sh

The target interpreter must be CPython 3.10 (cp310 wheels), as with the real installer; the
stand-in's tag and check follow the stand-in base image's Python (kunlun_fleet/sim/base_python.py:
cp311 and 3.11 under its Debian fallback).
"""

import gzip
import hashlib
import io
import os
import tarfile

from kunlun_fleet.sim import base_python
from kunlun_fleet.sim.artifacts.wheel import build_wheel, tree_files

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_SRC = os.path.join(HERE, "torch_src")
TORCH_VERSION = "2.5.1"
XMLIR_VERSION = "3.3.1.0"
# cp310 as the vendor's, or what the stand-in base image's Python differs by (base_python.py).
PYTHON = base_python.resolve()
TAG = PYTHON["wheel_tag"]
MARKER = "__XPYTORCH_ARCHIVE_BELOW__"

SETUP_SH = """#!/bin/bash
# xpytorch 2.5.1 installer: torch and torch_xmlir into the active environment.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -z "${CONDA_PREFIX:-}" ]; then
    echo "ERROR: no active environment: CONDA_PREFIX is not set (activate the target environment first)" >&2
    exit 1
fi
if ! "${CONDA_PREFIX}/bin/python" -c 'import sys; sys.exit("%d.%d" % sys.version_info[:2] != "@PYTHON@")'; then
    echo "ERROR: these wheels are for CPython @PYTHON@ (@CPTAG@); ${CONDA_PREFIX}/bin/python is not @PYTHON@" >&2
    exit 1
fi
echo "Installing xpytorch @TORCH@ (torch_xmlir @XMLIR@) into ${CONDA_PREFIX}"
pip install --no-deps --force-reinstall "${HERE}/@TORCH_WHEEL@" "${HERE}/@XMLIR_WHEEL@"
echo "xpytorch @TORCH@ installed"
"""

HEADER = """#!/bin/sh
# This script was generated using Makeself 2.4.5
# The license covering this archive and its contents, if any, is wholly independent of the Makeself license (GPL)
# xpytorch @TORCH@ (torch_xmlir @XMLIR@), @CPTAG@, ubuntu2004 x64
label="xpytorch-@CPTAG@-torch251-ubuntu2004-x64"
script="./setup.sh"
sha256="@SHA256@"
filesize=@SIZE@
skip=$(awk '/^@MARKER@$/ { print NR + 1; exit 0 }' "$0")

usage() {
    cat <<USAGE
Makeself version 2.4.5
 1) Getting help or info about $0 :
  $0 --help   Print this message
  $0 --info   Print embedded info : title, default target directory, embedded script ...
  $0 --list   Print the list of files in the archive
  $0 --check  Checks integrity of the archive
 2) Running $0 :
  $0 [options] [--] [additional arguments to embedded script]
  with following options (in that order)
  --confirm             Ask before running embedded script
  --quiet               Do not print anything except error messages
  --accept              Accept the license
  --noexec              Do not run embedded script
  --keep                Do not erase target directory after running the embedded script
  --target dir          Extract directly to a target directory (absolute or relative)
  --                    Following arguments will be passed to the embedded script
USAGE
}

payload() { tail -n +"$skip" "$0"; }

check() {
    got=$(payload | sha256sum | cut -d' ' -f1)
    if [ "$got" != "$sha256" ]; then
        echo "Error in SHA256 checksums: $got is different from $sha256" >&2
        return 1
    fi
    return 0
}

quiet=n; noexec=n; keep=n; target=""
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --info)
            echo "Identification: $label"; echo "Target directory: xpytorch_unpack"
            echo "Script run after extraction: $script"; echo "Uncompressed size: $filesize bytes"
            exit 0 ;;
        --list) payload | gzip -cd | tar tvf -; exit $? ;;
        --check) check && echo "SHA256 checksums are OK." ; exit $? ;;
        -q|--quiet) quiet=y; shift ;;
        --accept|--confirm|--nox11|--nochown|--noprogress|--nodiskspace) shift ;;
        --noexec) noexec=y; shift ;;
        --keep) keep=y; shift ;;
        --target) [ $# -ge 2 ] || { echo "--target needs a directory" >&2; exit 1; }; target="$2"; keep=y; shift 2 ;;
        --target=*) target="${1#--target=}"; keep=y; shift ;;
        --) shift; break ;;
        -*) echo "Unrecognized flag : $1" >&2; usage >&2; exit 1 ;;
        *) break ;;
    esac
done

check || { echo "The archive is corrupted: download it again" >&2; exit 1; }
if [ -n "$target" ]; then
    mkdir -p "$target" || exit 1
    tmpdir=$(cd "$target" && pwd)
else
    tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/selfgz.XXXXXX") || exit 1
fi
[ "$quiet" = y ] || echo "Verifying archive integrity...  100%   SHA256 checksums are OK. All good."
[ "$quiet" = y ] || echo "Uncompressing $label  100%"
payload | gzip -cd | tar xf - -C "$tmpdir" || { echo "Extraction failed" >&2; exit 1; }
if [ "$noexec" = y ]; then
    exit 0
fi
res=0
(cd "$tmpdir" && bash "$script" "$@") || res=$?
if [ "$keep" = n ]; then
    rm -rf "$tmpdir"
fi
exit $res
@MARKER@
"""


def _tar_add(tar, name, data, mode=0o644):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data))


def build_torch_run(out_path: str, work_dir: str) -> str:
    """Write the .run installer to out_path (wheels staged in work_dir)."""
    os.makedirs(work_dir, exist_ok=True)
    torch_whl = f"torch-{TORCH_VERSION}-{TAG}.whl"
    xmlir_whl = f"torch_xmlir-{XMLIR_VERSION}-{TAG}.whl"
    build_wheel(
        os.path.join(work_dir, torch_whl),
        "torch",
        TORCH_VERSION,
        tree_files(os.path.join(TORCH_SRC, "torch"), "torch/"),
        TAG,
        summary="Tensors and Dynamic neural networks in Python with strong GPU acceleration (Kunlunxin xpytorch build)",
        requires_python=">=3.10",
    )
    build_wheel(
        os.path.join(work_dir, xmlir_whl),
        "torch_xmlir",
        XMLIR_VERSION,
        tree_files(os.path.join(TORCH_SRC, "torch_xmlir"), "torch_xmlir/"),
        TAG,
        summary="Kunlunxin XMLIR runtime bridge for PyTorch",
        requires_python=">=3.10",
        requires=(f"torch=={TORCH_VERSION}",),
    )
    setup = (
        SETUP_SH.replace("@TORCH@", TORCH_VERSION)
        .replace("@XMLIR@", XMLIR_VERSION)
        .replace("@TORCH_WHEEL@", torch_whl)
        .replace("@XMLIR_WHEEL@", xmlir_whl)
        .replace("@PYTHON@", PYTHON["minor"])
        .replace("@CPTAG@", TAG.split("-")[0])
    )
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        _tar_add(tar, "setup.sh", setup.encode(), 0o755)
        for name in (torch_whl, xmlir_whl):
            with open(os.path.join(work_dir, name), "rb") as fh:
                _tar_add(tar, name, fh.read())
    size = len(raw.getvalue())
    payload = gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)
    header = (
        HEADER.replace("@TORCH@", TORCH_VERSION)
        .replace("@XMLIR@", XMLIR_VERSION)
        .replace("@SHA256@", hashlib.sha256(payload).hexdigest())
        .replace("@SIZE@", str(size))
        .replace("@MARKER@", MARKER)
        .replace("@CPTAG@", TAG.split("-")[0])
    )
    tmp = out_path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(header.encode() + payload)
    os.chmod(tmp, 0o755)
    os.replace(tmp, out_path)
    return out_path
