"""A stand-in for Docker's apt repository, for the engine role's `engine_source: docker`.

download.docker.com is not reachable here. This builds a repository that behaves like it
for apt and for the role: a signed repository (its own gpg key, exported ASCII-armored as
the key URL serves it; Release, InRelease and Release.gpg signed with it) in Docker's
layout, served over HTTP by the caller (the test fixture binds it to the sim network's
bridge address):

    <out>/linux/debian/gpg                                       the signing key (armored)
    <out>/linux/debian/dists/<suite>/InRelease, Release, Release.gpg
    <out>/linux/debian/dists/<suite>/stable/binary-<arch>/Packages, Packages.gz
    <out>/linux/debian/dists/<suite>/pool/stable/<arch>/<package>_<version>_<arch>.deb

so the role's `engine_docker_repo_url` is `http://<address>:<port>/linux/debian` and its
`engine_docker_repo_key_url` that URL plus `/gpg`, as for Docker's own repository.

It holds docker-ce, docker-ce-cli and containerd.io, made from Debian's packages so that
a real engine ends up running (Debian's docker.io Conflicts: docker-ce, docker-ce-cli, so
docker-ce cannot simply depend on it):
    docker-ce      Debian's docker.io build (daemon and client) under Docker's name and
                   version scheme, its control rewritten (data and maintainer scripts kept):
                   Depends on containerd.io and docker-ce-cli instead of containerd and runc,
                   Conflicts: docker.io as Docker's does.
    docker-ce-cli  a package of control fields only (the client ships in docker-ce here).
    containerd.io  a package of control fields only, depending on Debian's containerd and runc.
The remaining dependencies (iptables, tini, ...) come from the host's Debian mirror, as
with Docker's repository.

    python -m kunlun_fleet.sim.apt_repo --out DIR [--debs DIR]
"""

import argparse
import gzip
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from email.utils import formatdate

REPO_PATH = "linux/debian"
COMPONENT = "stable"
KEY_UID = "kunlun-fleet sim Docker repository <sim-docker-repo@kunlun-fleet.invalid>"
MAINTAINER = "kunlun-fleet sim <sim@kunlun-fleet.invalid>"
# Fixed timestamps in every archive member made here (the same inputs, the same .debs).
EPOCH = 1700000000


class RepoError(Exception):
    """A failure with a message that names the thing and the fix."""


def _run(cmd, what, check=True, **kw):
    try:
        proc = subprocess.run(cmd, capture_output=True, **kw)
    except FileNotFoundError as exc:
        raise RepoError(
            "%s: %s is not installed (%s); on Debian: apt-get install %s"
            % (what, cmd[0], exc, "gnupg" if cmd[0].startswith("gpg") else "dpkg")
        ) from exc
    if check and proc.returncode != 0:
        err = proc.stderr.decode(errors="replace") if isinstance(proc.stderr, bytes) else proc.stderr
        raise RepoError("%s failed (rc=%d): %s\n%s" % (what, proc.returncode, " ".join(cmd), err[-2000:]))
    return proc.stdout


# ---------------------------------------------------------------- control files
def parse_control(text):
    """[(field, value)] of a deb822 stanza, continuation lines kept in the value."""
    fields = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line[0] in " \t" and fields:
            fields[-1] = (fields[-1][0], fields[-1][1] + "\n" + line)
        else:
            name, _, value = line.partition(":")
            fields.append((name.strip(), value.strip()))
    return fields


def format_control(fields):
    return "".join("%s: %s\n" % (k, v) for k, v in fields if v != "")


def depends_without(value, names):
    """A Depends value without the relations on `names` (alternatives included)."""
    kept = []
    for rel in (r.strip() for r in value.split(",")):
        if rel and not any(
            re.match(r"^%s(\s|\(|$)" % re.escape(n), alt.strip()) for alt in rel.split("|") for n in names
        ):
            kept.append(rel)
    return kept


def upstream(version):
    """'20.10.24+dfsg1-1+deb12u1+b6' -> '20.10.24'; '1.6.20~ds1-1+deb12u3' -> '1.6.20'."""
    version = version.split(":", 1)[-1]
    return re.split(r"[+~-]", version, maxsplit=1)[0]


