"""Build the simulated fleet's offline bundle: stand-ins for the vendor's artifacts, made
into a bundle by the product's own builder (`kunlun-fleet bundle build`, kunlun_fleet/bundle.py).

    python -m kunlun_fleet.sim.bundle build --out DIR [--force] [--with-base-image]
    python -m kunlun_fleet.sim.bundle verify --out DIR
    python -m kunlun_fleet.sim.bundle stack --stack-commit C --base DIR OUT

This module writes what a vendor delivers, with the vendor's file names, into a vendor
directory of its own, next to `out`:

    xre-Linux-x86_64-<ver>.run             the kit's XRE installer (kunlun_fleet/sim/kit/xre.py)
    xpytorch-cp310-torch251-...x64.run     torch 2.5.1 + torch_xmlir, makeself-style installer
    kunlun_ops, triton, xspeedgate_ops, cocopod wheels   stand-in wheels (zipfile-built)
    vllm-kunlun-<ver>-<commit>.tar.gz      source tree with a C extension and the patches, as
                                           `git archive --prefix` writes it (the commit in its
                                           pax header: what the builder identifies it by)
    <model dir>/ and <model dir>.sha256    small model with real config.json and tokenizer
    vllm-kunlun-exp-base.tar               only with --with-base-image (build_base_image, cached)
    debs/<package>_<version>_<arch>.deb    the engine role's offline install (engine_source: bundle):
                                           engine_bundle_packages (roles/engine/defaults/main.yml) and
                                           every package they need that a minimal Debian 12 host
                                           (debootstrap minbase) lacks, amd64, from the Debian mirror
                                           (apt-get --download-only against a minbase dpkg status; cached)

and gives the builder, as --find-links with --no-index, what stands for the package index:
the stand-in vllm wheel (under the index's file name), the real transformers wheel and the
gateway's router with every wheel it needs for the gateway hosts' Python (downloaded from
PyPI once into the sim cache). The pins are those of inventories/sim (--inventory): the
stand-in vllm cannot have the index's sha256, and the sim inventory says so. The builder
lays the bundle out, checks every file against its pin and writes bundle.yml and
MANIFEST.sha256; any pin it cannot satisfy fails the build.

Outputs are deterministic (fixed timestamps and order in every archive), so the same
sources give the same bytes and the same manifest. `build` is skipped when the sources,
the pins and the output are unchanged (a stamp in the sim cache records what was built).
Files in the bundle outside the layout the builder fills (images/ without
--with-base-image) are kept and covered by the manifest.
"""

import argparse
import copy
import fcntl
import glob
import gzip
import hashlib
import importlib.util
import io
import json
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

from kunlun_fleet.sim import base_python
from kunlun_fleet.sim import config as sim_config
from kunlun_fleet.sim.artifacts import model as model_mod
from kunlun_fleet.sim.artifacts.torch_run import build_torch_run
from kunlun_fleet.sim.artifacts.wheel import build_wheel, tree_files

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
PINS_FILE = os.path.join(REPO_ROOT, "roles", "kunlun_stack", "defaults", "main.yml")
ENGINE_DEFAULTS = os.path.join(REPO_ROOT, "roles", "engine", "defaults", "main.yml")
ARTIFACTS = os.path.join(HERE, "artifacts")
XRE_MODULE = os.path.join(HERE, "kit", "xre.py")
SIM_HOME = os.path.abspath(os.environ.get("KUNLUN_SIM_HOME", "/var/lib/kunlun-sim"))
# The test fleet's one cache directory (config.py): downloads and stamps, keyed by inputs.
CACHE_DIR = sim_config.CACHE_DIR
MANIFEST = "MANIFEST.sha256"
SIM_INVENTORY = os.path.join(REPO_ROOT, "inventories", "sim")
# The vendor's and the index's file names of the stand-ins (the pins name no file). The
# vendor's are cp310; under the stand-in base image's Debian fallback, its tag (base_python.py).
WHEEL_TAG = base_python.resolve()["wheel_tag"]
VLLM_WHEEL_TAG = "cp38-abi3-manylinux_2_31_x86_64"
TORCH_RUN = "xpytorch-%s-torch251-ubuntu2004-x64.run" % WHEEL_TAG.split("-")[0]
BASE_ARCHIVE = "vllm-kunlun-exp-base.tar"
# The builder's code and the sim inventory's pins shape the bundle too.
PRODUCT_SOURCES = [
    os.path.join(REPO_ROOT, p)
    for p in (
        "kunlun_fleet/bundle.py",
        "module_utils/artifact_identity.py",
        "module_utils/bundle_index.py",
        "module_utils/bundle_manifest.py",
        "module_utils/model_config.py",
        "inventories/sim/group_vars/all/sim.yml",
    )
]

# cocopod's METADATA version. None: the pinned version (what importlib.metadata reports
# is then the pin). Set it to a different version (e.g. "0.0.0+torch2.5") to make uv
# refuse the file unless UV_SKIP_WHEEL_FILENAME_CHECK=1: uv only checks the METADATA
# version against the file name (not the name, tags or dist-info directory), so a
# refusal and importlib.metadata reporting the pinned version cannot both hold.
COCOPOD_METADATA_VERSION = None

