# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a bundle file says it is, read from the file itself (never from its name alone).

- a wheel: Name and Version of its *.dist-info/METADATA, and what its file name parses to;
- a makeself-style .run installer: its kind (the XRE driver, the Kunlun torch "xpytorch")
  and version, from the shell header (the first bytes only: the payload may be GBs);
- a source tarball: its name and the versions it declares (PKG-INFO, pyproject.toml,
  setup.py), the commit it was cut from (only git archive records one: the comment of its
  pax global header), and its layout (at the root, or in one top-level directory);
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
        "version": [
            re.compile(r'^label="[^"\n]*\bXRE\b[^"\n]*?(\d+(?:\.\d+){2,})', re.M | re.I),
            re.compile(r"\bXRE\b[^\n]*?\bversion\s+v?(\d+(?:\.\d+){2,})", re.I),
        ],
    },
    "xpytorch": {
        "what": "the Kunlun torch installer (xpytorch)",
        "mark": re.compile(r"xpytorch", re.I),
        "version": [
            re.compile(r'^label="[^"\n]*xpytorch[^"\n]*?\b(\d+\.\d+\.\d+)\b', re.M | re.I),
            re.compile(r"\bxpytorch\s+v?(\d+\.\d+\.\d+)", re.I),
        ],
    },
}

_WHEEL_NAME = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?"
    r"-(?P<tag>[^-]+-[^-]+-[^-]+)\.whl$"
)


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
            metas = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if not metas:
                raise ValueError("no *.dist-info/METADATA in the archive")
            # Several dist-info directories: the one named after the file.
            stem = normalize(os.path.basename(path).split("-", 1)[0])
            metas.sort(key=lambda n: normalize(n.split("-", 1)[0]) != stem)
            headers = _headers(archive.read(metas[0]).decode("utf-8", "replace"))
    except zipfile.BadZipfile as exc:
        raise ValueError("not a zip archive (%s)" % exc) from exc
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
    raise ValueError("a shell script that names no known installer (%s) in its header" % ", ".join(sorted(INSTALLERS)))


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


def _toml_table_value(text, table, key):
    """A "key = 'string'" of one TOML table (enough for pyproject.toml's [project] name and
    version; standard library only: tomllib is Python 3.11+)."""
    inside = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            inside = stripped == "[%s]" % table
            continue
        if inside:
            match = re.match(r"""^%s\s*=\s*["']([^"']*)["']""" % re.escape(key), stripped)
            if match:
                return match.group(1)
    return ""


def _setup_py_value(text, key):
    match = re.search(r"""\b%s\s*=\s*["']([^"']+)["']""" % key, text)
    if not match and key == "version":
        match = re.search(r"""^\s*VERSION\s*=\s*["']([^"']+)["']""", text, re.M)
    return match.group(1) if match else ""


