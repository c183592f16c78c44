#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: model_verify
short_description: Verify a model directory - its exact name, every file against a sha256 manifest, its config.json
description:
  - Refuses a directory whose base name is not exactly I(directory) (a wrong or shortened name makes vllm try a
    hub download) before reading anything.
  - Hashes every file the I(manifest) lists (sha256sum format, paths relative to I(path)) on the host it runs on
    and returns the files that are missing or differ - the list of files to copy. Digests of files whose size and
    modification time are unchanged since the last run are taken from I(cache_file), so re-runs on a 30 GB model
    cost seconds; I(full) hashes everything again.
  - Weight files in the directory that the manifest does not list (C(*.safetensors), C(*.bin), C(*.pt), C(*.pth))
    are problems - vllm would load them; other extra files are only reported.
  - With I(expected) (kunlun_stack_model), checks config.json through C(module_utils/model_config.py) - model_type,
    max_position_embeddings, no rope scaling, dtype, quantization method.
  - Changes nothing but its own digest cache (not written in check mode); always C(changed=false).
options:
  path:
    description: The model directory.
    type: path
    required: true
  directory:
    description: The exact base name I(path) must have (C(kunlun_stack_model.directory)).
    type: str
  manifest:
    description: The manifest text (C(<sha256>  <relative path>) lines). Omit to skip the checksums.
    type: str
  expected:
    description: The model's expected values (C(kunlun_stack_model)); omit to skip the config.json check.
    type: dict
  cache_file:
    description: Where digests are remembered by size and modification time (a path on the host); omit to hash
      every file on every run.
    type: path
  full:
    description: Ignore the cache and hash every file.
    type: bool
    default: false
  fail_on_problems:
    description: Fail when anything is wrong. With false the problems are only returned (to decide what to copy).
    type: bool
    default: true
author:
  - kunlun-fleet contributors (@kunlun-fleet)
"""

EXAMPLES = r"""
- name: Which model files are missing or differ
  model_verify:
    path: /home/newdata/models/{{ kunlun_stack_model.directory }}
    directory: "{{ kunlun_stack_model.directory }}"
    manifest: "{{ lookup('ansible.builtin.file', kunlun_stack_bundle_dir ~ '/' ~ kunlun_stack_bundle_files.model) }}"
    cache_file: /home/newdata/models/.{{ kunlun_stack_model.directory }}.sums.json
    fail_on_problems: false
  register: model_before

- name: The staged model is complete and its config.json is the validated one
  model_verify:
    path: /home/newdata/models/{{ kunlun_stack_model.directory }}
    directory: "{{ kunlun_stack_model.directory }}"
    manifest: "{{ model_manifest_text }}"
    expected: "{{ kunlun_stack_model }}"
"""

RETURN = r"""
ok:
  description: Nothing is wrong.
  returned: always
  type: bool
files:
  description: Files the manifest lists.
  returned: always
  type: int
bytes:
  description: Size of the listed files present on the host.
  returned: always
  type: int
hashed:
  description: Files actually read this run (the others came from the cache).
  returned: always
  type: int
missing:
  description: Listed files that are not in the directory.
  returned: always
  type: list
  elements: str
mismatched:
  description: Listed files whose sha256 differs (path, found, expected).
  returned: always
  type: list
  elements: dict
to_copy:
  description: Missing and mismatched files, sorted - what a transfer must bring.
  returned: always
  type: list
  elements: str
to_copy_sha256:
  description: The manifest's sha256 of every file in I(to_copy) (for a download that checks it).
  returned: always
  type: dict
extra:
  description: Files in the directory the manifest does not list.
  returned: always
  type: list
  elements: str
problems:
  description: Everything wrong (item, found, fix), including the config.json problems.
  returned: always
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.bundle_manifest import SumCache, parse_manifest
from ansible.module_utils.kunlun_stack import Problem
from ansible.module_utils.model_config import CONFIG, check_directory_name, check_model_dir

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class _NoCache(SumCache):
    """A SumCache that reads every file (I(full), or no cache file)."""

    def __init__(self, path=None):
        SumCache.__init__(self, None)
        self.path = path

    def digest(self, path):
        self.entries.pop(os.path.abspath(path), None)
        return SumCache.digest(self, path)


def _listed_safely(rel):
    parts = rel.replace("\\", "/").split("/")
    return not rel.startswith("/") and ".." not in parts and rel.strip() == rel


def _walk(root):
    found = []
    for here, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            found.append(os.path.relpath(os.path.join(here, name), root))
    return found


