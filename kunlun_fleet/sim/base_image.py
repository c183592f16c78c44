"""The stand-in for the vendor's base image `docker.int.aoripus.com/vllm-kunlun-exp:base`.

What the real one holds and the product relies on: a CPython 3.10 venv at /opt/vllm_kunlun
with no pip in it, `uv` on PATH, and what vllm-kunlun's `setup.py build` needs (gcc, the
Python 3.10 headers, setuptools in the venv). This builds that, saves it with `docker save`
into the bundle (`images/vllm-kunlun-exp-base.tar`): the sim hosts' engines reach no
registry, so the bundle archive is their route in, exactly as for an offline site.

How, on this machine:
- the root filesystem is the sim fleet's cached debootstrap tarball (Debian 12), reused
  through ``image._debootstrap_tarball()`` and imported with ``docker import``;
- Debian 12 ships Python 3.11 and no 3.10, and no Ubuntu archive key is available to
  debootstrap an Ubuntu release here, while the vendor's torch installer and wheels are
  cp310: the interpreter is this machine's CPython 3.10 build (pyenv, the one the tests use),
  copied to /opt/python3.10. It is 3.10.x, NOT the pinned 3.10.19: a known difference of
  the stand-in (the sim inventory sets image_proof_python_match: minor). A machine with no
  CPython 3.10 (a bare Debian 12 one) gets the fallback instead, Debian's python3.11 from
  the mirror: base_python.py decides which and lists what then differs;
- gcc and libc6-dev come from the Debian mirror (plain HTTP) in a `docker build` step;
- uv and setuptools are the real wheels from PyPI (cached in the cache directory, config.CACHE_DIR: wheels/).
The build runs on the sim fleet's own engine. It is skipped when its inputs are unchanged.
"""

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

from . import base_python
from . import image as sim_image
from .config import BUILD_DIR, CACHE_DIR, SimError, log
from .engine import docker, docker_cli, docker_env, engine_answers

WHEEL_CACHE = os.path.join(CACHE_DIR, "wheels")
# Real wheels from PyPI, pinned for a reproducible stand-in.
UV_VERSION = "0.9.30"
SETUPTOOLS_VERSION = "65.5.0"  # the one CPython 3.10's ensurepip bundles; `setup.py install` works
# vllm 0.15.1 imports yaml at the start of every entry point (vllm/utils/argparse_utils.py,
# which reads --config files) and declares pyyaml among its requirements; the image installs
# vllm --no-deps, so the vendor's base image carries it. So does this one (the stand-in's
# --config reads it the same way).
PYYAML_VERSION = "6.0.2"
ROOTFS_REPO = "kunlun-fleet/sim-base-rootfs"
KEY_LABEL = "org.kunlun-fleet.sim-base-key"
VENV = "/opt/vllm_kunlun"
PY_PREFIX = "/opt/python3.10"
APT_PACKAGES = [
    "gcc",
    "libc6-dev",
    "libssl3",
    "libffi8",
    "libsqlite3-0",
    "libbz2-1.0",
    "liblzma5",
    "libreadline8",
    "libncursesw6",
    "zlib1g",
    "libexpat1",
    "libuuid1",
    "ca-certificates",
]

DOCKERFILE = """\
FROM {rootfs}
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {apt} \\
 && apt-get clean && rm -rf /var/lib/apt/lists/*
{python_steps}COPY uv uvx /usr/local/bin/
COPY {setuptools} {pyyaml} /tmp/
RUN {python} -m venv --without-pip {venv} \\
 && uv pip install --python {venv}/bin/python --offline --no-deps /tmp/{setuptools} /tmp/{pyyaml} \\
 && rm /tmp/{setuptools} /tmp/{pyyaml} \\
 && test ! -e {venv}/bin/pip \\
 && {venv}/bin/python -c 'import ssl, ctypes, zlib, sysconfig, os.path as p; \\
      assert p.exists(p.join(sysconfig.get_paths()["include"], "Python.h"))'
ENV PATH={venv}/bin:$PATH
LABEL {label}="{key}"
CMD ["/bin/bash"]
"""
# The vendor's CPython 3.10: this machine's build, copied in, found at its own prefix too.
PYTHON310_STEPS = """\
ADD python310.tar /
RUN mkdir -p "$(dirname {orig_prefix})" && ln -s {prefix} {orig_prefix} \\
 && echo {prefix}/lib > /etc/ld.so.conf.d/python3.10.conf && ldconfig
"""


