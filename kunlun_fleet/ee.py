"""The execution environment (EE) for AWX / Ansible Automation Platform: build it, and the
ansible-navigator command that runs a playbook in it.

    .venv/bin/python -m kunlun_fleet.ee build [--rootfs IMAGE]   # make ee; prints the tag
    .venv/bin/python -m kunlun_fleet.ee command -i INVENTORY site.yml [ARGS...]

The build, in three steps, each skipped when its inputs are unchanged (tags are hashes):
1. the base image (ee/base.Containerfile): a Debian 12 root file system plus python3, pip
   and an SSH client from Debian. The root file system is ``--rootfs`` (any Debian 12
   image an operator's registry holds) or, by default, the Debian 12 tree debootstrap
   made for the sim fleet, imported into the engine (no image registry is reachable here);
2. the wheelhouse: every Python package the EE installs, pinned, downloaded from the
   package index once per set of pins into the cache directory (KUNLUN_FLEET_CACHE, default
   the sim's $KUNLUN_SIM_HOME/cache; docs/testing.md, "Caches"), then linked into
   .cache/ee/wheels, where execution-environment.yml takes it (ansible-builder's build then
   needs no index). Only fetched when the image must be built;
3. ``ansible-builder build`` of execution-environment.yml on that base.

The Docker engine is the one DOCKER_HOST names; when it is unset and the sim fleet's engine
runs, that one (the only engine on a CI machine).
"""

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EE_FILE = os.path.join(ROOT, "execution-environment.yml")
BASE_CONTAINERFILE = os.path.join(ROOT, "ee", "base.Containerfile")
REQUIREMENTS = os.path.join(ROOT, "ee", "requirements.txt")
COLLECTIONS = os.path.join(ROOT, "ee", "collections.txt")
CACHE = os.path.join(ROOT, ".cache", "ee")
WHEELS = os.path.join(CACHE, "wheels")
CONTEXT = os.path.join(CACHE, "context")
IMAGE_REPO = "kunlun-fleet/ee"
BASE_REPO = "kunlun-fleet/ee-base"
# What ansible-builder's builder stage installs before it reads the requirements
# (`pip install bindep pyyaml packaging`): in the wheelhouse too, pinned as the controller's.
BUILDER_STAGE = ["bindep", "pyyaml", "packaging"]


class EEError(Exception):
    pass


def docker_env():
    env = dict(os.environ)
    if not env.get("DOCKER_HOST"):
        from kunlun_fleet.sim.config import DOCKER_API_VERSION, DOCKER_HOST, DOCKER_SOCK

        if os.path.exists(DOCKER_SOCK):
            env["DOCKER_HOST"] = DOCKER_HOST
            env["DOCKER_API_VERSION"] = DOCKER_API_VERSION
    return env


def _run(cmd, env, what, timeout=1800):
    proc = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=timeout)
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-4000:]
        raise EEError("%s failed (rc %d): %s\n%s" % (what, proc.returncode, shlex.join(cmd), output))
    return proc.stdout


def _image_exists(ref, env):
    return subprocess.run(["docker", "image", "inspect", ref], env=env, capture_output=True).returncode == 0


def _image_id(ref, env):
    return _run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], env, "docker image inspect").strip()


def definition():
    with open(EE_FILE) as fh:
        return yaml.safe_load(fh)