# ---------------------------------------------------------------- .deb files
def read_ar(data):
    """[(name, bytes)] of an ar archive (a .deb)."""
    if not data.startswith(b"!<arch>\n"):
        raise RepoError("not an ar archive (.deb)")
    pos, members = 8, []
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        members.append((name, data[pos + 60 : pos + 60 + size]))
        pos += 60 + size + (size % 2)
    return members


def write_ar(members):
    out = io.BytesIO()
    out.write(b"!<arch>\n")
    for name, body in members:
        out.write(("%-16s%-12d%-6d%-6d%-8s%-10d`\n" % (name, EPOCH, 0, 0, "100644", len(body))).encode())
        out.write(body)
        if len(body) % 2:
            out.write(b"\n")
    return out.getvalue()


def _open_tar(name, body):
    mode = {"control.tar.gz": "r:gz", "control.tar.xz": "r:xz", "control.tar": "r:"}.get(name)
    if mode is None:
        raise RepoError("%s: compression not supported here (gz, xz or none)" % name)
    return tarfile.open(fileobj=io.BytesIO(body), mode=mode)


def deb_control(path):
    """The control stanza of a .deb as [(field, value)]."""
    with open(path, "rb") as fh:
        for name, body in read_ar(fh.read()):
            if name.startswith("control.tar"):
                with _open_tar(name, body) as tar:
                    member = next(m for m in tar.getmembers() if m.name in ("./control", "control"))
                    return parse_control(tar.extractfile(member).read().decode())
    raise RepoError("%s has no control archive" % path)


def rewrite_deb(src, dest, fields):
    """`src` with its control file replaced by `fields`; the data archive and the maintainer
    scripts are kept byte for byte."""
    with open(src, "rb") as fh:
        members = read_ar(fh.read())
    out = []
    for name, body in members:
        if name.startswith("control.tar"):
            new = io.BytesIO()
            with _open_tar(name, body) as tar, tarfile.open(fileobj=new, mode="w:gz", format=tarfile.GNU_FORMAT) as dst:
                for m in tar.getmembers():
                    if m.name in ("./control", "control"):
                        text = format_control(fields).encode()
                        m.size = len(text)
                        dst.addfile(m, io.BytesIO(text))
                    else:
                        dst.addfile(m, tar.extractfile(m) if m.isfile() else None)
            name, body = "control.tar.gz", new.getvalue()
        out.append((name, body))
    with open(dest + ".tmp", "wb") as fh:
        fh.write(write_ar(out))
    os.replace(dest + ".tmp", dest)


def build_deb(dest, fields, doc):
    """A package of control fields and a README (an equivs-like package) with dpkg-deb."""
    package = dict(fields)["Package"]
    with tempfile.TemporaryDirectory(prefix="kf-deb-") as root:
        os.makedirs(os.path.join(root, "DEBIAN"))
        with open(os.path.join(root, "DEBIAN", "control"), "w", encoding="utf-8") as fh:
            fh.write(format_control(fields))
        docdir = os.path.join(root, "usr", "share", "doc", package)
        os.makedirs(docdir)
        with open(os.path.join(docdir, "README.stand-in"), "w", encoding="utf-8") as fh:
            fh.write(doc)
        for dirpath, dirnames, filenames in os.walk(root):
            for n in dirnames:
                os.chmod(os.path.join(dirpath, n), 0o755)
            for n in filenames:
                os.chmod(os.path.join(dirpath, n), 0o644)
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(EPOCH))
        _run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", root, dest], "dpkg-deb --build " + package, env=env
        )


def find_deb(debs_dir, package):
    found = sorted(p for p in os.listdir(debs_dir) if p.startswith(package + "_") and p.endswith(".deb"))
    if not found:
        raise RepoError(
            "no %s_*.deb in %s; it comes from the bundle's closure "
            "(kunlun_fleet.sim.bundle.fetch_debs)" % (package, debs_dir)
        )
    return os.path.join(debs_dir, found[-1])


