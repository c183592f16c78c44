"""The sim-host image: a Debian 12 root filesystem made with debootstrap (no image
registry is reachable), the hardware kit from ``kit/rootfs`` copied in, imported with
``tar | docker import``. Tagged by a hash of every input (image_key), so unchanged inputs
are not rebuilt; the debootstrap tarball is kept in the cache directory (config.CACHE_DIR)
under its own, smaller set of inputs (rootfs_key).

The machine's CA certificates are NOT baked in: the product has one documented way to
trust extra CAs (the ca_trust_ role, fed by ``ca_trust_certificates`` in the sim
inventory), and the sim fleet uses that same way.
"""

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import time

from .config import BUILD_DIR, CACHE_DIR, DOCKER_HOST, KIT_ROOTFS, SimError, log, run
from .engine import docker, docker_cli, docker_env

IMAGE_REPO = "kunlun-fleet/sim-host"
SUITE = "bookworm"
VARIANT = "minbase"
# The machine's apt sources name this mirror; containers reach it over plain HTTP.
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
# Lean on purpose: what a freshly installed server has that the product relies on,
# plus what the kit's programs need (python3, util-linux/mount for loop devices).
PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "sudo",
    "lvm2",
    "xfsprogs",
    "e2fsprogs",
    "util-linux",
    "mount",
    "kmod",
    "acl",
    "attr",
    "rsync",
    "iproute2",
    "procps",
    "ca-certificates",
    "curl",
    "make",
    "netbase",
    "xz-utils",
    "gnupg",
    "less",
]
# Units that make no sense in a container or that would race the product's apt runs.
MASK_UNITS = [
    "getty@tty1.service",
    "console-getty.service",
    "serial-getty@console.service",
    "lvm2-monitor.service",
    "lvm2-lvmpolld.socket",
    "lvm2-lvmpolld.service",
    "blk-availability.service",
    "e2scrub_reap.service",
    "e2scrub_all.timer",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "fstrim.timer",
    "dpkg-db-backup.timer",
    "systemd-networkd-wait-online.service",
    "systemd-firstboot.service",
    "sys-kernel-config.mount",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "sys-fs-fuse-connections.mount",
    "proc-sys-fs-binfmt_misc.automount",
    "systemd-binfmt.service",
    "systemd-modules-load.service",
]
# Bump when the build recipe below changes in a way the inputs do not show.
RECIPE_VERSION = "5"


def kernel_release():
    return os.uname().release


