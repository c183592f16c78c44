"""Deterministic wheel files built with zipfile (no network, no build backend).

A wheel is a zip with the package files and a `<name>-<version>.dist-info/` holding
METADATA, WHEEL, RECORD (sha256, urlsafe base64 without padding) and optional
entry_points.txt. Every member gets the same fixed timestamp and mode, in sorted order,
so the same inputs give the same bytes.
"""

import base64
import hashlib
import os
import re
import zipfile

FIXED_DATE = (2026, 1, 1, 0, 0, 0)


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def tree_files(src_dir: str, prefix: str = "") -> dict:
    """{arcname: bytes} for every file under src_dir (skipping caches)."""
    out = {}
    for root, dirs, files in os.walk(src_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src_dir).replace(os.sep, "/")
            with open(path, "rb") as fh:
                out[prefix + rel] = fh.read()
    return out


def write_zip(path: str, members: dict, modes: dict = None) -> None:
    modes = modes or {}
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname in members:
            info = zipfile.ZipInfo(arcname, FIXED_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (modes.get(arcname, 0o644) | 0o100000) << 16
            zf.writestr(info, members[arcname])
    os.replace(tmp, path)


def build_wheel(
    out_path: str,
    name: str,
    version: str,
    files: dict,
    tag: str,
    summary: str = "",
    requires_python: str = ">=3.8",
    requires: tuple = (),
    entry_points: str = "",
    metadata_name: str = None,
    metadata_version: str = None,
    purelib: bool = False,
    extra_metadata: tuple = (),
    dist_info_version: str = None,
) -> str:
    """Write a wheel; `metadata_name`/`metadata_version`/`dist_info_version` let the
    wheel's insides differ from its file name (some vendor wheels ship that way)."""
    dist_info = f"{normalize(name)}-{dist_info_version or version}.dist-info"
    meta = [
        "Metadata-Version: 2.1",
        f"Name: {metadata_name or name}",
        f"Version: {metadata_version or version}",
    ]
    if summary:
        meta.append(f"Summary: {summary}")
    meta += list(extra_metadata)
    if requires_python:
        meta.append(f"Requires-Python: {requires_python}")
    meta += [f"Requires-Dist: {r}" for r in requires]
    members = dict(sorted(files.items()))
    members[f"{dist_info}/METADATA"] = ("\n".join(meta) + "\n\n").encode()
    members[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: kunlun-fleet (1.0)\n"
        f"Root-Is-Purelib: {'true' if purelib else 'false'}\nTag: {tag}\n\n"
    ).encode()
    if entry_points:
        members[f"{dist_info}/entry_points.txt"] = entry_points.encode()
    members[f"{dist_info}/top_level.txt"] = (
        "\n".join(sorted({a.split("/")[0] for a in files if "/" in a and not a.endswith(".dist-info")})) + "\n"
    ).encode()
    record = [f"{arc},{record_hash(data)},{len(data)}" for arc, data in members.items()]
    record.append(f"{dist_info}/RECORD,,")
    members[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    write_zip(out_path, members)
    return out_path
