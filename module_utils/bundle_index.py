# -*- coding: utf-8 -*-
# Copyright: kunlun-fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The bundle's index (bundle.yml) against the pins, the manifest and the files themselves.

`kunlun-fleet bundle build` (kunlun_fleet/bundle.py) writes bundle.yml at the bundle's root:

    format: 1
    artifacts:
      <pin key>: {path: <file relative to the bundle>, version: <what the file says>,
                  sha256: <its digest>, ...}

The pins (roles/kunlun_stack/defaults/main.yml) name versions and what identifies each
artifact, never a file; `expected(pins)` turns them into one spec per key. `check` verifies
a bundle: the manifest (bundle_manifest.check_bundle) and, for the keys asked for, that
bundle.yml maps each to a file that is in the manifest with the same sha256, is what the pin
says (read from the file: artifact_identity) and, where the pin knows the package index's
sha256, is that very file. Shared by the bundle_check module, the CLI and the builder.
The index arrives parsed (Ansible's from_yaml, or PyYAML on the controller): standard
library only.
"""

from __future__ import absolute_import, division, print_function

import json
import os

from ansible.module_utils.artifact_identity import (
    INSTALLERS,
    READERS,
    cache_key,
    describe_declared,
    normalize,
    parse_wheel_name,
)
from ansible.module_utils.bundle_manifest import MANIFEST, SumCache, check_bundle, parse_manifest, read_manifest
from ansible.module_utils.model_config import check_config

__metaclass__ = type

INDEX = "bundle.yml"
FORMAT = 1
# Where each kind of artifact lives in the bundle (the builder's layout).
LAYOUT = {
    "driver": "drivers",
    "torch": "torch",
    "wheel": "wheels",
    "source": "src",
    "image": "images",
    "model": "models",
    "gateway_router": "wheelhouse",
}


def build_fix(bundle_dir):
    return "build the bundle again: kunlun-fleet bundle build %s --vendor VDIR (docs/bundle.md)" % (bundle_dir or "DIR")


def expected(pins):
    """{key: spec} of every pinned artifact, in the order the bundle lists them.

    `pins` holds the kunlun_stack variables (kunlun_stack_components, kunlun_stack_driver,
    kunlun_stack_base_image, kunlun_stack_model, kunlun_stack_gateway_router,
    kunlun_stack_index_sha256). A spec: key, kind (installer, wheel, source, image, model),
    origin (vendor or index), what identifies the file (name, installer, commit, reference,
    directory), version, the index's sha256 when pinned, and the layout directory.
    """
    sums = pins.get("kunlun_stack_index_sha256") or {}
    out = {}

    def add(key, **spec):
        spec.update(key=key, sha256=str(sums.get(key) or "").lower(), version=str(spec.get("version") or ""))
        spec.setdefault("origin", "vendor")
        out[key] = spec

    driver = pins.get("kunlun_stack_driver") or {}
    if driver:
        add(
            "driver",
            kind="installer",
            installer=driver.get("installer", "xre"),
            version=driver.get("version"),
            layout=LAYOUT["driver"],
        )
    for key, comp in (pins.get("kunlun_stack_components") or {}).items():
        if not isinstance(comp, dict):
            continue
        if comp.get("installer"):
            add(
                key,
                kind="installer",
                installer=comp["installer"],
                version=comp.get("version"),
                layout=LAYOUT.get(key, key),
            )
        elif comp.get("wheel"):
            add(
                key,
                kind="wheel",
                name=comp["wheel"],
                version=comp.get("version"),
                layout=LAYOUT["wheel"],
                origin=comp.get("origin", "vendor"),
                check_file_version=comp.get("check_file_version", True),
            )
        elif comp.get("source"):
            # A source tree is its commit: the version is what the notes call it (not gated).
            # `sha256`: the digest of a tarball that records no commit (an sdist, a plain
            # tar), declared by the operator as that commit's.
            add(
                key,
                kind="source",
                name=comp["source"],
                version=comp.get("version"),
                commit=str(comp.get("commit") or ""),
                layout=LAYOUT["source"],
                tarball_sha256=str(comp.get("sha256") or "").lower(),
            )
    if pins.get("kunlun_stack_base_image"):
        add("base_image", kind="image", reference=pins["kunlun_stack_base_image"], layout=LAYOUT["image"])
    model = pins.get("kunlun_stack_model") or {}
    if model.get("directory"):
        add("model", kind="model", directory=model["directory"], model=model, layout=LAYOUT["model"])
    router = pins.get("kunlun_stack_gateway_router") or {}
    if router.get("package"):
        add(
            "gateway_router",
            kind="wheel",
            name=router["package"],
            version=router.get("version"),
            origin="index",
            layout=LAYOUT["gateway_router"],
            wheelhouse=True,
            check_file_version=True,
        )
    return out


def describe(spec):
    """What a spec names, for messages: "kunlun_ops 0.1.58+ee39020a (wheel)"."""
    if spec["kind"] == "installer":
        what = INSTALLERS.get(spec["installer"], {}).get("what", "the %s installer" % spec["installer"])
        return "%s %s" % (what, spec["version"])
    if spec["kind"] == "source":
        return "the %s source at commit %s (%s)" % (spec["name"], spec["commit"] or "(none pinned)", spec["version"])
    if spec["kind"] == "image":
        return "the base image %s (docker save archive)" % spec["reference"]
    if spec["kind"] == "model":
        return "the model directory %s with its sha256 manifest" % spec["directory"]
    return "the %s %s wheel" % (spec["name"], spec["version"])


def entry_paths(entry, sums):
    """Every bundle file an index entry stands for: its file, the router's dependency wheels,
    the model directory's files (as the manifest lists them)."""
    paths = [entry["path"]] if entry.get("path") else []
    paths += [p for p in entry.get("dependencies") or [] if isinstance(p, str)]
    directory = entry.get("directory")
    if directory:
        paths += sorted(p for p in sums if p.startswith(directory.rstrip("/") + "/"))
    return paths


def _safe(rel):
    return bool(rel) and isinstance(rel, str) and not os.path.isabs(rel) and ".." not in rel.split("/")


def source_problems(spec, found, rel, digest=None):
    """A source tarball against its pin: its commit (git archive's pax header), else the
    sha256 the operator declared for that commit (`digest` is the file's), and a setup.py
    for the image build. The versions it declares are shown, never compared: the public
    0.15.1-era tree says v1.0 in setup.py and 0.11.0 in pyproject.toml (docs/bundle.md)."""
    want, commit = (spec.get("commit") or "").lower(), found.get("commit") or ""
    declared_sum = spec.get("tarball_sha256") or ""
    what = "%s declaring %s" % (found.get("name"), describe_declared(found))
    key = spec.get("key", "vllm_kunlun")
    fix = (
        "use `git archive --format=tar.gz %s` of the %s repository (its pax header records the commit); for a "
        "tarball the vendor gave as that commit, declare its sha256 as kunlun_stack_components.%s.sha256"
        % (want or "COMMIT", spec["name"], key)
    )
    problems = []
    if not want:
        if found.get("version") != spec["version"]:
            problems.append(
                (
                    rel,
                    "%s, the pin is %s (and names no commit)" % (what, spec["version"]),
                    "pin the commit (kunlun_stack_components.%s.commit)" % key,
                )
            )
    elif commit and not (commit.startswith(want) or want.startswith(commit)):
        problems.append((rel, "is commit %s (git archive's pax header; %s), the pin is %s" % (commit, what, want), fix))
    elif not commit and not declared_sum:
        problems.append(
            (
                rel,
                "%s records no commit (an sdist or a plain tarball, not a git archive): nothing shows it "
                "is commit %s" % (what, want),
                fix,
            )
        )
    if declared_sum and digest and digest != declared_sum:
        problems.append(
            (
                rel,
                "sha256 %s is not the one declared for commit %s (kunlun_stack_components.%s.sha256: %s)"
                % (digest, want, key, declared_sum),
                fix,
            )
        )
    if not found.get("setup_py"):
        problems.append(
            (
                rel,
                "has no setup.py at its top or in its one top-level directory (%s): the image builds "
                "it with setup.py build and install" % (found.get("top_dir") or "none"),
                fix,
            )
        )
    return problems


def identity_problems(spec, found, file_name, rel, digest=None):
    """What is wrong with a file that says `found` (artifact_identity) for `spec`:
    [(path, state, fix)]. The builder judges vendor files with it, the check bundle files.
    `digest`: the file's sha256 (a source's identity when it records no commit)."""
    fix = "use %s" % describe(spec)
    if "error" in found:
        return [(rel, "not %s: %s" % (describe(spec), found["error"]), fix)]
    problems = []
    kind = spec["kind"]
    if kind == "installer":
        if found.get("installer") != spec["installer"]:
            problems.append(
                (
                    rel,
                    "%s, not %s"
                    % (INSTALLERS.get(found.get("installer"), {}).get("what", "another installer"), describe(spec)),
                    fix,
                )
            )
        elif found.get("version") != spec["version"]:
            problems.append(
                (
                    rel,
                    "its header says version %s, the pin is %s" % (found.get("version") or "nothing", spec["version"]),
                    fix,
                )
            )
    elif kind in ("wheel", "source"):
        if normalize(found.get("name")) != normalize(spec["name"]):
            problems.append(
                (
                    rel,
                    "%s says it is %s, not %s"
                    % (
                        "its METADATA" if kind == "wheel" else "the source",
                        found.get("name") or "nothing",
                        spec["name"],
                    ),
                    fix,
                )
            )
        elif kind == "wheel" and found.get("version") != spec["version"]:
            problems.append(
                (
                    rel,
                    "%s %s, the pin is %s"
                    % (found.get("name"), found.get("version") or "(no version)", spec["version"]),
                    fix,
                )
            )
        if kind == "wheel" and not problems:
            try:
                parsed = parse_wheel_name(file_name)
            except ValueError as exc:
                return [(rel, str(exc), fix)]
            if normalize(parsed["name"]) != normalize(found["name"]):
                problems.append((rel, "its file name says %s, its METADATA %s" % (parsed["name"], found["name"]), fix))
            elif spec.get("check_file_version", True) and parsed["version"] != found["version"]:
                problems.append(
                    (rel, "its file name says version %s, its METADATA %s" % (parsed["version"], found["version"]), fix)
                )
        if kind == "source" and not problems:
            problems = source_problems(spec, found, rel, digest)
    elif kind == "image":
        if spec["reference"] not in (found.get("repo_tags") or []):
            problems.append(
                (
                    rel,
                    "holds %s, not %s"
                    % (", ".join(found.get("repo_tags") or []) or "no tagged image", spec["reference"]),
                    "docker save %s > the archive" % spec["reference"],
                )
            )
    return problems


def model_problems(bundle_dir, spec, manifest_rel, directory, sums=None):
    """The model directory against its sha256 manifest and its config.json against the pin.
    With `sums` (MANIFEST.sha256), each file's digest is compared with the manifest's line
    (the files themselves are hashed by the manifest check)."""
    problems = []
    fix = "copy the model directory and its manifest from the vendor again, then build the bundle again"
    try:
        with open(os.path.join(bundle_dir, manifest_rel)) as handle:
            listed = parse_manifest(handle.read())
    except (IOError, OSError) as exc:
        return [(manifest_rel, "cannot be read: %s" % exc, fix)]
    except ValueError as exc:
        return [(manifest_rel, "is not a sha256sum manifest: %s" % exc, fix)]
    root = os.path.join(bundle_dir, directory)
    present = set()
    for base, dirs, names in os.walk(root):
        dirs.sort()
        for name in names:
            present.add(os.path.relpath(os.path.join(base, name), root).replace(os.sep, "/"))
    for name in sorted(present - set(listed)):
        problems.append(("%s/%s" % (directory, name), "not in the model's manifest %s" % manifest_rel, fix))
    for name, digest in sorted(listed.items()):
        rel = "%s/%s" % (directory, name)
        if name not in present:
            problems.append((rel, "listed in the model's manifest but missing", fix))
        elif sums is not None and rel in sums and sums[rel] != digest:
            problems.append(
                (rel, "the model's manifest says sha256 %s, %s says %s" % (digest, MANIFEST, sums[rel]), fix)
            )
    config = os.path.join(root, "config.json")
    if "config.json" not in present:
        problems.append(("%s/config.json" % directory, "missing: the model directory has no config.json", fix))
    else:
        try:
            with open(config, "rb") as handle:
                data = json.loads(handle.read().decode("utf-8"))
        except ValueError as exc:
            problems.append(("%s/config.json" % directory, "is not JSON: %s" % exc, fix))
        else:
            for problem in check_config(data, spec.get("model") or {}, "%s/config.json" % directory):
                problems.append(("%s/config.json" % directory, "%s: %s" % (problem.item, problem.found), problem.fix))
    return problems


def _entry_problems(bundle_dir, key, entry, spec, sums, cache, identities=None):
    fix = build_fix(bundle_dir)
    rel = entry.get("path")
    if not _safe(rel):
        return [(INDEX, "%s: no usable path (%r)" % (key, rel), fix)]
    full = os.path.join(bundle_dir, rel)
    # A missing or unlisted file, or one whose digest is not the manifest's, is named by
    # the manifest check.
    if not os.path.isfile(full) or rel not in sums:
        return []
    problems = []
    if str(entry.get("sha256") or "").lower() != sums[rel]:
        problems.append(
            (rel, "bundle.yml says sha256 %s for %s, %s says %s" % (entry.get("sha256"), key, MANIFEST, sums[rel]), fix)
        )
    if spec["sha256"] and sums[rel] != spec["sha256"]:
        problems.append(
            (
                rel,
                "sha256 %s is not the package index's %s for %s (kunlun_stack_index_sha256.%s)"
                % (sums[rel], spec["sha256"], describe(spec), key),
                "download the index's file again (%s); a file pinned otherwise on purpose goes with its digest in "
                "the inventory's kunlun_stack_index_sha256 (`kunlun-fleet bundle check` reads it with --inventory INV)"
                % fix,
            )
        )
    if spec["kind"] == "model":
        directory = entry.get("directory") or ""
        want = "%s/%s" % (LAYOUT["model"], spec["directory"])
        if directory != want:
            return problems + [
                (
                    INDEX,
                    "model: the directory is %r, the pin's is %s (kunlun_stack_model.directory)" % (directory, want),
                    fix,
                )
            ]
        return problems + model_problems(bundle_dir, spec, rel, directory, sums)
    found = cache.metadata(full, cache_key(spec["kind"]), READERS[spec["kind"]])
    if identities is not None:
        identities[key] = found
    problems += identity_problems(spec, found, os.path.basename(rel), rel, sums[rel])
    said = entry.get("version")
    if spec["kind"] != "image" and "error" not in found and said is not None and str(said) != found.get("version"):
        problems.append(
            (rel, "bundle.yml says version %s for %s, the file says %s" % (said, key, found.get("version")), fix)
        )
    return problems


def index_problems(bundle_dir, index, pins, keys, sums, cache, index_all=False, identities=None):
    """Problems of bundle.yml's entries for `keys` (and every entry with index_all) against the
    pins, the manifest's sums and the files: [(path, state, fix)]. `identities` receives what
    each file says of itself (artifact_identity), by key."""
    fix = build_fix(bundle_dir)
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        return [
            (
                INDEX,
                "is format %s; this kunlun-fleet reads format %d"
                % (index.get("format") if isinstance(index, dict) else "unknown", FORMAT),
                fix,
            )
        ]
    entries = index.get("artifacts") or {}
    specs = expected(pins)
    wanted = list(keys) + ([k for k in specs if k in entries and k not in keys] if index_all else [])
    problems = []
    for key in wanted:
        spec = specs.get(key)
        if spec is None and key in (pins.get("kunlun_stack_components") or {}):
            problems.append(
                (
                    "kunlun_stack_components.%s" % key,
                    "names no wheel, installer or source: nothing says "
                    "which bundle file it is (an override written for an older kunlun-fleet, with `artifact`?)",
                    "give it the `wheel`, `installer` or `source` of roles/kunlun_stack/defaults/main.yml "
                    "(docs/bundle.md)",
                )
            )
            continue
        if spec is None:
            problems.append((INDEX, "%s is no pinned artifact" % key, "ask for a pin key of kunlun_stack"))
            continue
        entry = entries.get(key)
        if not isinstance(entry, dict):
            problems.append((INDEX, "maps no file for %s (%s): the bundle lacks it" % (key, describe(spec)), fix))
            continue
        problems += _entry_problems(bundle_dir, key, entry, spec, sums, cache, identities)
    return problems


def check(
    bundle_dir,
    pins,
    index,
    artifacts=(),
    required=(),
    cache_path=None,
    only_required=False,
    index_all=False,
    sums_out=None,
    identities_out=None,
):
    """Problems of a bundle, [(relative path, what is wrong, fix)], empty when sound.

    The manifest as bundle_manifest.check_bundle verifies it (`required` paths, or with
    only_required only those), plus, when `artifacts` (pin keys) are asked for or index_all,
    bundle.yml: present, and each of those keys' entries (every pinned entry it has with
    index_all) true to the pins and the files; their files are required paths too. sums_out
    receives the manifest's sha256 of every required path, identities_out what each checked
    entry's file says of itself (a source's commit, declared versions and top directory).
    """
    use_index = bool(artifacts) or index_all
    if use_index and not os.path.isfile(os.path.join(bundle_dir, INDEX)):
        if not os.path.isdir(bundle_dir):
            return check_bundle(bundle_dir, [], cache_path)
        return [
            (
                INDEX,
                "missing from %s: the bundle was not made by `kunlun-fleet bundle build`, so nothing says "
                "which file is which pinned artifact" % bundle_dir,
                build_fix(bundle_dir),
            )
        ]
    cache = SumCache(cache_path)
    required = list(required)
    try:
        sums = read_manifest(bundle_dir)
    except (IOError, OSError, ValueError):
        sums = None  # check_bundle names what is wrong with it
    entries = (index.get("artifacts") or {}) if isinstance(index, dict) else {}
    if use_index and sums is not None:
        specs = expected(pins)
        keys = list(artifacts) + ([k for k in entries if k in specs and k not in artifacts] if index_all else [])
        for key in keys:
            if isinstance(entries.get(key), dict):
                required += [p for p in entry_paths(entries[key], sums) if p not in required]
    problems = check_bundle(bundle_dir, required, only_required=only_required, sums_out=sums_out, cache=cache)
    if use_index and sums is not None:
        problems += index_problems(bundle_dir, index, pins, artifacts, sums, cache, index_all, identities_out)
    cache.save()
    return problems