def _hash_tree(h, root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        filenames = [f for f in filenames if not f.endswith((".pyc", ".pyo"))]
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            h.update(("%s\0%o\0" % (rel, st.st_mode)).encode())
            if os.path.islink(path):
                h.update(os.readlink(path).encode())
            elif os.path.isfile(path):
                with open(path, "rb") as fh:
                    h.update(hashlib.sha256(fh.read()).digest())


def rootfs_key():
    """Hash of the debootstrap root's inputs: the suite, the variant, the mirror, the packages."""
    h = hashlib.sha256()
    h.update(("%s|%s|%s|%s" % (SUITE, VARIANT, MIRROR, ",".join(sorted(PACKAGES)))).encode())
    return h.hexdigest()[:16]


def image_key():
    """Hash of all inputs: rootfs inputs, the recipe (this file), the masked units, the kit
    files, the kernel release (the headers stand-in is made for it)."""
    h = hashlib.sha256()
    h.update(rootfs_key().encode())
    h.update(RECIPE_VERSION.encode())
    h.update(",".join(MASK_UNITS).encode())
    h.update(kernel_release().encode())
    with open(os.path.abspath(__file__), "rb") as fh:
        h.update(hashlib.sha256(fh.read()).digest())
    if os.path.isdir(KIT_ROOTFS):
        _hash_tree(h, KIT_ROOTFS)
    return h.hexdigest()[:16]


def image_tag():
    return "%s:%s" % (IMAGE_REPO, image_key())


def image_exists(tag):
    return docker("image", "inspect", tag, check=False).returncode == 0


def _debootstrap_tarball():
    """The debootstrap root as a tarball in the cache, made once for its inputs (rootfs_key);
    the sim-host image, the stand-in base image and the EE base are all made from it."""
    key = rootfs_key()
    tarball = os.path.join(CACHE_DIR, "debootstrap", "debootstrap-%s-%s.tar" % (SUITE, key))
    if os.path.exists(tarball):
        return tarball
    os.makedirs(os.path.dirname(tarball), exist_ok=True)
    target = os.path.join(BUILD_DIR, "debootstrap-%s" % key)
    if os.path.exists(target):
        shutil.rmtree(target)
    log("debootstrap %s (%s) from %s; takes about a minute" % (SUITE, VARIANT, MIRROR))
    start = time.time()
    run(["debootstrap", "--variant=" + VARIANT, "--include=" + ",".join(PACKAGES), SUITE, target, MIRROR], timeout=1800)
    log("debootstrap done in %.0f s" % (time.time() - start))
    # Trim caches before archiving: the tarball is reused for every image build.
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log"):
        path = os.path.join(target, sub)
        for name in os.listdir(path) if os.path.isdir(path) else []:
            full = os.path.join(path, name)
            if os.path.isfile(full) and not os.path.islink(full):
                os.unlink(full)
    tmp = tarball + ".tmp"
    run(["tar", "-C", target, "--numeric-owner", "--xattrs", "-cf", tmp, "."])
    os.rename(tmp, tarball)
    shutil.rmtree(target)
    return tarball


def _write(root, rel, text, mode=0o644):
    path = os.path.join(root, rel.lstrip("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        os.unlink(path)
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, mode)


def _kernel_headers(root, release):
    """Headers for the running kernel where a vendor installer looks (KERNELDIR)."""
    parts = (release.split("-")[0].split(".") + ["0", "0"])[:3]
    base = "usr/src/linux-headers-%s" % release
    _write(
        root,
        base + "/Makefile",
        "# Kernel build tree stand-in for %s (sim kit): enough for out-of-tree module\n"
        "# builds that only query the release or build against the kit's stubs.\n"
        "VERSION = %s\nPATCHLEVEL = %s\nSUBLEVEL = %s\nEXTRAVERSION = %s\nNAME = kit\n\n"
        "kernelrelease:\n\t@echo %s\n\nmodules modules_install clean:\n\t@true\n\n"
        ".PHONY: kernelrelease modules modules_install clean\n"
        % (
            release,
            parts[0],
            parts[1],
            parts[2],
            release[len(".".join(parts)) :] if release.startswith(".".join(parts)) else "",
            release,
        ),
    )
    _write(root, base + "/include/config/kernel.release", release + "\n")
    _write(root, base + "/include/generated/utsrelease.h", '#define UTS_RELEASE "%s"\n' % release)
    _write(root, base + "/.config", 'CONFIG_MODULES=y\nCONFIG_PCI=y\nCONFIG_LOCALVERSION=""\n')
    _write(root, base + "/Module.symvers", "")
    moddir = os.path.join(root, "lib/modules", release)
    os.makedirs(moddir, exist_ok=True)
    link = os.path.join(moddir, "build")
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink("/" + base, link)


def _customise(root):
    release = kernel_release()
    # The hardware kit (LVM activation, XPU stand-ins, boot units) below the product line.
    if os.path.isdir(KIT_ROOTFS):
        run(
            [
                "tar",
                "-C",
                KIT_ROOTFS,
                "--exclude=__pycache__",
                "--exclude=*.pyc",
                "--owner=0",
                "--group=0",
                "-cf",
                os.path.join(BUILD_DIR, "kit.tar"),
                ".",
            ]
        )
        run(
            [
                "tar",
                "-C",
                root,
                "--keep-directory-symlink",
                "--no-overwrite-dir",
                "-xf",
                os.path.join(BUILD_DIR, "kit.tar"),
            ]
        )
        os.unlink(os.path.join(BUILD_DIR, "kit.tar"))
    # Host keys are made per container at first boot, never shipped in the image.
    sshdir = os.path.join(root, "etc/ssh")
    for name in os.listdir(sshdir):
        if name.startswith("ssh_host_"):
            os.unlink(os.path.join(sshdir, name))
    _write(root, "etc/machine-id", "")
    dbus_id = os.path.join(root, "var/lib/dbus/machine-id")
    if os.path.lexists(dbus_id):
        os.unlink(dbus_id)
    _write(root, "etc/fstab", "# /etc/fstab: static file system information.\n")
    _write(
        root,
        "etc/apt/sources.list",
        "deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n"
        % (MIRROR, SUITE, MIRROR, SUITE, SECURITY_MIRROR, SUITE),
    )
    _kernel_headers(root, release)
    os.makedirs(os.path.join(root, "etc/kunlun-kit"), exist_ok=True)
    _write(root, "etc/kunlun-kit/faults", "")
    for unit in MASK_UNITS:
        link = os.path.join(root, "etc/systemd/system", unit)
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink("/dev/null", link)
    # Enable every kit unit that has an [Install] section.
    units = []
    unit_dir = os.path.join(KIT_ROOTFS, "etc/systemd/system")
    if os.path.isdir(unit_dir):
        for name in sorted(os.listdir(unit_dir)):
            path = os.path.join(unit_dir, name)
            if os.path.isfile(path) and name.endswith((".service", ".timer", ".socket")):
                with open(path) as fh:
                    if "[Install]" in fh.read():
                        units.append(name)
    if units:
        run(["chroot", root, "systemctl", "enable"] + units)
    run(["chroot", root, "systemctl", "enable", "ssh.service"])
    run(["chroot", root, "systemctl", "set-default", "multi-user.target"])


def build_image(force=False):
    """Return the image tag, building it when its inputs changed."""
    tag = image_tag()
    if not force and image_exists(tag):
        return tag
    start = time.time()
    tarball = _debootstrap_tarball()
    work = os.path.join(BUILD_DIR, "image-work")
    if os.path.exists(work):
        run(["rm", "-rf", "--one-file-system", work])
    os.makedirs(work)
    log("building image %s" % tag)
    run(["tar", "-C", work, "--numeric-owner", "--xattrs", "-xf", tarball])
    _customise(work)
    tar = subprocess.Popen(["tar", "-C", work, "--numeric-owner", "--xattrs", "-cf", "-", "."], stdout=subprocess.PIPE)
    imp = subprocess.run(
        [
            docker_cli(),
            "-H",
            DOCKER_HOST,
            "import",
            "--change",
            'CMD ["/sbin/init"]',
            "--change",
            "ENV container=docker",
            "--message",
            "kunlun-fleet sim host",
            "-",
            tag,
        ],
        stdin=tar.stdout,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=docker_env(),
    )
    tar.stdout.close()
    tar.wait()
    if imp.returncode != 0 or tar.returncode != 0:
        raise SimError("docker import of %s failed: %s" % (tag, imp.stderr))
    run(["rm", "-rf", "--one-file-system", work])
    docker("tag", tag, IMAGE_REPO + ":latest")
    log("image %s built in %.0f s" % (tag, time.time() - start))
    return tag


def remove_images():
    out = docker("images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_REPO, check=False).stdout
    for ref in out.split():
        docker("rmi", "-f", ref, check=False)


def prune_old_images(keep):
    """Remove sim-host images other than ``keep`` that no container uses."""
    out = docker("images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_REPO, check=False).stdout
    for ref in out.split():
        if ref not in (keep, IMAGE_REPO + ":latest"):
            docker("rmi", ref, check=False)


def tar_bytes(files, dirs=()):
    """Archive bytes for ``docker cp -``: files {path: (bytes, mode)}, dirs [(path, mode)].
    Only the listed directories get entries, so existing parents keep their modes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, mode in dirs:
            info = tarfile.TarInfo(name.strip("/"))
            info.type = tarfile.DIRTYPE
            info.mode = mode
            info.mtime = int(time.time())
            tar.addfile(info)
        for name, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(name.strip("/"))
            info.size = len(data)
            info.mode = mode
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