def stand_ins(debs_dir, suite, arch):
    """[(file name, control fields, how to make it)] of the three packages."""
    docker_io = find_deb(debs_dir, "docker.io")
    containerd = find_deb(debs_dir, "containerd")
    dio = dict(deb_control(docker_io))
    engine_version = "5:%s-1~debian.12~%s" % (upstream(dio["Version"]), suite)
    containerd_version = "%s-1" % upstream(dict(deb_control(containerd))["Version"])
    depends = depends_without(dio["Depends"], ["containerd", "runc"])
    engine = [
        ("Package", "docker-ce"),
        ("Version", engine_version),
        ("Architecture", arch),
        ("Maintainer", MAINTAINER),
        ("Installed-Size", dio.get("Installed-Size", "0")),
        ("Pre-Depends", dio.get("Pre-Depends", "init-system-helpers")),
        ("Depends", ", ".join(["containerd.io (>= 1.4)", "docker-ce-cli"] + depends)),
        ("Recommends", dio.get("Recommends", "")),
        ("Conflicts", "docker (<< 1.5~), docker-engine, docker.io"),
        ("Replaces", "docker-engine"),
        ("Section", "admin"),
        ("Priority", "optional"),
        ("Homepage", "https://www.docker.com"),
        (
            "Description",
            "Docker: the open-source application container engine (kunlun-fleet stand-in)\n"
            " Debian's docker.io %s (daemon and client) under Docker's package name." % dio["Version"],
        ),
    ]
    cli = [
        ("Package", "docker-ce-cli"),
        ("Version", engine_version),
        ("Architecture", arch),
        ("Maintainer", MAINTAINER),
        ("Section", "admin"),
        ("Priority", "optional"),
        ("Homepage", "https://www.docker.com"),
        (
            "Description",
            "Docker CLI: the open-source application container engine (kunlun-fleet stand-in)\n"
            " In the stand-in repository the client ships in docker-ce.",
        ),
    ]
    runtime = [
        ("Package", "containerd.io"),
        ("Version", containerd_version),
        ("Architecture", arch),
        ("Maintainer", MAINTAINER),
        ("Depends", "containerd (>= 1.4~), runc"),
        ("Section", "devel"),
        ("Priority", "optional"),
        ("Homepage", "https://containerd.io"),
        (
            "Description",
            "An open and reliable container runtime (kunlun-fleet stand-in)\n Depends on Debian's containerd and runc.",
        ),
    ]
    return [
        (docker_io, engine, None),
        (None, cli, "The Docker client ships in docker-ce in the kunlun-fleet stand-in repository.\n"),
        (None, runtime, "Debian's containerd and runc, under Docker's package name containerd.io.\n"),
    ]


def deb_name(fields):
    f = dict(fields)
    return "%s_%s_%s.deb" % (f["Package"], f["Version"].split(":", 1)[-1], f["Architecture"])


# ---------------------------------------------------------------- signing
def _gpg(home, *args, **kw):
    return _run(["gpg", "--batch", "--quiet", "--homedir", home] + list(args), "gpg " + (args[0] if args else ""), **kw)


def _fingerprints(home):
    # rc 2 with no secret key yet: nothing listed
    out = _run(
        ["gpg", "--batch", "--homedir", home, "--with-colons", "--list-secret-keys"],
        "gpg --list-secret-keys",
        check=False,
    ).decode()
    return [line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:")]


def new_key(home, uid=KEY_UID):
    """A signing key in the gpg home `home` (made when missing); its fingerprint."""
    os.makedirs(home, mode=0o700, exist_ok=True)
    os.chmod(home, 0o700)
    if not _fingerprints(home):
        _gpg(home, "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never")
    fprs = _fingerprints(home)
    if not fprs:
        raise RepoError("gpg made no key in %s" % home)
    return fprs[0]


def export_key(home, fingerprint, dest):
    _write(dest, _gpg(home, "--armor", "--export", fingerprint))


def sign_release(dists, home, fingerprint):
    """InRelease (clear-signed) and Release.gpg (detached) next to dists/Release."""
    release = os.path.join(dists, "Release")
    for name, mode in (("InRelease", "--clearsign"), ("Release.gpg", "--detach-sign")):
        target = os.path.join(dists, name)
        if os.path.exists(target):
            os.unlink(target)
        _gpg(home, "--local-user", fingerprint, "--digest-algo", "SHA512", "--armor", mode, "--output", target, release)


def stop_agent(home):
    subprocess.run(["gpgconf", "--homedir", home, "--kill", "gpg-agent"], capture_output=True)


# ---------------------------------------------------------------- the repository
def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "wb") as fh:
        fh.write(data if isinstance(data, bytes) else data.encode())
    os.replace(path + ".tmp", path)


