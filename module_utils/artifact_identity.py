# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a bundle file says it is, read from the file itself (never from its name alone).

- a wheel: Name and Version of its *.dist-info/METADATA, and what its file name parses to;
- a makeself-style .run installer: its kind (the XRE driver, the Kunlun torch "xpytorch")
  and version, from the shell header (the first bytes only: the payload may be GBs);
- a source tarball: Name and Version (PKG-INFO, else setup.py) and the commit it was cut
  from (git archive's pax comment, else COMMIT / __commit__ in setup.py or the package);
- a `docker save` archive: the RepoTags of its manifest.json;
- a .deb: only recognised (the engine role reads the packages itself).

Shared by the bundle check (module_utils/bundle_index.py) and the bundle builder
(kunlun_fleet/bundle.py). Standard library only.
"""

from __future__ import absolute_import, division, print_function

import json
import os
import re
import tarfile
import zipfile
import zlib

__metaclass__ = type

# Enough for a makeself header's prologue: `label=` comes after about 20 lines (CRC and
# digest lists of multi-file archives can push it past the first KiB).
HEADER_BYTES = 4096

# Installer kinds: how each names itself in its header. First the makeself label
# (label="..."), then a header comment that names the installer and its version
# ("# XRE self-extracting installer, version 5.0.21.26"), for a script not made by makeself.
INSTALLERS = {
    "xre": {
        "what": "the XRE driver installer",
        "mark": re.compile(r"\bXRE\b"),
        "version": [re.compile(r'^label="[^"\n]*\bXRE\b[^"\n]*?(\d+(?:\.\d+){2,})', re.M | re.I),
                    re.compile(r"\bXRE\b[^\n]*?\bversion\s+v?(\d+(?:\.\d+){2,})", re.I)],
    },
    "xpytorch": {
        "what": "the Kunlun torch installer (xpytorch)",
        "mark": re.compile(r"xpytorch", re.I),
        "version": [re.compile(r'^label="[^"\n]*xpytorch[^"\n]*?\b(\d+\.\d+\.\d+)\b', re.M | re.I),
                    re.compile(r"\bxpytorch\s+v?(\d+\.\d+\.\d+)", re.I)],
    },
}

_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?"
                         r"-(?P<tag>[^-]+-[^-]+-[^-]+)\.whl$")
_COMMIT = [re.compile(r"""^\s*COMMIT\s*=\s*["']([0-9a-fA-F]{7,40})["']""", re.M),
           re.compile(r"""^\s*__commit__\s*=\s*["']([0-9a-fA-F]{7,40})["']""", re.M)]


def normalize(name):
    """A distribution name as packaging compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", str(name or "")).lower()


def parse_wheel_name(file_name):
    """{name, version, tag} from a wheel's file name; ValueError when it is not one."""
    match = _WHEEL_NAME.match(file_name)
    if not match:
        raise ValueError("%s is not a wheel file name (name-version-python-abi-platform.whl)" % file_name)
    return {"name": match.group("name"), "version": match.group("version"), "tag": match.group("tag")}


def _headers(text):
    """The RFC 822 headers of METADATA / PKG-INFO, up to the first blank line."""
    out = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and not line[:1].isspace() and key not in out:
            out[key.strip()] = value.strip()
    return out


def read_wheel(path):
    """{name, version} from the wheel's METADATA; ValueError when it has none."""
    try:
        with zipfile.ZipFile(path) as archive:
            metas = [n for n in archive.namelist()
                     if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if not metas:
                raise ValueError("no *.dist-info/METADATA in the archive")
            # Several dist-info directories: the one named after the file.
            stem = normalize(os.path.basename(path).split("-", 1)[0])
            metas.sort(key=lambda n: normalize(n.split("-", 1)[0]) != stem)
            headers = _headers(archive.read(metas[0]).decode("utf-8", "replace"))
    except zipfile.BadZipfile as exc:
        raise ValueError("not a zip archive (%s)" % exc)
    if not headers.get("Name") or not headers.get("Version"):
        raise ValueError("its METADATA has no Name or no Version")
    return {"name": headers["Name"], "version": headers["Version"]}


def read_header(path, size=HEADER_BYTES):
    with open(path, "rb") as handle:
        return handle.read(size)


def read_installer(path):
    """{installer, version, label} from a .run file's shell header; ValueError when the file
    is no installer of a known kind."""
    head = read_header(path)
    if not head.startswith(b"#!"):
        raise ValueError("not a self-extracting installer (no #! shell header)")
    text = head.decode("utf-8", "replace")
    label = re.search(r'^label="([^"\n]*)"', text, re.M)
    for kind in ("xpytorch", "xre"):
        spec = INSTALLERS[kind]
        if not spec["mark"].search(text):
            continue
        version = ""
        for pattern in spec["version"]:
            found = pattern.search(text)
            if found:
                version = found.group(1)
                break
        return {"installer": kind, "version": version, "label": label.group(1) if label else ""}
    raise ValueError("a shell script that names no known installer (%s) in its header"
                     % ", ".join(sorted(INSTALLERS)))


def _member_text(archive, member, limit=1 << 20):
    handle = archive.extractfile(member)
    return handle.read(limit).decode("utf-8", "replace") if handle else ""


def _parts(member):
    name = member.name
    while name.startswith("./"):
        name = name[2:]
    return name.strip("/").split("/")


# What reading a damaged or truncated (compressed) tar raises.
_TAR_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error)


def read_source(path):
    """{name, version, commit} of a source tarball; ValueError when it is not one."""
    found = {}
    try:
        with tarfile.open(path, "r:*") as archive:
            comment = (archive.pax_headers or {}).get("comment", "")
            for member in archive:
                parts = _parts(member)
                if not member.isfile() or len(parts) > 3:
                    continue
                # At the top: the root, or the one directory an sdist unpacks into.
                if parts[-1] in ("PKG-INFO", "setup.py", "pyproject.toml") and len(parts) <= 2:
                    found.setdefault(parts[-1], _member_text(archive, member))
                elif parts[-1] == "__init__.py" and len(parts) >= 2 and "__init__" not in found:
                    text = _member_text(archive, member)
                    if "__commit__" in text:
                        found["__init__"] = text
    except _TAR_ERRORS as exc:
        raise ValueError("not a readable tar archive (%s)" % exc)
    if not any(k in found for k in ("PKG-INFO", "setup.py", "pyproject.toml")):
        raise ValueError("no PKG-INFO, setup.py or pyproject.toml at its top")
    name = version = ""
    if "PKG-INFO" in found:
        headers = _headers(found["PKG-INFO"])
        name, version = headers.get("Name", ""), headers.get("Version", "")
    setup = found.get("setup.py", "")
    if not version:
        match = (re.search(r"""^\s*VERSION\s*=\s*["']([^"']+)["']""", setup, re.M)
                 or re.search(r"""\bversion\s*=\s*["']([^"']+)["']""", setup))
        version = match.group(1) if match else ""
    if not name:
        match = re.search(r"""\bname\s*=\s*["']([^"']+)["']""", setup)
        name = match.group(1) if match else ""
    # git archive records the commit as the pax global header's comment.
    commit = comment if re.match(r"^[0-9a-fA-F]{7,40}$", comment or "") else ""
    for text in (setup, found.get("__init__", "")):
        for pattern in _COMMIT:
            match = None if commit else pattern.search(text)
            if match:
                commit = match.group(1)
    return {"name": name, "version": version, "commit": commit.lower()}


def read_image(path):
    """{repo_tags} of a `docker save` archive (manifest.json); ValueError when it is not one."""
    text = None
    try:
        with tarfile.open(path, "r:*") as archive:
            for member in archive:
                if _parts(member) == ["manifest.json"] and member.isfile():
                    text = _member_text(archive, member, 16 << 20)
                    break
    except _TAR_ERRORS as exc:
        raise ValueError("not a readable tar archive (%s)" % exc)
    if text is None:
        raise ValueError("no manifest.json: not a `docker save` archive")
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise ValueError("its manifest.json is not JSON (%s)" % exc)
    tags = []
    for image in manifest if isinstance(manifest, list) else []:
        if isinstance(image, dict):
            tags.extend(t for t in (image.get("RepoTags") or []) if t not in tags)
    return {"repo_tags": tags}


READERS = {"wheel": read_wheel, "installer": read_installer, "source": read_source, "image": read_image}


def sniff(path):
    """The kind of file by its first bytes: wheel, installer, tar (a source or an image:
    read_source / read_image tell), deb, or None."""
    head = read_header(path, 512)
    if head.startswith(b"PK\x03\x04") and path.endswith(".whl"):
        return "wheel"
    if head.startswith(b"#!"):
        return "installer"
    if head.startswith(b"!<arch>\ndebian-binary"):
        return "deb"
    if head.startswith(b"\x1f\x8b") or head[257:262] == b"ustar":
        return "tar"
    return None


def identify(path):
    """{kind, ...what the file says} or None for a file of no kind the bundle holds."""
    kind = sniff(path)
    if kind == "deb":
        return {"kind": "deb"}
    if kind is None:
        return None
    tries = ["source", "image"] if kind == "tar" else [kind]
    for name in tries:
        try:
            return dict(READERS[name](path), kind=name)
        except ValueError:
            continue
    return None
