# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The offline bundle's manifest: `<sha256>  <relative path>` lines (sha256sum format).

Shared by the bundle_check module (preflight) and the controller CLI. Standard library only.
"""

from __future__ import absolute_import, division, print_function

import hashlib
import json
import os
import re

__metaclass__ = type

MANIFEST = "MANIFEST.sha256"
_CHUNK = 4 * 1024 * 1024
# sha256sum's text (two spaces) and binary (" *") forms.
_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")


def parse_manifest(text):
    """{relative path: sha256} from sha256sum output; raises ValueError on a malformed line."""
    sums = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            raise ValueError("line %d is not '<sha256>  <path>': %r" % (number, line[:120]))
        sums[match.group(2)] = match.group(1).lower()
    return sums


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


class SumCache(object):
    """Remembers digests by (size, mtime) so unchanged multi-GB files are not re-read every run."""

    def __init__(self, path):
        self.path = path
        self.entries = {}
        if path and os.path.exists(path):
            try:
                with open(path) as handle:
                    self.entries = json.load(handle)
            except ValueError:
                self.entries = {}

    def digest(self, path):
        st = os.stat(path)
        key = os.path.abspath(path)
        stamp = [st.st_size, st.st_mtime_ns]
        cached = self.entries.get(key)
        if cached and cached[0] == stamp:
            return cached[1]
        value = sha256_file(path)
        self.entries[key] = [stamp, value]
        return value

    def save(self):
        if not self.path:
            return
        parent = os.path.dirname(self.path)
        if parent and not os.path.isdir(parent):
            os.makedirs(parent)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(self.entries, handle)
        os.rename(tmp, self.path)


def check_bundle(bundle_dir, required, cache_path=None, only_required=False, sums_out=None):
    """Problems of a bundle: [(relative path, what is wrong, fix)], empty when sound.

    Every file the manifest lists is verified (only the `required` ones with
    only_required); every `required` path must be listed too. sums_out, a dict, receives
    the manifest's sha256 of each required path it lists.
    """
    problems = []
    manifest_path = os.path.join(bundle_dir, MANIFEST)
    if not os.path.isdir(bundle_dir):
        return [(bundle_dir, "the bundle directory does not exist",
                 "set kunlun_stack_bundle_dir to the directory holding the offline bundle")]
    if not os.path.isfile(manifest_path):
        return [(MANIFEST, "missing from %s" % bundle_dir,
                 "copy the bundle's MANIFEST.sha256 (sha256sum format) into the bundle directory")]
    try:
        with open(manifest_path) as handle:
            sums = parse_manifest(handle.read())
    except ValueError as exc:
        return [(MANIFEST, str(exc), "regenerate it with: sha256sum <files> > MANIFEST.sha256")]
    cache = SumCache(cache_path)
    if sums_out is not None:
        sums_out.update((rel, sums[rel]) for rel in required if rel in sums)
    for rel in sorted(set(required) - set(sums)):
        where = os.path.join(bundle_dir, rel)
        state = "present but not in the manifest" if os.path.exists(where) else "missing"
        problems.append((rel, state, "add the file to the bundle and its sha256 to %s" % MANIFEST))
    for rel, want in sorted(sums.items()):
        if only_required and rel not in required:
            continue
        path = os.path.join(bundle_dir, rel)
        if not os.path.isfile(path):
            problems.append((rel, "listed in the manifest but missing", "copy it into %s" % bundle_dir))
            continue
        found = cache.digest(path)
        if found != want:
            problems.append((rel, "checksum mismatch: sha256 %s, the manifest says %s" % (found, want),
                             "replace it with the file the manifest describes (a corrupt or different download)"))
    cache.save()
    return problems