# The metadata files a source tree (or an sdist) declares itself in, in the order their
# versions are believed: an sdist's PKG-INFO is what was built; with a [project] table,
# setuptools installs pyproject.toml's version over setup()'s.
SOURCE_FILES = ("PKG-INFO", "pyproject.toml", "setup.py")
# git archive writes the commit id as the comment of its pax global header (40 hex digits,
# 64 in a SHA-256 repository); `git get-tar-commit-id` reads it back.
_COMMIT_ID = re.compile(r"^[0-9a-fA-F]{40}(?:[0-9a-fA-F]{24})?$")
# A top-level directory the image build may cd into (its name goes into the Dockerfile).
_PLAIN_DIR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def read_source(path):
    """What a source tarball says of itself; ValueError when it is not one.

    {name, version, declared: {file: version}, commit, commit_from, top_dir, setup_py}:
    name and version as declared (PKG-INFO, else pyproject.toml's [project], else
    setup.py); `declared` every file's own version; `commit` the id git archive recorded in
    its pax global header ("" for an sdist or a plain tarball, which record none);
    `top_dir` the one directory the tree sits in ("" when setup.py and the rest are at the
    archive's root: `git archive` without --prefix); `setup_py` whether that tree has a
    setup.py (what the image build runs).
    """
    tops = set()
    found = {}
    try:
        with tarfile.open(path, "r:*") as archive:
            for member in archive:
                parts = [p for p in _parts(member) if p]
                if not parts:
                    continue
                tops.add(parts[0])
                if member.isfile() and len(parts) <= 2 and parts[-1] in SOURCE_FILES:
                    found.setdefault("/".join(parts), _member_text(archive, member))
            comment = str((archive.pax_headers or {}).get("comment", "") or "")
    except _TAR_ERRORS as exc:
        raise ValueError("not a readable tar archive (%s)" % exc) from exc
    top_dir = ""
    texts = dict((name, found[name]) for name in SOURCE_FILES if name in found)
    if not texts and len(tops) == 1:
        top_dir = list(tops)[0]
        if not _PLAIN_DIR.match(top_dir):
            raise ValueError("its top-level directory %r is not a plain name" % top_dir)
        texts = dict(
            (name, found["%s/%s" % (top_dir, name)]) for name in SOURCE_FILES if "%s/%s" % (top_dir, name) in found
        )
    if not texts:
        raise ValueError("no PKG-INFO, setup.py or pyproject.toml at its top or in its one top-level directory")
    declared = {}
    names = {}
    if "PKG-INFO" in texts:
        headers = _headers(texts["PKG-INFO"])
        declared["PKG-INFO"], names["PKG-INFO"] = headers.get("Version", ""), headers.get("Name", "")
    if "pyproject.toml" in texts:
        declared["pyproject.toml"] = _toml_table_value(texts["pyproject.toml"], "project", "version")
        names["pyproject.toml"] = _toml_table_value(texts["pyproject.toml"], "project", "name")
    if "setup.py" in texts:
        declared["setup.py"] = _setup_py_value(texts["setup.py"], "version")
        names["setup.py"] = _setup_py_value(texts["setup.py"], "name")
    declared = dict((k, v) for k, v in declared.items() if v)
    version = next((declared[k] for k in SOURCE_FILES if declared.get(k)), "")
    name = next((names[k] for k in SOURCE_FILES if names.get(k)), "")
    commit = comment.lower() if _COMMIT_ID.match(comment) else ""
    return {
        "name": name,
        "version": version,
        "declared": declared,
        "commit": commit,
        "commit_from": "git archive" if commit else "",
        "top_dir": top_dir,
        "setup_py": "setup.py" in texts,
    }


def describe_declared(found):
    """How a source declares its version, for messages: "0.15.1.dev0 (pyproject.toml),
    0.15.1 (setup.py)"; "no version" when none does."""
    declared = found.get("declared") or {}
    parts = ["%s (%s)" % (declared[k], k) for k in SOURCE_FILES if declared.get(k)]
    return ", ".join(parts) or "no version"


def _image_id(config):
    """The image ID of a manifest.json entry's Config: `<hex>.json` (docker save before 25) or
    `blobs/sha256/<hex>` (the OCI layout of 25 and later); the ID is the config's sha256."""
    if not isinstance(config, str):
        return None
    name = config.rsplit("/", 1)[-1]
    if name.endswith(".json"):
        name = name[: -len(".json")]
    return "sha256:" + name if re.match(r"^[0-9a-f]{64}$", name) else None


def read_image(path):
    """{repo_tags, images} of a `docker save` archive (manifest.json): every tag, and each
    image's ID with its tags (what `docker image inspect` calls Id once it is loaded);
    ValueError when it is not one."""
    text = None
    try:
        with tarfile.open(path, "r:*") as archive:
            for member in archive:
                if _parts(member) == ["manifest.json"] and member.isfile():
                    text = _member_text(archive, member, 16 << 20)
                    break
    except _TAR_ERRORS as exc:
        raise ValueError("not a readable tar archive (%s)" % exc) from exc
    if text is None:
        raise ValueError("no manifest.json: not a `docker save` archive")
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise ValueError("its manifest.json is not JSON (%s)" % exc) from exc
    tags, images = [], []
    for image in manifest if isinstance(manifest, list) else []:
        if isinstance(image, dict):
            tags.extend(t for t in (image.get("RepoTags") or []) if t not in tags)
            images.append({"id": _image_id(image.get("Config")), "repo_tags": list(image.get("RepoTags") or [])})
    return {"repo_tags": tags, "images": images}


READERS = {"wheel": read_wheel, "installer": read_installer, "source": read_source, "image": read_image}
# The key a reader's result is remembered under (bundle_manifest.SumCache): a new key when
# a reader learns to say more, so what an older one said of a file is not taken for it.
CACHE_KEYS = {"source": "source-2", "identify": "identify-2", "image": "image-2"}


def cache_key(kind):
    return CACHE_KEYS.get(kind, kind)


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
