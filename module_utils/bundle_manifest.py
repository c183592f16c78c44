# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The offline bundle's manifest: `<sha256>  <relative path>` lines (sha256sum format).

Shared by the bundle_check module (preflight, the stages), the controller CLI and the bundle
builder (kunlun_fleet/bundle.py). Standard library only.
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
    """Remembers digests, and what a file says it is (artifact_identity), by (size, mtime) so
    unchanged multi-GB files are not re-read every run.

    An entry is [stamp, sha256 or None, {reader: result}]; entries of two items (digests
    only) are read as before.
    """

    def __init__(self, path):
        self.path = path
        self.entries = {}
        self.dirty = False
        if path and os.path.exists(path):
            try:
                with open(path) as handle:
                    self.entries = json.load(handle)
            except ValueError:
                self.entries = {}

    def _entry(self, path):
        st = os.stat(path)
        key = os.path.abspath(path)
        stamp = [st.st_size, st.st_mtime_ns]
        cached = self.entries.get(key)
        if not cached or cached[0] != stamp:
            cached = [stamp, None, {}]
            self.entries[key] = cached
            self.dirty = True
        elif len(cached) < 3:
            cached.append({})
        return cached

    def digest(self, path):
        entry = self._entry(path)
        if entry[1] is None:
            entry[1] = sha256_file(path)
            self.dirty = True
        return entry[1]

    def metadata(self, path, kind, reader):
        """reader(path), remembered under `kind`; a reader's ValueError is remembered too
        (as {"error": message}), so a file that is not what it should be is not re-read."""
        entry = self._entry(path)
        if kind not in entry[2]:
            try:
                entry[2][kind] = reader(path)
            except ValueError as exc:
                entry[2][kind] = {"error": str(exc)}
            self.dirty = True
        return entry[2][kind]

    def save(self):
        if not self.path or not self.dirty:
            return
        # Files gone (an old bundle, a builder's temporary copies) are forgotten.
        self.entries = dict((k, v) for k, v in self.entries.items() if os.path.exists(k))
        parent = os.path.dirname(self.path)
        if parent and not os.path.isdir(parent):
            os.makedirs(parent)
        # Checks run side by side (stages, tests): each writes its own temporary file.
        tmp = "%s.%d.tmp" % (self.path, os.getpid())
        with open(tmp, "w") as handle:
            json.dump(self.entries, handle)
        os.rename(tmp, self.path)
        self.dirty = False


def read_manifest(bundle_dir):
    """{relative path: sha256} of the bundle's MANIFEST.sha256; IOError/OSError when it
    cannot be read, ValueError when it is malformed."""
    with open(os.path.join(bundle_dir, MANIFEST)) as handle:
        return parse_manifest(handle.read())


def check_bundle(bundle_dir, required, cache_path=None, only_required=False, sums_out=None, cache=None):
    """Problems of a bundle: [(relative path, what is wrong, fix)], empty when sound.

    Every file the manifest lists is verified (only the `required` ones with
    only_required); every `required` path must be listed too. sums_out, a dict, receives
    the manifest's sha256 of each required path it lists. `cache`, a SumCache, is used
    (and left to the caller to save) instead of one read from cache_path.
    """
    problems = []
    manifest_path = os.path.join(bundle_dir, MANIFEST)
    if not os.path.isdir(bundle_dir):
        return [
            (
                bundle_dir,
                "the bundle directory does not exist",
                "set kunlun_stack_bundle_dir to the directory holding the offline bundle",
            )
        ]
    if not os.path.isfile(manifest_path):
        return [
            (
                MANIFEST,
                "missing from %s" % bundle_dir,
                "build the bundle with `kunlun-fleet bundle build %s --vendor VDIR` (it writes the manifest; "
                "docs/bundle.md)" % bundle_dir,
            )
        ]
    try:
        sums = read_manifest(bundle_dir)
    except ValueError as exc:
        return [(MANIFEST, str(exc), "regenerate it with: sha256sum <files> > MANIFEST.sha256")]
    own_cache = cache is None
    if own_cache:
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
            problems.append(
                (
                    rel,
                    "checksum mismatch: sha256 %s, the manifest says %s" % (found, want),
                    "replace it with the file the manifest describes (a corrupt or different download)",
                )
            )
    if own_cache:
        cache.save()
    return problems