def _wheel(name, version):
    """A real wheel from PyPI, downloaded once into the sim cache."""
    os.makedirs(WHEEL_CACHE, exist_ok=True)
    found = glob.glob(os.path.join(WHEEL_CACHE, "%s-%s-*.whl" % (name, version)))
    if not found:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--platform",
            "manylinux_2_17_x86_64",
            "--python-version",
            "3.10",
            "-d",
            WHEEL_CACHE,
            "%s==%s" % (name, version),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = glob.glob(os.path.join(WHEEL_CACHE, "%s-%s-*.whl" % (name, version)))
        if proc.returncode != 0 or not found:
            raise SimError(
                "could not download %s==%s from PyPI into %s:\n%s%s"
                % (name, version, WHEEL_CACHE, proc.stdout[-1500:], proc.stderr[-1500:])
            )
    return sorted(found)[0]


def base_key(profile):
    """The hash of the base image's inputs; `profile` is base_python.resolve()'s."""
    h = hashlib.sha256()
    for path in (os.path.abspath(__file__), base_python.__file__):
        with open(path, "rb") as fh:
            h.update(hashlib.sha256(fh.read()).digest())
    h.update(sim_image.rootfs_key().encode())
    h.update(
        (
            "%s|%s|%s|%s|%s" % (profile["kind"], UV_VERSION, SETUPTOOLS_VERSION, PYYAML_VERSION, ",".join(APT_PACKAGES))
        ).encode()
    )
    if profile["prefix"]:
        h.update(profile["prefix"].encode())
        out = subprocess.run(
            [
                os.path.join(profile["prefix"], "bin", "python3.10"),
                "-c",
                "import platform; print(platform.python_version())",
            ],
            capture_output=True,
            text=True,
        )
        h.update(out.stdout.encode())
    return h.hexdigest()[:16]


def _python_tar(py_prefix, dest):
    """The 3.10 installation as a tar rooted at /opt/python3.10, without its test suite and
    its static libpython (for embedding; extensions link against nothing on Linux)."""
    skip = (
        os.sep + os.path.join("lib", "python3.10", "test"),
        os.sep + os.path.join("lib", "python3.10", "site-packages"),
    )

    def keep(info):
        rel = "/" + info.name.split("/", 2)[-1] if info.name.count("/") >= 2 else ""
        if any(rel == s or rel.startswith(s + "/") for s in skip) or "__pycache__" in info.name:
            return None
        if info.name.endswith(".a") and os.path.basename(info.name).startswith("libpython"):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(dest, "w") as tar:
        tar.add(py_prefix, arcname=PY_PREFIX.lstrip("/"), filter=keep)
        site = tarfile.TarInfo(PY_PREFIX.lstrip("/") + "/lib/python3.10/site-packages")
        site.type = tarfile.DIRTYPE
        site.mode = 0o755
        tar.addfile(site)