SMALL_PACKAGES = {
    # kunlun_ops: the package tree under artifacts/kunlun_ops_src (its operator table)
    "kunlun_ops": ("Kunlunxin XPU operator library for PyTorch", None),
    "triton": (
        "A language and compiler for custom Deep Learning operations (Kunlunxin build)",
        '"""triton 3.0.0 (Kunlunxin XPU backend)."""\n__version__ = "@BASE@"\n',
    ),
    "xspeedgate_ops": (
        "Kunlunxin speed-gate operators for torch 2.5",
        '"""xspeedgate_ops for torch 2.5."""\n__version__ = "@VERSION@"\n',
    ),
    "cocopod": (
        "Kunlunxin communication/compute overlap runtime for torch 2.5",
        '"""cocopod for torch 2.5."""\n__version__ = "@VERSION@"\n',
    ),
}
KUNLUN_OPS_SRC = os.path.join(ARTIFACTS, "kunlun_ops_src", "kunlun_ops")

# Other vllm-kunlun commits the tests build images with (artifacts/vllm_kunlun_variants/):
# commit -> version. See that directory's README.
VLLM_KUNLUN_VARIANTS = {
    "2fda97b": "0.25.1.dev0",
    # Candidates of the same release line (a dev version does not change per commit).
    "7c1e0a2": "0.15.1.dev0",
    "b3f9d41": "0.15.1.dev0",
    "e5a7c83": "0.15.1.dev0",
}
# The full ids of the stand-in commits, as git archive records them. Neither commit is in
# the public vLLM-Kunlun history: past their short ids (the notes') the digits are made
# up, and so is the commit time every member carries.
VLLM_KUNLUN_COMMIT_IDS = {
    "4885de2": "4885de2" + hashlib.sha1(b"vllm-kunlun 4885de2 stand-in").hexdigest()[:33],
    "2fda97b": "2fda97b" + hashlib.sha1(b"vllm-kunlun 2fda97b stand-in").hexdigest()[:33],
    "7c1e0a2": "7c1e0a2" + hashlib.sha1(b"vllm-kunlun 7c1e0a2 stand-in").hexdigest()[:33],
    "b3f9d41": "b3f9d41" + hashlib.sha1(b"vllm-kunlun b3f9d41 stand-in").hexdigest()[:33],
    "e5a7c83": "e5a7c83" + hashlib.sha1(b"vllm-kunlun e5a7c83 stand-in").hexdigest()[:33],
}
VLLM_KUNLUN_COMMIT_TIME = 1773216950  # 2026-03-11, a 0.15.1-era date (8986d8c's)


def vllm_kunlun_tarball(members: dict, commit: str) -> bytes:
    """A vllm-kunlun source tarball as `git archive --prefix=vLLM-Kunlun-<commit>/` writes it
    (the prefix is the repository's name and the short commit, like GitHub's archives)."""
    return _git_archive(members, f"vLLM-Kunlun-{commit}/", VLLM_KUNLUN_COMMIT_IDS[commit], VLLM_KUNLUN_COMMIT_TIME)


VARIANTS_DIR = os.path.join(ARTIFACTS, "vllm_kunlun_variants")
# The commit artifacts/vllm_kunlun_src is, and the version its files declare.
VLLM_KUNLUN_SRC = {"version": "0.15.1.dev0", "commit": "4885de2"}


def load_pins(stack: str = None) -> dict:
    """The product's pins with the chosen stack's parts worked out (the shipped default stack
    unless `stack` names another)."""
    from kunlun_fleet.bundle import load_pins as product_pins

    return product_pins(stack=stack)


def component(pins: dict, name: str) -> dict:
    return pins["kunlun_stack_components"][name]


# --------------------------------------------------------------------------- sources
def source_files() -> list:
    """Every input that shapes the bundle (for the up-to-date check)."""
    files = [os.path.abspath(__file__), PINS_FILE] + [p for p in PRODUCT_SOURCES if os.path.exists(p)]
    for root, dirs, names in os.walk(ARTIFACTS):
        dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "tools"))
        files += [os.path.join(root, n) for n in sorted(names) if not n.endswith(".pyc")]
    xre_dir = os.path.join(HERE, "kit", "xre")
    if os.path.exists(XRE_MODULE):
        files.append(XRE_MODULE)
        for root, dirs, names in os.walk(xre_dir):
            dirs.sort()
            files += [os.path.join(root, n) for n in sorted(names) if not n.endswith(".pyc")]
    return files


def sources_hash() -> str:
    h = hashlib.sha256()
    for path in source_files():
        h.update(os.path.relpath(path, REPO_ROOT).encode() + b"\0")
        with open(path, "rb") as fh:
            h.update(hashlib.sha256(fh.read()).digest())
    h.update(str(COCOPOD_METADATA_VERSION).encode())
    h.update(WHEEL_TAG.encode())
    h.update(debs_key(engine_bundle_packages()).encode())
    return h.hexdigest()


def _stamp_path(out: str) -> str:
    key = hashlib.sha256(os.path.abspath(out).encode()).hexdigest()[:16]
    return os.path.join(CACHE_DIR, "bundle-stamps", key)