def verify(params, check_mode=False):
    """The verification result as a dict (no AnsibleModule needed)."""
    path = params["path"].rstrip("/") or "/"
    result = dict(
        ok=True,
        files=0,
        bytes=0,
        hashed=0,
        missing=[],
        mismatched=[],
        to_copy=[],
        to_copy_sha256={},
        extra=[],
        problems=[],
    )
    problems = []
    if params.get("directory"):
        name_problems = check_directory_name(
            os.path.basename(path),
            {"directory": params["directory"], "name": (params.get("expected") or {}).get("name")},
        )
        if name_problems:
            result["ok"] = False
            result["problems"] = [p.as_dict() for p in name_problems]
            result["refused"] = True
            return result
    config_listed_ok = True
    if params.get("manifest") is not None:
        try:
            sums = parse_manifest(params["manifest"])
        except ValueError as exc:
            problems.append(
                Problem(
                    "model manifest", str(exc), "regenerate it in the model directory: sha256sum * > ../<dir>.sha256"
                )
            )
            sums = {}
        if not sums and not problems:
            problems.append(
                Problem("model manifest", "lists no file", "use the model's .sha256 manifest from the bundle")
            )
        unsafe = sorted(rel for rel in sums if not _listed_safely(rel))
        for rel in unsafe:
            problems.append(
                Problem(
                    "model manifest",
                    "path %r leaves the model directory" % rel,
                    "paths in the manifest are relative to the model directory",
                )
            )
            sums.pop(rel)
        result["files"] = len(sums)
        cache = (
            _NoCache(params.get("cache_file"))
            if params.get("full") or not params.get("cache_file")
            else SumCache(params["cache_file"])
        )
        before = len(cache.entries)
        for rel, want in sorted(sums.items()):
            full = os.path.join(path, rel)
            if not os.path.isfile(full):
                result["missing"].append(rel)
                continue
            result["bytes"] += os.path.getsize(full)
            key = os.path.abspath(full)
            cached = cache.entries.get(key)
            found = cache.digest(full)
            if cache.entries.get(key) != cached or cached is None:
                result["hashed"] += 1  # read now, not taken from the cache
            if found != want:
                result["mismatched"].append({"path": rel, "found": found, "expected": want})
        if not check_mode and cache.path and (result["hashed"] or len(cache.entries) != before):
            try:
                cache.save()
            except (IOError, OSError):
                pass  # a cache we cannot write only costs time next run
        for rel in result["missing"]:
            problems.append(Problem("model file %s" % rel, "missing from %s" % path, "copy it from the model source"))
        for bad in result["mismatched"]:
            problems.append(
                Problem(
                    "model file %s" % bad["path"],
                    "sha256 %s, the manifest says %s" % (bad["found"], bad["expected"]),
                    "copy it again from the model source (a damaged or different file)",
                )
            )
        result["to_copy"] = sorted(result["missing"] + [m["path"] for m in result["mismatched"]])
        result["to_copy_sha256"] = dict((rel, sums[rel]) for rel in result["to_copy"])
        config_listed_ok = CONFIG not in result["to_copy"]
        if os.path.isdir(path):
            listed = set(sums)
            result["extra"] = [rel for rel in _walk(path) if rel not in listed]
            for rel in result["extra"]:
                if rel.endswith(WEIGHT_SUFFIXES):
                    problems.append(
                        Problem(
                            "model file %s" % rel,
                            "in %s but not in the manifest: vllm would load it with the model" % path,
                            "move it out of the model directory (it is from another model or version)",
                        )
                    )
    if params.get("expected") and config_listed_ok:
        problems.extend(check_model_dir(path, params["expected"]))
    result["problems"] = [p.as_dict() for p in problems]
    result["ok"] = not problems
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            directory=dict(type="str"),
            manifest=dict(type="str"),
            expected=dict(type="dict"),
            cache_file=dict(type="path"),
            full=dict(type="bool", default=False),
            fail_on_problems=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    result = verify(module.params, module.check_mode)
    if result.pop("refused", False) or (module.params["fail_on_problems"] and not result["ok"]):
        lines = ["%(item)s: %(found)s. Fix: %(fix)s" % p for p in result["problems"]]
        shown = lines[:20] + (["... and %d more" % (len(lines) - 20)] if len(lines) > 20 else [])
        module.fail_json(
            msg="The model in %s is not usable:\n- %s" % (module.params["path"], "\n- ".join(shown)), **result
        )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