def _digests(path):
    data = open(path, "rb").read()
    return {
        "size": len(data),
        "md5": hashlib.md5(data).hexdigest(),
        "sha1": hashlib.sha1(data).hexdigest(),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def packages_index(root, files):
    """The Packages text for `files` (paths below `root`, the repository's base)."""
    stanzas = []
    for path in files:
        d = _digests(path)
        fields = deb_control(path) + [
            ("Filename", os.path.relpath(path, root)),
            ("Size", str(d["size"])),
            ("MD5sum", d["md5"]),
            ("SHA1", d["sha1"]),
            ("SHA256", d["sha256"]),
        ]
        stanzas.append(format_control(fields))
    return "\n".join(stanzas)


def release_text(dists, suite, arch, indexes, date=None):
    lines = [
        "Origin: Docker",
        "Label: Docker CE",
        "Suite: %s" % suite,
        "Codename: %s" % suite,
        "Architectures: %s" % arch,
        "Components: %s" % COMPONENT,
        "Description: Docker CE packages for Debian %s (kunlun-fleet stand-in)" % suite,
        "Date: %s" % (date or formatdate(time.time(), usegmt=True)),
    ]
    for title, key in (("MD5Sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256")):
        lines.append("%s:" % title)
        for path in indexes:
            d = _digests(path)
            lines.append(" %s %16d %s" % (d[key], d["size"], os.path.relpath(path, dists)))
    return "\n".join(lines) + "\n"


def build(out, debs_dir, home, suite="bookworm", arch="amd64"):
    """The repository under `out` (made afresh), signed with the key in the gpg home `home`
    (made when missing). `debs_dir` holds Debian's docker.io and containerd .debs (the
    bundle's closure). Returns {"base": <out>/linux/debian, "key": <base>/gpg, "fingerprint",
    "packages": {name: version}}."""
    base = os.path.join(out, REPO_PATH)
    if os.path.isdir(base):
        shutil.rmtree(base)
    dists = os.path.join(base, "dists", suite)
    pool = os.path.join(dists, "pool", COMPONENT, arch)
    os.makedirs(pool)
    files, versions = [], {}
    for src, fields, doc in stand_ins(debs_dir, suite, arch):
        dest = os.path.join(pool, deb_name(fields))
        if src:
            rewrite_deb(src, dest, fields)
        else:
            build_deb(dest, fields, doc)
        files.append(dest)
        versions[dict(fields)["Package"]] = dict(fields)["Version"]
    binary = os.path.join(dists, COMPONENT, "binary-%s" % arch)
    text = packages_index(base, files).encode()
    _write(os.path.join(binary, "Packages"), text)
    gz = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=gz, mtime=EPOCH) as fh:
        fh.write(text)
    _write(os.path.join(binary, "Packages.gz"), gz.getvalue())
    _write(
        os.path.join(dists, "Release"),
        release_text(dists, suite, arch, [os.path.join(binary, "Packages"), os.path.join(binary, "Packages.gz")]),
    )
    fingerprint = new_key(home)
    try:
        sign_release(dists, home, fingerprint)
        export_key(home, fingerprint, os.path.join(base, "gpg"))
    finally:
        stop_agent(home)
    return {
        "base": base,
        "key": os.path.join(base, "gpg"),
        "fingerprint": fingerprint,
        "packages": versions,
        "dists": dists,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kunlun_fleet.sim.apt_repo", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory to serve (the repository is <out>/linux/debian)")
    ap.add_argument(
        "--debs",
        help="directory with Debian's docker.io and containerd .debs (default: the sim bundle's closure cache)",
    )
    ap.add_argument("--gnupghome", help="gpg home holding (or to hold) the signing key (default: <out>.gnupg)")
    ap.add_argument("--suite", default="bookworm")
    args = ap.parse_args(argv)
    debs = args.debs
    if not debs:
        from kunlun_fleet.sim import bundle

        debs = bundle.ensure_debs()
    try:
        made = build(args.out, debs, args.gnupghome or os.path.abspath(args.out) + ".gnupg", suite=args.suite)
    except RepoError as exc:
        print("ERROR: %s" % exc, file=sys.stderr)
        return 1
    for name, version in sorted(made["packages"].items()):
        print("%s %s" % (name, version))
    print("repository: %s (key %s, %s)" % (made["base"], made["key"], made["fingerprint"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
