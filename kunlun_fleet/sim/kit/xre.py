"""Build the kit's XRE-style self-extracting installer (xre-Linux-x86_64-<version>.run).

Like makeself: a POSIX shell header followed by a gzip'd tar payload
(install.sh, xpu-smi, LICENSE, version, firmware from kunlun_fleet/sim/kit/xre/).
Running the .run extracts the payload to a temporary directory and runs install.sh with
the arguments given (see xre/install.sh for what it does). The build is reproducible:
the same version and firmware give the same bytes (so bundle checksums are stable).

    python3 kunlun_fleet/sim/kit/xre.py 5.0.21.26 OUT_DIR [--firmware 1.0.2.14.1.54]
"""

import argparse
import gzip
import io
import re
import tarfile
from pathlib import Path

PAYLOAD_DIR = Path(__file__).resolve().parent / "xre"
DEFAULT_FIRMWARE = "1.0.2.14.1.54"
MARKER = "__XRE_PAYLOAD_BELOW__"

HEADER = """#!/bin/sh
# XRE self-extracting installer, version @VERSION@ (kunlun-fleet hardware kit).
# Usage: KERNELDIR=/usr/src/linux-headers-$(uname -r) sh $0 --silent --accept-license
set -u
skip=$(awk '/^@MARKER@$/ { print NR + 1; exit 0 }' "$0")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/xre.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
if ! tail -n +"$skip" "$0" | gzip -dc | tar -xf - -C "$tmp"; then
    echo "ERROR: the installer archive is damaged (checksum or truncation): download it again" >&2
    exit 1
fi
sh "$tmp/install.sh" "$@"
exit $?
@MARKER@
"""


def _add(tar, name, data, mode=0o644):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data))


def build_xre_run(version: str, out_path: Path, firmware: str = DEFAULT_FIRMWARE) -> Path:
    """Write xre-Linux-x86_64-<version>.run; ``out_path`` is a directory or the file path.

    Returns the path written.
    """
    if not re.match(r"^\d+(\.\d+)+$", version):
        raise ValueError("XRE version must be dotted numbers, got %r" % (version,))
    out_path = Path(out_path)
    name = "xre-Linux-x86_64-%s.run" % version
    target = out_path / name if out_path.is_dir() else out_path
    target.parent.mkdir(parents=True, exist_ok=True)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        _add(tar, "install.sh", (PAYLOAD_DIR / "install.sh").read_bytes(), 0o755)
        _add(tar, "xpu-smi", (PAYLOAD_DIR / "xpu-smi").read_bytes(), 0o755)
        _add(tar, "LICENSE", (PAYLOAD_DIR / "LICENSE").read_bytes())
        _add(tar, "version", (version + "\n").encode())
        _add(tar, "firmware", (firmware + "\n").encode())
    payload = gzip.compress(raw.getvalue(), mtime=0)
    header = HEADER.replace("@VERSION@", version).replace("@MARKER@", MARKER)
    target.write_bytes(header.encode() + payload)
    target.chmod(0o755)
    return target


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version")
    parser.add_argument("out", type=Path, help="output directory or .run path")
    parser.add_argument("--firmware", default=DEFAULT_FIRMWARE)
    args = parser.parse_args(argv)
    print(build_xre_run(args.version, args.out, args.firmware))


if __name__ == "__main__":
    main()