def _image_key(ref):
    proc = docker("image", "inspect", "--format", '{{ index .Config.Labels "%s" }}' % KEY_LABEL, ref, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def rootfs_image():
    """The debootstrap root file system (Debian 12) as an image on the sim engine, imported
    once per set of inputs: the FROM of this base image and of the execution environment's
    (kunlun_fleet/ee.py)."""
    rootfs = "%s:%s" % (ROOTFS_REPO, sim_image.rootfs_key())
    if docker("image", "inspect", rootfs, check=False).returncode != 0:
        tarball = sim_image._debootstrap_tarball()
        log("importing %s as %s" % (tarball, rootfs))
        with open(tarball, "rb") as fh:
            proc = subprocess.run(
                [docker_cli(), "import", "-", rootfs], stdin=fh, capture_output=True, text=True, env=docker_env()
            )
        if proc.returncode != 0:
            raise SimError("docker import of %s failed: %s" % (tarball, proc.stderr))
    return rootfs


def build(pins, out, log=log):
    """Write out/<kunlun_stack_base_image_archive>; return its relative path."""
    rel = pins["kunlun_stack_base_image_archive"]
    name = pins["kunlun_stack_base_image"]
    dest = os.path.join(out, rel)
    profile = base_python.resolve()
    key = base_key(profile)
    stamp = os.path.join(
        CACHE_DIR, "base-image-stamps", hashlib.sha256(os.path.abspath(dest).encode()).hexdigest()[:16]
    )
    if os.path.exists(dest) and os.path.exists(stamp):
        with open(stamp) as fh:
            if fh.read().split() == [key, str(os.path.getsize(dest))]:
                log("base image archive %s is up to date (key %s)" % (rel, key))
                return rel
    if not engine_answers():
        raise SimError(
            "the sim fleet's Docker engine is not running; it builds the base image. "
            "Fix: `kunlun-fleet sim-up 0` (or sim-up N) first"
        )
    if _image_key(name) != key:
        rootfs = rootfs_image()
        uv_whl = _wheel("uv", UV_VERSION)
        st_whl = _wheel("setuptools", SETUPTOOLS_VERSION)
        yaml_whl = _wheel("PyYAML", PYYAML_VERSION)
        os.makedirs(BUILD_DIR, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="base-image-", dir=BUILD_DIR) as ctx:
            with zipfile.ZipFile(uv_whl) as zf:
                for member in zf.namelist():
                    base = os.path.basename(member)
                    if "/scripts/" in member and base in ("uv", "uvx"):
                        with zf.open(member) as src, open(os.path.join(ctx, base), "wb") as dst:
                            shutil.copyfileobj(src, dst)
                        os.chmod(os.path.join(ctx, base), 0o755)
            if not os.path.exists(os.path.join(ctx, "uv")):
                raise SimError("%s holds no uv binary" % uv_whl)
            shutil.copy(st_whl, ctx)
            shutil.copy(yaml_whl, ctx)
            if profile["prefix"]:
                _python_tar(profile["prefix"], os.path.join(ctx, "python310.tar"))
                apt = APT_PACKAGES
                python_steps = PYTHON310_STEPS.format(prefix=PY_PREFIX, orig_prefix=profile["prefix"])
                python = PY_PREFIX + "/bin/python3.10"
            else:
                apt = APT_PACKAGES + profile["apt"]
                python_steps = ""
                python = "/usr/bin/python" + profile["minor"]
            with open(os.path.join(ctx, "Dockerfile"), "w") as fh:
                fh.write(
                    DOCKERFILE.format(
                        rootfs=rootfs,
                        apt=" ".join(apt),
                        python_steps=python_steps,
                        python=python,
                        venv=VENV,
                        setuptools=os.path.basename(st_whl),
                        pyyaml=os.path.basename(yaml_whl),
                        label=KEY_LABEL,
                        key=key,
                    )
                )
            log(
                "building %s (key %s, Python %s: %s) on the sim engine" % (name, key, profile["minor"], profile["kind"])
            )
            env = dict(docker_env(), DOCKER_BUILDKIT="0")
            proc = subprocess.run(
                [docker_cli(), "build", "--network", "host", "-t", name, ctx], capture_output=True, text=True, env=env
            )
            if proc.returncode != 0:
                raise SimError("building the base image failed:\n%s%s" % (proc.stdout[-3000:], proc.stderr[-3000:]))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    docker("save", "-o", dest + ".tmp", name, timeout=1800)
    os.chmod(dest + ".tmp", 0o644)
    os.replace(dest + ".tmp", dest)
    os.makedirs(os.path.dirname(stamp), exist_ok=True)
    with open(stamp, "w") as fh:
        fh.write("%s %d\n" % (key, os.path.getsize(dest)))
    log("base image %s saved to %s (%d MiB)" % (name, rel, os.path.getsize(dest) >> 20))
    return rel