def pins(path):
    """{normalized name: version} of a pip requirements file's `name==version` lines."""
    found = {}
    with open(path) as fh:
        for line in fh:
            m = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==([^\s;#]+)", line.strip())
            if m:
                found[re.sub(r"[-_.]+", "-", m.group(1).split("[")[0]).lower()] = m.group(2)
    return found


def requirement_lines():
    """Every package the EE build installs, pinned: the definition's ansible-core,
    ansible-runner and init (dumb-init), ee/requirements.txt, ee/collections.txt, and the
    builder stage's own tools (at the pins of the controller's requirements.txt)."""
    deps = definition()["dependencies"]
    lines = [deps["ansible_core"]["package_pip"], deps["ansible_runner"]["package_pip"]]
    lines.append(definition()["options"]["container_init"]["package_pip"])
    for path in (REQUIREMENTS, COLLECTIONS):
        with open(path) as fh:
            lines += [ln.strip() for ln in fh if ln.strip() and not ln.lstrip().startswith("#")]
    controller = pins(os.path.join(ROOT, "requirements.txt"))
    for name in BUILDER_STAGE:
        if name not in controller:
            raise EEError("requirements.txt pins no %s (ansible-builder's builder stage installs it)" % name)
        lines.append("%s==%s" % (name, controller[name]))
    return sorted(set(lines))


def wheelhouse_key(lines=None, python=None, machine=None):
    """Hash of the wheelhouse's inputs: the pinned lines (requirement_lines) and the
    interpreter and machine pip downloads for (this one's: binary wheels only)."""
    lines = requirement_lines() if lines is None else lines
    python = python or "%d.%d" % sys.version_info[:2]
    machine = machine or os.uname().machine
    return hashlib.sha256(("\n".join(sorted(lines)) + "\0%s\0%s" % (python, machine)).encode()).hexdigest()[:16]


def wheel_cache():
    """Where downloaded wheelhouses are kept: the test fleet's cache directory
    (kunlun_fleet.sim.config.CACHE_DIR) where it exists and this user may write it, as the
    Makefile decides; else the checkout's .cache/ee (an operator's `make ee`)."""
    from kunlun_fleet.sim.config import CACHE_DIR

    shared = os.path.isdir(CACHE_DIR) and os.access(CACHE_DIR, os.W_OK)
    return os.path.join(CACHE_DIR if shared else CACHE, "ee-wheels")


def wheelhouse():
    """The pinned wheels (binary only, for this machine's Python 3.11 and glibc, which
    Debian 12's match) in WHEELS: downloaded once per wheelhouse_key into wheel_cache(),
    then hardlinked (copied across file systems) into WHEELS, which then holds that set only."""
    lines = requirement_lines()
    cached = os.path.join(wheel_cache(), wheelhouse_key(lines))
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    with open(cached + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # builds from two checkouts download it once
        if not os.path.exists(os.path.join(cached, ".complete")):
            partial = cached + ".partial"
            shutil.rmtree(partial, ignore_errors=True)
            os.makedirs(partial)
            req = os.path.join(partial, ".requirements")
            with open(req, "w") as fh:
                fh.write("\n".join(lines) + "\n")
            _run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", partial, "-r", req],
                dict(os.environ),
                "pip download of the EE's wheels",
            )
            open(os.path.join(partial, ".complete"), "w").close()
            shutil.rmtree(cached, ignore_errors=True)
            os.rename(partial, cached)
    os.makedirs(WHEELS, exist_ok=True)
    for name in os.listdir(WHEELS):
        os.unlink(os.path.join(WHEELS, name))
    for name in os.listdir(cached):
        if name.endswith(".whl"):
            try:
                os.link(os.path.join(cached, name), os.path.join(WHEELS, name))
            except OSError:
                shutil.copyfile(os.path.join(cached, name), os.path.join(WHEELS, name))
    return WHEELS


def base_image(rootfs, env):
    """The base image on ``rootfs`` (an image reference), tagged by its inputs."""
    if rootfs is None:
        from kunlun_fleet.sim.config import DOCKER_HOST

        if env.get("DOCKER_HOST") != DOCKER_HOST:
            raise EEError(
                "no root file system given: the debootstrap tree is imported into the sim fleet's engine only, "
                "and DOCKER_HOST names another (%s). Fix: --rootfs IMAGE (make ee EE_ROOTFS=IMAGE), a Debian 12 "
                "image your engine has, for example debian:12" % (env.get("DOCKER_HOST") or "the default engine")
            )
        from kunlun_fleet.sim.base_image import rootfs_image

        rootfs = rootfs_image()
    h = hashlib.sha256()
    h.update(_image_id(rootfs, env).encode())
    with open(BASE_CONTAINERFILE, "rb") as fh:
        h.update(fh.read())
    tag = "%s:%s" % (BASE_REPO, h.hexdigest()[:16])
    if not _image_exists(tag, env):
        _run(
            ["docker", "build", "-q", "-f", BASE_CONTAINERFILE, "--build-arg", "ROOTFS=" + rootfs, "-t", tag]
            + [os.path.join(ROOT, "ee")],
            env,
            "the EE base image's build",
        )
    return tag


def image_key(base_id):
    """Hash of the EE image's inputs: its base image's id, the definition, the requirement
    and collection files, and every pinned line the build installs."""
    h = hashlib.sha256(base_id.encode())
    for path in (EE_FILE, REQUIREMENTS, COLLECTIONS):
        with open(path, "rb") as fh:
            h.update(fh.read())
    h.update("\n".join(requirement_lines()).encode())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _locked():
    """One build at a time (a test fixture may start one while `make ee` runs)."""
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, "lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build(rootfs=None, log=print):
    """Build the EE unless an image of the same inputs exists; returns its tag (also
    tagged kunlun-fleet/ee:latest, the name execution-environment.yml gives it)."""
    env = docker_env()
    with _locked():
        base = base_image(rootfs, env)
        tag = "%s:%s" % (IMAGE_REPO, image_key(_image_id(base, env)))
        if _image_exists(tag, env):
            log("execution environment %s is up to date" % tag)
        else:
            log("building the execution environment %s on %s" % (tag, base))
            wheelhouse()
            _run(
                [
                    os.path.join(os.path.dirname(sys.executable), "ansible-builder"),
                    "build",
                    "--file",
                    EE_FILE,
                    "--context",
                    CONTEXT,
                    "--container-runtime",
                    "docker",
                    "--build-arg",
                    "EE_BASE_IMAGE=" + base,
                    "--tag",
                    tag,
                    "--verbosity",
                    "2",
                ],
                env,
                "ansible-builder build",
                timeout=3600,
            )
        _run(["docker", "tag", tag, IMAGE_REPO + ":latest"], env, "docker tag")
        return tag


def navigator_command(image, playbook, inventory, extra=(), mounts=(), container_options=(), pass_env=()):
    """The ansible-navigator command line that runs ``playbook`` in the EE ``image`` with
    the project's own settings (ansible-navigator.yml: stdout, no artifact, Docker).
    ``mounts`` (host paths) appear in the container at the same path: files the inventory
    names outside the project (an SSH key, a bundle)."""
    cmd = [
        os.path.join(os.path.dirname(sys.executable), "ansible-navigator"),
        "run",
        playbook,
        "--execution-environment-image",
        image,
        "--pull-policy",
        "never",
        "-i",
        inventory,
    ]
    for path in mounts:
        cmd += ["--execution-environment-volume-mounts", "%s:%s" % (path, path)]
    for opt in container_options:
        cmd += ["--container-options=" + opt]
    for name in pass_env:
        cmd += ["--pass-environment-variable", name]
    return cmd + list(extra)


# ansible-runner's mark of each event in a container's output: an escape sequence that
# erases itself on a terminal (ESC[K, base64 event data, ESC[<n>D), then ESC[K.
_EVENT_MARK = re.compile(r"\x1b\[K[A-Za-z0-9+/=]*\x1b\[\d+D|\x1b\[K")


def plain_output(text):
    """ansible-navigator's stdout as ansible-playbook prints it (the event marks gone)."""
    return _EVENT_MARK.sub("", text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    b = sub.add_parser("build", help="build the execution environment, print its tag")
    b.add_argument("--rootfs", help="a Debian 12 image to build on (default: the debootstrap tree, imported)")
    c = sub.add_parser("command", help="print the ansible-navigator command for a playbook")
    c.add_argument("-i", "--inventory", required=True)
    c.add_argument("--image", default=IMAGE_REPO + ":latest")
    c.add_argument("playbook")
    c.add_argument("args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    try:
        if args.what == "build":
            print(build(args.rootfs, log=lambda msg: print(msg, file=sys.stderr)))
        else:
            print(shlex.join(navigator_command(args.image, args.playbook, args.inventory, args.args)))
    except EEError as exc:
        print("kunlun_fleet.ee: %s" % exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