# --------------------------------------------------------------------------- helpers
def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write(path: str, data: bytes, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _git_archive(members: dict, prefix: str, commit_id: str, mtime: int) -> bytes:
    """The tar.gz `git archive --format=tar.gz --prefix=<prefix> <commit>` writes (read from
    a git 2.39 archive of the public vLLM-Kunlun tree): first a pax global header whose
    comment is the full commit id (what `git get-tar-commit-id` and tarfile's pax_headers
    read), then ustar members under the prefix, directories included, owned by root (uid and
    gid 0), every one at the commit's time, mode 0775 for directories and 0664 for files
    (tar.umask 002; no file of the tree is executable), gzip with no name and mtime 0."""
    raw = io.BytesIO()

    def entry(name, kind, mode, size=0):
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.size, info.mtime = kind, mode, size, mtime
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        record = (
            ("52 comment=%s\n" % commit_id).encode()
            if len(commit_id) == 40
            else ("%d comment=%s\n" % (len(commit_id) + 12, commit_id)).encode()
        )
        tar.addfile(entry("pax_global_header", tarfile.XGLTYPE, 0o666, len(record)), io.BytesIO(record))
        tar.addfile(entry(prefix, tarfile.DIRTYPE, 0o775))
        dirs = set()
        for name in sorted(members):
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    tar.addfile(entry(prefix + d + "/", tarfile.DIRTYPE, 0o775))
            tar.addfile(entry(prefix + name, tarfile.REGTYPE, 0o664, len(members[name])), io.BytesIO(members[name]))
    buf = io.BytesIO()
    with gzip_file(buf) as gz:
        gz.write(raw.getvalue())
    return buf.getvalue()


def gzip_file(fileobj):
    return gzip.GzipFile(filename="", mode="wb", fileobj=fileobj, compresslevel=9, mtime=0)


# --------------------------------------------------------------------------- artifacts
def build_small_wheels(pins: dict, vendor: str) -> list:
    """The four vendor wheels, under their vendor names, into `vendor`."""
    written = []
    for pkg, (summary, init) in SMALL_PACKAGES.items():
        comp = component(pins, pkg)
        name, version = comp["wheel"], comp["version"]
        base = version.split("+")[0]
        if init is None:
            files = {
                arc: data.replace(b"@VERSION@", version.encode())
                for arc, data in tree_files(KUNLUN_OPS_SRC, f"{pkg}/").items()
            }
        else:
            files = {f"{pkg}/__init__.py": init.replace("@VERSION@", version).replace("@BASE@", base).encode()}
        kw = {}
        if pkg == "cocopod" and COCOPOD_METADATA_VERSION:
            kw["metadata_version"] = COCOPOD_METADATA_VERSION
        path = os.path.join(vendor, f"{name}-{version}-{WHEEL_TAG}.whl")
        os.makedirs(vendor, exist_ok=True)
        build_wheel(path, name, version, files, WHEEL_TAG, summary=summary, **kw)
        written.append(path)
    return written


def build_vllm_wheel(pins: dict, index: str) -> str:
    """The stand-in vllm wheel under the package index's file name, into `index` (what the
    builder takes as the index: --find-links)."""
    comp = component(pins, "vllm")
    name, version = comp["wheel"], comp["version"]
    src = os.path.join(ARTIFACTS, "vllm_src")
    files = tree_files(os.path.join(src, "vllm"), "vllm/")
    path = os.path.join(index, f"{name}-{version}-{VLLM_WHEEL_TAG}.whl")
    os.makedirs(index, exist_ok=True)
    build_wheel(
        path,
        name,
        version,
        files,
        VLLM_WHEEL_TAG,
        summary="A high-throughput and memory-efficient inference and serving engine for LLMs",
        requires_python="<3.14,>=3.10",
        extra_metadata=(
            "Author: vLLM Team",
            "License-Expression: Apache-2.0",
            "Project-URL: Homepage, https://github.com/vllm-project/vllm",
        ),
        entry_points="[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n",
    )
    return path


def _cached_pypi_wheel(name: str, version: str, fname: str) -> str:
    """`pip download` of one wheel from the package index into the sim cache (once)."""
    cache = os.path.join(CACHE_DIR, "wheels")
    cached = os.path.join(cache, fname)
    if not os.path.exists(cached):
        os.makedirs(cache, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-d",
            cache,
            f"{name}=={version}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(cached):
            raise RuntimeError(
                f"could not download {name}=={version} ({fname}) into {cache}:\n"
                f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
    return cached


def _copy_if_changed(src: str, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.exists(path) or sha256_file(path) != sha256_file(src):
        shutil.copyfile(src, path + ".tmp")
        os.replace(path + ".tmp", path)


def fetch_transformers(pins: dict) -> str:
    """The real transformers wheel, downloaded once into the sim cache: its directory (an
    index for the builder)."""
    comp = component(pins, "transformers")
    fname = f"{comp['wheel']}-{comp['version']}-py3-none-any.whl"
    return os.path.dirname(_cached_pypi_wheel(comp["wheel"], comp["version"], fname))


def fetch_transformers_version(version: str, out: str) -> str:
    """Another real transformers release (e.g. the known-bad 5.5.3) from the package index,
    cached like the pinned one, written to wheels/transformers-<version>-py3-none-any.whl
    under `out` (not part of the bundle build: for tests that build a bad image)."""
    rel = f"wheels/transformers-{version}-py3-none-any.whl"
    cached = _cached_pypi_wheel("transformers", version, os.path.basename(rel))
    _copy_if_changed(cached, os.path.join(out, rel))
    return rel


def fetch_wheelhouse(pins: dict) -> str:
    """The gateway's router (kunlun_stack_gateway_router) and all its dependency wheels for
    the gateway hosts' CPython and platform, downloaded once into the sim cache through the
    builder's own pip download (kept as a set: the same wheels on every later build): the
    directory (an index for the builder)."""
    from kunlun_fleet import bundle as product

    gw = pins["kunlun_stack_gateway_router"]
    py = str(gw["python"])
    tag = "cp" + py.replace(".", "")
    cache = os.path.join(CACHE_DIR, "wheelhouse", f"{gw['package']}-{gw['version']}-{tag}")

    def fill(tmp):
        ok, got = product.pip_download(
            [f"{gw['package']}=={gw['version']}"], tmp, py, product.manylinux_platforms(str(gw["platform"])), deps=True
        )
        if not ok:
            raise RuntimeError(
                f"could not download {gw['package']}=={gw['version']} and its dependencies "
                f"for CPython {py} into {tmp}: {got}"
            )
        return b""

    return cached_dir(cache, fill)


def cached_dir(cache: str, fill) -> str:
    """cache, filled once by fill(tmp) (which returns the .complete marker's content) into a
    partial directory then renamed into place: one download for builders running side by
    side (the suites' lanes), none once complete."""
    complete = os.path.join(cache, ".complete")
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    with open(cache + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(complete):
            tmp = cache + ".partial"
            shutil.rmtree(tmp, ignore_errors=True)
            marker = fill(tmp)
            _write(os.path.join(tmp, ".complete"), marker)
            shutil.rmtree(cache, ignore_errors=True)
            os.replace(tmp, cache)
    return cache


# --------------------------------------------------------------------------- debs
# The engine's offline install: the .debs of engine_bundle_packages and of everything they
# need that a minimal host lacks. "Minimal" is Debian's own: the packages debootstrap puts
# in a minbase root (the Priority: required set and apt, with their dependencies). apt works
# the closure out against a dpkg status holding exactly those packages and downloads it
# (--no-install-recommends, as the role installs), from the mirror the sim hosts use.
DEBS_ARCH = "amd64"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# Bump when the way the closure is worked out changes (the cache key).
DEBS_RECIPE = "1"


def engine_bundle_packages(path: str = ENGINE_DEFAULTS) -> list:
    """The packages the engine role expects from the bundle (read, never copied)."""
    with open(path, encoding="utf-8") as fh:
        return [str(p) for p in yaml.safe_load(fh)["engine_bundle_packages"]]


def debian_sources() -> list:
    """(mirror, suite) of the Debian archive the sim hosts' sources name."""
    from kunlun_fleet.sim.image import MIRROR, SECURITY_MIRROR, SUITE

    return [(MIRROR, SUITE), (MIRROR, SUITE + "-updates"), (SECURITY_MIRROR, SUITE + "-security")]


def debs_key(packages: list) -> str:
    data = json.dumps([sorted(packages), debian_sources(), DEBS_ARCH, DEBS_RECIPE])
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def debs_cache(packages: list = None) -> str:
    """The cache directory of the closure of `packages` (default: engine_bundle_packages)."""
    packages = engine_bundle_packages() if packages is None else packages
    return os.path.join(CACHE_DIR, "debs", debs_key(packages))


def _run(cmd: list, what: str, env: dict = None) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    except FileNotFoundError as exc:
        raise RuntimeError(
            f"{what}: {cmd[0]} is not installed ({exc}); on Debian: apt-get install "
            f"{'debootstrap' if 'debootstrap' in cmd[0] else 'apt'}"
        ) from exc
    if proc.returncode != 0:
        raise RuntimeError(
            f"{what} failed (rc={proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return proc.stdout


def _private_apt(work: str) -> dict:
    """An apt of its own under `work` (sources, lists, dpkg status, archives), apart from this
    machine's: the environment that points apt-get/apt-cache at it."""
    for sub in (
        "etc/apt.conf.d",
        "etc/preferences.d",
        "etc/sources.list.d",
        "state/lists/partial",
        "cache/archives/partial",
        "archives/partial",
    ):
        os.makedirs(os.path.join(work, sub), exist_ok=True)
    with open(os.path.join(work, "etc", "sources.list"), "w", encoding="utf-8") as fh:
        for mirror, suite in debian_sources():
            fh.write(f"deb [signed-by={DEBIAN_KEYRING}] {mirror} {suite} main\n")
    with open(os.path.join(work, "state", "status"), "w", encoding="utf-8"):
        pass
    conf = os.path.join(work, "apt.conf")
    with open(conf, "w", encoding="utf-8") as fh:
        fh.write(
            f'Dir::Etc "{work}/etc";\nDir::Etc::main "none";\nDir::Etc::parts "{work}/etc/apt.conf.d";\n'
            f'Dir::State "{work}/state";\nDir::State::status "{work}/state/status";\n'
            f'Dir::Cache "{work}/cache";\nDir::Cache::archives "{work}/archives";\n'
            f'APT::Architecture "{DEBS_ARCH}";\nAPT::Architectures {{ "{DEBS_ARCH}"; }};\n'
            'APT::Sandbox::User "root";\nDebug::NoLocking "true";\n'
        )
    return dict(os.environ, APT_CONFIG=conf, DEBIAN_FRONTEND="noninteractive", LC_ALL="C")


def minbase_packages(work: str) -> list:
    """The packages of a minimal Debian host: what `debootstrap --variant=minbase` installs."""
    from kunlun_fleet.sim.image import MIRROR, SUITE

    out = _run(
        [
            "debootstrap",
            "--print-debs",
            "--variant=minbase",
            f"--arch={DEBS_ARCH}",
            SUITE,
            os.path.join(work, "debootstrap"),
            MIRROR,
        ],
        "debootstrap --print-debs (the minbase set)",
    )
    names = sorted(set(out.split()))
    if "apt" not in names or "dpkg" not in names:
        raise RuntimeError(f"debootstrap --print-debs gave no minbase set: {out[-500:]!r}")
    return names


def status_for(stanzas: str) -> str:
    """A dpkg status file holding the packages of `stanzas` (apt-cache show output) as installed."""
    out = []
    for stanza in stanzas.strip().split("\n\n"):
        lines = [line for line in stanza.splitlines() if line.strip()]
        if not lines:
            continue
        if not lines[0].startswith("Package: "):
            raise ValueError(f"not a package stanza: {lines[0]!r}")
        out.append("\n".join(lines[:1] + ["Status: install ok installed"] + lines[1:]) + "\n")
    return "\n".join(out)


def download_debs(packages: list, dest: str, log=print) -> list:
    """Download the closure of `packages` for a minimal Debian host into `dest`; the files."""
    work = tempfile.mkdtemp(prefix="kf-debs-")
    try:
        env = _private_apt(work)
        _run(["apt-get", "-q", "update"], "apt-get update (the Debian mirror's package lists)", env)
        minbase = minbase_packages(work)
        stanzas = _run(["apt-cache", "show", "--no-all-versions"] + minbase, "apt-cache show (the minbase set)", env)
        with open(os.path.join(work, "state", "status"), "w", encoding="utf-8") as fh:
            fh.write(status_for(stanzas))
        _run(
            ["apt-get", "-q", "-y", "--download-only", "--no-install-recommends", "install"] + packages,
            "apt-get --download-only " + " ".join(packages),
            env,
        )
        files = sorted(glob.glob(os.path.join(work, "archives", "*.deb")))
        if not files:
            raise RuntimeError(f"apt-get downloaded nothing for {' '.join(packages)}")
        os.makedirs(dest, exist_ok=True)
        for path in files:
            shutil.move(path, os.path.join(dest, os.path.basename(path)))
        log(f"downloaded {len(files)} .debs for {' '.join(packages)} (a minbase host has {len(minbase)} packages)")
        return [os.path.join(dest, os.path.basename(p)) for p in files]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_debs(packages: list = None, log=print) -> str:
    """The cache directory holding the closure of `packages` (default: engine_bundle_packages),
    downloaded once (kept as a set: the same files on every later build, until the packages or
    the sources change; delete the directory to take newer ones)."""
    packages = engine_bundle_packages() if packages is None else packages

    def fill(tmp):
        download_debs(packages, tmp, log)
        return ("\n".join(packages) + "\n").encode()

    return cached_dir(debs_cache(packages), fill)


def fetch_debs(out: str, log=print, packages: list = None) -> list:
    """debs/ of the bundle: the cached closure (ensure_debs) copied in."""
    cache = ensure_debs(packages, log)
    written = []
    for name in sorted(os.listdir(cache)):
        if name.endswith(".deb"):
            _copy_if_changed(os.path.join(cache, name), os.path.join(out, "debs", name))
            written.append(f"debs/{name}")
    return written


def build_torch(pins: dict, vendor: str) -> str:
    path = os.path.join(vendor, TORCH_RUN)
    os.makedirs(vendor, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kf-torch-run-") as work:
        build_torch_run(path, work)
    return path


def build_vllm_kunlun(pins: dict, vendor: str) -> str:
    """The source tarball in git archive's form: the tree under one top-level directory, the
    commit in the pax global header (vllm_kunlun_tarball)."""
    comp = component(pins, "vllm_kunlun")
    src = os.path.join(ARTIFACTS, "vllm_kunlun_src")
    members = tree_files(src)
    data = vllm_kunlun_tarball(members, comp["commit"])
    path = os.path.join(vendor, f"vllm-kunlun-{comp['version']}-{comp['commit']}.tar.gz")
    _write(path, data)
    return path


def build_vllm_kunlun_variant(out: str, commit: str = "2fda97b", pins: dict = None) -> str:
    """The vllm-kunlun source tarball of another commit (VLLM_KUNLUN_VARIANTS), written to
    src/vllm-kunlun-<version>-<commit>.tar.gz under `out`; returns that relative path.

    The base tree (the pinned commit) with the variant's files laid over it and the pinned
    version and commit strings replaced by the variant's in every file, so the built
    package reports the variant everywhere (metadata, __commit__, _kunlun.version()), in
    git archive's form with the variant's commit in the pax header.
    Not part of the bundle build: for tests that build an image with a bad combination."""
    rel, data = vllm_kunlun_variant(commit)
    _write(os.path.join(out, rel), data)
    return rel


def vllm_kunlun_variant(commit: str) -> tuple:
    """(src/vllm-kunlun-<version>-<commit>.tar.gz, its bytes) of a variant commit (see
    build_vllm_kunlun_variant)."""
    if commit not in VLLM_KUNLUN_VARIANTS:
        raise ValueError(f"unknown vllm-kunlun variant {commit!r} (known: {sorted(VLLM_KUNLUN_VARIANTS)})")
    base = VLLM_KUNLUN_SRC  # the tree's own strings, whatever the pins say
    version = VLLM_KUNLUN_VARIANTS[commit]
    members = tree_files(os.path.join(ARTIFACTS, "vllm_kunlun_src"))
    members.update(tree_files(os.path.join(VARIANTS_DIR, commit)))
    for name, data in members.items():
        members[name] = data.replace(base["version"].encode(), version.encode()).replace(
            base["commit"].encode(), commit.encode()
        )
    return f"src/vllm-kunlun-{version}-{commit}.tar.gz", vllm_kunlun_tarball(members, commit)


def build_model(pins: dict, vendor: str) -> str:
    """The model directory and its sha256 manifest beside it, into `vendor`."""
    model = pins["kunlun_stack_model"]
    model_dir = os.path.join(vendor, model["directory"])
    if os.path.isdir(model_dir):
        shutil.rmtree(model_dir)
    model_mod.build_model_dir(model_dir, pins)
    _write(model_dir + ".sha256", model_mod.sha256_manifest(model_dir).encode())
    return model_dir


def xre_run(version: str) -> bytes:
    """The bytes of the kit's XRE installer of `version` (reproducible)."""
    spec = importlib.util.spec_from_file_location("kunlun_kit_xre", XRE_MODULE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with tempfile.TemporaryDirectory() as tmp:
        with open(mod.build_xre_run(version, Path(tmp)), "rb") as fh:
            return fh.read()


def build_driver(pins: dict, vendor: str):
    """The XRE installer from the kit helper's builder, when it exists."""
    if not os.path.exists(XRE_MODULE):
        return None, f"skipped the XRE installer: {XRE_MODULE} does not exist yet"
    spec = importlib.util.spec_from_file_location("kunlun_kit_xre", XRE_MODULE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    os.makedirs(vendor, exist_ok=True)
    return str(mod.build_xre_run(pins["kunlun_stack_driver"]["version"], vendor)), None


def build_base_image(pins: dict, out: str) -> str:
    """`docker save` of the base image, written to <out>/images/vllm-kunlun-exp-base.tar;
    returns that relative path.

    Made by kunlun_fleet/sim/base_image.py on the sim fleet's engine: the sim fleet's
    debootstrap root (Debian 12), this machine's CPython 3.10 at /opt/python3.10 with a venv
    at /opt/vllm_kunlun (no pip), uv and setuptools from PyPI, gcc and libc6-dev. Its Python
    is 3.10.x, not the pinned 3.10.19, or Debian's 3.11 where this machine has no 3.10 (see
    base_image.py and base_python.py).
    """
    from kunlun_fleet.sim import base_image
    from kunlun_fleet.sim.config import SimError

    try:
        # base_image.build takes the archive's place from the pins of old (the pins name no file now).
        return base_image.build(dict(pins, kunlun_stack_base_image_archive="images/" + BASE_ARCHIVE), out)
    except SimError as exc:
        raise RuntimeError(str(exc)) from exc


def stage_base_image(pins: dict, vendor: str) -> str:
    """The base image archive in `vendor`: saved once into the sim cache (base_image's own
    stamp), linked from there (copied across filesystems)."""
    cache = os.path.join(CACHE_DIR, "vendor-base")
    os.makedirs(cache, exist_ok=True)
    with open(cache + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # builders side by side save it once
        rel = build_base_image(pins, cache)
    dest = os.path.join(vendor, BASE_ARCHIVE)
    try:
        os.link(os.path.join(cache, rel), dest)
    except OSError:
        shutil.copyfile(os.path.join(cache, rel), dest)
    return dest


# --------------------------------------------------------------------------- manifest
def write_manifest(out: str) -> str:
    lines = []
    for root, dirs, names in os.walk(out):
        dirs.sort()
        for n in names:
            path = os.path.join(root, n)
            rel = os.path.relpath(path, out).replace(os.sep, "/")
            if rel == MANIFEST or n.endswith(".tmp"):
                continue
            lines.append((rel, sha256_file(path)))
    text = "".join(f"{digest}  {rel}\n" for rel, digest in sorted(lines))
    _write(os.path.join(out, MANIFEST), text.encode())
    return text


def verify(out: str) -> list:
    """Problems with the bundle at `out` (empty list: manifest matches every file)."""
    problems = []
    path = os.path.join(out, MANIFEST)
    if not os.path.exists(path):
        return [f"{MANIFEST} missing in {out}"]
    listed = set()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            digest, _, rel = line.rstrip("\n").partition("  ")
            listed.add(rel)
            file_path = os.path.join(out, rel)
            if not os.path.exists(file_path):
                problems.append(f"missing: {rel}")
            elif sha256_file(file_path) != digest:
                problems.append(f"checksum mismatch: {rel}")
    for root, _dirs, names in os.walk(out):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), out).replace(os.sep, "/")
            if rel != MANIFEST and rel not in listed:
                problems.append(f"not in manifest: {rel}")
    return problems


def _indexed(out: str, with_base_image: bool) -> bool:
    """bundle.yml maps every pin (the base image only when asked for)."""
    try:
        with open(os.path.join(out, "bundle.yml"), encoding="utf-8") as fh:
            entries = (yaml.safe_load(fh) or {}).get("artifacts") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return False
    from kunlun_fleet import bundle as product

    _, index, _ = product.module_utils()
    wanted = [k for k in index.expected(load_pins()) if with_base_image or k != "base_image"]
    return all(k in entries for k in wanted)


def make_vendor(pins: dict, work: str, with_base_image: bool = False, log=print) -> tuple:
    """The stand-in vendor directory and the find-links directories standing for the package
    index, under `work`: (vendor, [index dirs], notes)."""
    vendor, index = os.path.join(work, "vendor"), os.path.join(work, "index")
    notes = []
    build_small_wheels(pins, vendor)
    build_torch(pins, vendor)
    build_vllm_kunlun(pins, vendor)
    build_model(pins, vendor)
    _, note = build_driver(pins, vendor)
    if note:
        notes.append(note)
    fetch_debs(vendor, log)
    if with_base_image:
        stage_base_image(pins, vendor)
    build_vllm_wheel(pins, index)
    return vendor, [index, fetch_transformers(pins), fetch_wheelhouse(pins)], notes


# --------------------------------------------------------------------------- build
def build(out: str, force: bool = False, with_base_image: bool = False, log=print) -> dict:
    from kunlun_fleet import bundle as product

    out = os.path.abspath(out)
    pins = load_pins()
    digest = sources_hash()
    stamp = _stamp_path(out)
    if not force and os.path.exists(stamp):
        with open(stamp, encoding="utf-8") as fh:
            if fh.read().strip() == digest and not verify(out) and _indexed(out, with_base_image):
                log(f"bundle {out} is up to date (sources {digest[:12]})")
                return {"changed": False, "out": out, "sources": digest, "notes": []}
    os.makedirs(out, exist_ok=True)
    # The stand-in files of an older build go: the product's builder keeps a file that says it
    # is the pinned version (as a site's bundle rebuild should), and a stand-in changed under
    # the same version would otherwise stay stale. The large ones (the base image, the model)
    # are keyed by their own inputs.
    for small in ("wheels", "src", "torch", "drivers"):
        shutil.rmtree(os.path.join(out, small), ignore_errors=True)
    # The vendor's files beside the bundle (the same filesystem: the builder links them).
    work = tempfile.mkdtemp(prefix=".kf-sim-vendor-", dir=os.path.dirname(out))
    lines = []
    try:
        vendor, links, notes = make_vendor(pins, work, with_base_image, log)
        rc, builder = product.build(
            out,
            vendor=vendor,
            find_links=links,
            no_index=True,
            pins=product.load_pins(SIM_INVENTORY, stack=load_pins()["kunlun_stack_stack"]),
            no_base_image=not with_base_image,
            log=lines.append,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if rc != product.OK:
        raise RuntimeError(
            "`kunlun-fleet bundle build` refused the stand-in bundle (exit %d):\n%s" % (rc, "\n".join(lines))
        )
    os.makedirs(os.path.dirname(stamp), exist_ok=True)
    _write(stamp, (digest + "\n").encode())
    for n in notes:
        log(f"note: {n}")
    files = product.bundle_files(out)
    log(f"bundle written to {out} by kunlun-fleet bundle build ({len(files)} files, sources {digest[:12]})")
    return {"changed": True, "out": out, "sources": digest, "notes": notes, "files": files}


# --------------------------------------------------------------------------- per-stack bundles
def stack_pins(commit: str, pins: dict = None) -> dict:
    """The pins of a stack that differs from `pins` (default: the sim inventory's) only in
    vllm-kunlun's source: commit `commit`, at its variant's version (VLLM_KUNLUN_VARIANTS)."""
    from kunlun_fleet import bundle as product

    if commit not in VLLM_KUNLUN_VARIANTS:
        raise ValueError(f"unknown vllm-kunlun variant {commit!r} (known: {sorted(VLLM_KUNLUN_VARIANTS)})")
    pins = copy.deepcopy(
        pins if pins is not None else product.load_pins(SIM_INVENTORY, stack=load_pins()["kunlun_stack_stack"])
    )
    comp = dict(component(pins, "vllm_kunlun"), commit=commit, version=VLLM_KUNLUN_VARIANTS[commit])
    comp.pop("sha256", None)
    pins["kunlun_stack_components"] = dict(pins["kunlun_stack_components"], vllm_kunlun=comp)
    return pins


STACK_BUNDLES = os.path.join(SIM_HOME, "bundles")


def build_site_stack_bundles(base_bundle: str, inventory: str = None, out_root: str = STACK_BUNDLES, log=print) -> list:
    """A bundle for each of the sim inventory's site stacks (kunlun_stack_site_stacks) whose
    vllm-kunlun commit is a variant or whose XRE driver is another version, at
    <out_root>/<stack name> - where the sim inventory's kunlun_stack_bundle_dir points for that
    stack. Returns build_stack_bundle's results."""
    from kunlun_fleet import bundle as product

    inventory = inventory or SIM_INVENTORY
    results = []
    base_pins = product.load_pins(inventory)
    base_driver = str(base_pins["kunlun_stack_driver"]["version"])
    for name in sorted(base_pins.get("kunlun_stack_site_stacks") or {}):
        pins = product.load_pins(inventory, stack=name)
        commit = str(component(pins, "vllm_kunlun").get("commit"))
        if commit in VLLM_KUNLUN_VARIANTS or str(pins["kunlun_stack_driver"]["version"]) != base_driver:
            results.append(build_stack_bundle(base_bundle, os.path.join(out_root, name), commit, pins=pins, log=log))
    return results


def build_stack_bundle(base_bundle: str, out: str, commit: str, pins: dict = None, log=print) -> dict:
    """A complete offline bundle at `out` for a stack that differs from the built sim bundle
    `base_bundle` only in vllm-kunlun's source commit (a variant: VLLM_KUNLUN_VARIANTS) and/or
    in the XRE driver's version (the kit's installer of the pins' version takes the base's
    installer's place).

    Every file of the base bundle's MANIFEST.sha256 is hardlinked into `out` (copied when
    the link fails: another filesystem), except the base's vllm-kunlun tarball; the
    variant's tarball (vllm_kunlun_variant) takes its place in src/; then the product's own
    builder (`kunlun-fleet bundle build OUT --vendor OUT --no-index`: kunlun_fleet.bundle.build,
    the bundle indexed in place) checks every file against the stack's pins and writes
    bundle.yml and MANIFEST.sha256. `pins`: the stack's (their vllm_kunlun commit must be
    `commit`); default stack_pins(commit), the sim inventory's with that commit.
    Idempotent: a second call with the same inputs changes no file. Files in `out` that are
    not the stack bundle's (an earlier variant's tarball) are removed.
    Returns {"changed": bool, "out", "commit", "source": the tarball's path in the bundle,
    "files": what changed}; raises RuntimeError when the builder refuses the bundle."""
    from kunlun_fleet import bundle as product

    base, out = os.path.abspath(base_bundle), os.path.abspath(out)
    if base == out:
        raise ValueError("the stack bundle needs a directory of its own, not the base bundle's")
    pins = pins if pins is not None else stack_pins(commit)
    if str(component(pins, "vllm_kunlun").get("commit")) != commit:
        raise ValueError(f"the pins name vllm-kunlun {component(pins, 'vllm_kunlun').get('commit')}, not {commit}")
    _, index_mod, manifest_mod = product.module_utils()
    try:
        listed = manifest_mod.read_manifest(base)
        with open(os.path.join(base, index_mod.INDEX), encoding="utf-8") as fh:
            base_index = (yaml.safe_load(fh) or {}).get("artifacts") or {}
    except (OSError, ValueError, yaml.YAMLError, AttributeError) as exc:
        raise ValueError(f"{base} is not a built bundle (bundle.yml and {MANIFEST}): {exc}") from exc
    base_source = (base_index.get("vllm_kunlun") or {}).get("path")
    replaced = {}  # bundle path -> bytes, in the place of a base file
    if commit in VLLM_KUNLUN_VARIANTS:
        rel_source, data = vllm_kunlun_variant(commit)
        replaced[rel_source] = data
    else:
        rel_source, base_source = base_source, None
    base_driver = (base_index.get("driver") or {}).get("path")
    version = str(pins["kunlun_stack_driver"]["version"])
    if base_driver and not os.path.basename(base_driver).endswith("-%s.run" % version):
        replaced[posixpath.join(posixpath.dirname(base_driver), "xre-Linux-x86_64-%s.run" % version)] = xre_run(version)
    else:
        base_driver = None
    changed = []
    dropped = {base_source, base_driver} - {None}
    wanted = {rel for rel in listed if rel not in dropped} | set(replaced) | {index_mod.INDEX, MANIFEST}
    if os.path.isdir(out) and os.listdir(out) and not os.path.exists(os.path.join(out, MANIFEST)):
        raise ValueError(f"{out} holds files and no {MANIFEST}: not a bundle this would replace")
    os.makedirs(out, exist_ok=True)
    sums = manifest_mod.SumCache(None)
    # The previous index and manifest, on a first build: the builder takes the index pins'
    # wheels again from them without pip (they are rewritten, never edited in place).
    for rel in sorted(listed) + [index_mod.INDEX, MANIFEST]:
        if rel in dropped or (rel in (index_mod.INDEX, MANIFEST) and os.path.exists(os.path.join(out, rel))):
            continue
        # The product builder's own placement: left alone when the same, else a hardlink or a copy.
        if product.place(os.path.join(base, rel), os.path.join(out, rel), sums):
            changed.append(rel)
    for rel, data in sorted(replaced.items()):
        path = os.path.join(out, rel)
        if not os.path.exists(path) or sha256_file(path) != hashlib.sha256(data).hexdigest():
            _write(path, data)
            changed.append(rel)
    for root, _dirs, names in os.walk(out, topdown=False):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), out).replace(os.sep, "/")
            if rel not in wanted:
                os.remove(os.path.join(root, name))
                changed.append(rel)
        if root != out and not os.listdir(root):
            os.rmdir(root)
    lines = []
    rc, builder = product.build(
        out,
        vendor=out,
        no_index=True,
        pins=pins,
        no_base_image="base_image" not in base_index,
        log=lines.append,
    )
    if rc != product.OK:
        raise RuntimeError(
            "`kunlun-fleet bundle build` refused the stack bundle of vllm-kunlun %s (exit %d):\n%s"
            % (commit, rc, "\n".join(lines))
        )
    changed += builder.changed + builder.removed
    log(
        f"stack bundle {out}: the bundle {base} with vllm-kunlun {commit} ({rel_source}), XRE {version}; "
        + (f"{len(changed)} file(s) written or removed" if changed else "up to date")
    )
    return {"changed": bool(changed), "out": out, "commit": commit, "source": rel_source, "files": changed}


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    b = sub.add_parser("build", help="build (or refresh) the stand-in bundle")
    b.add_argument(
        "--out", default=os.path.join(SIM_HOME, "bundle"), help="bundle directory (default: $KUNLUN_SIM_HOME/bundle)"
    )
    b.add_argument("--force", action="store_true", help="rebuild even when up to date")
    b.add_argument(
        "--with-base-image", action="store_true", help="also write images/vllm-kunlun-exp-base.tar (build_base_image)"
    )
    v = sub.add_parser("verify", help="check every file against MANIFEST.sha256")
    v.add_argument("--out", default=os.path.join(SIM_HOME, "bundle"))
    s = sub.add_parser("stack", help="a bundle for a stack that differs from a built one only in vllm-kunlun's commit")
    s.add_argument("--stack-commit", required=True, choices=sorted(VLLM_KUNLUN_VARIANTS), help="vllm-kunlun commit")
    s.add_argument("--base", required=True, help="the built sim bundle it differs from")
    s.add_argument("out", help="the stack bundle's directory")


def run(args) -> int:
    if args.action == "stack":
        try:
            build_stack_bundle(args.base, args.out, args.stack_commit)
        except (ValueError, OSError, RuntimeError) as exc:
            print(f"ERROR: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.action == "build":
        try:
            build(args.out, force=args.force, with_base_image=args.with_base_image)
        except (NotImplementedError, RuntimeError) as exc:
            print(f"ERROR: {exc}", file=sys.stderr)
            return 1
        return 0
    problems = verify(args.out)
    for p in problems:
        print(p)
    print("OK" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


def register(subparsers) -> None:
    """`kunlun-fleet sim-bundle build|verify ...` for the project's CLI."""
    p = subparsers.add_parser("sim-bundle", help="build or verify the simulated fleet's offline bundle")
    _add_arguments(p)
    p.set_defaults(func=run)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kunlun_fleet.sim.bundle", description=__doc__.split("\n")[0])
    _add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
