"""kunlun_fleet/sim/apt_repo.py: the stand-in for Docker's apt repository is a real signed
repository apt accepts (and refuses when the signature is not the served key's), holding
docker-ce (Debian's docker.io renamed, its files kept), docker-ce-cli and containerd.io."""

import io
import os
import shutil
import subprocess
import tarfile

import pytest

from kunlun_fleet.sim import apt_repo


def make_deb(root, name, version, depends="", extra_files=None, conflicts=""):
    """A small .deb built with dpkg-deb (a stand-in for Debian's own)."""
    tree = root / ("%s-tree" % name)
    (tree / "DEBIAN").mkdir(parents=True)
    fields = [
        ("Package", name),
        ("Version", version),
        ("Architecture", "amd64"),
        ("Maintainer", "Debian <debian@example.org>"),
        ("Depends", depends),
        ("Conflicts", conflicts),
        ("Description", "%s for the test\n more text" % name),
    ]
    (tree / "DEBIAN" / "control").write_text(apt_repo.format_control(fields))
    (tree / "DEBIAN" / "postinst").write_text("#!/bin/sh\necho configured %s\n" % name)
    (tree / "DEBIAN" / "postinst").chmod(0o755)
    for rel, text in (extra_files or {"usr/share/doc/%s/README" % name: "hello\n"}).items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    out = root / ("%s_%s_amd64.deb" % (name, version))
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree), str(out)], check=True, capture_output=True
    )
    return out


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("aptrepo")
    debs = root / "debs"
    debs.mkdir()
    make_deb(
        debs,
        "docker.io",
        "20.10.24+dfsg1-1+deb12u1+b6",
        depends="libc6 (>= 2.34), adduser, containerd (>= 1.4~), iptables, runc (>= 1.0.0~rc8~), tini",
        conflicts="docker-ce, docker-ce-cli",
        extra_files={"usr/sbin/dockerd": "#!/bin/sh\necho engine\n", "usr/bin/docker": "#!/bin/sh\n"},
    )
    make_deb(debs, "containerd", "1.6.20~ds1-1+deb12u3", depends="runc")
    home = root / "gnupg"
    made = apt_repo.build(str(root / "www"), str(debs), str(home))
    yield {"root": root, "debs": debs, "home": home, "made": made}
    apt_repo.stop_agent(str(home))


def members(path):
    with open(path, "rb") as fh:
        return dict(apt_repo.read_ar(fh.read()))


def test_layout_and_versions_like_dockers(repo):
    made, base = repo["made"], repo["made"]["base"]
    assert base.endswith("/linux/debian") and os.path.isfile(os.path.join(base, "gpg"))
    assert made["packages"] == {
        "docker-ce": "5:20.10.24-1~debian.12~bookworm",
        "docker-ce-cli": "5:20.10.24-1~debian.12~bookworm",
        "containerd.io": "1.6.20-1",
    }
    pool = os.path.join(base, "dists", "bookworm", "pool", "stable", "amd64")
    assert sorted(os.listdir(pool)) == [
        "containerd.io_1.6.20-1_amd64.deb",
        "docker-ce-cli_20.10.24-1~debian.12~bookworm_amd64.deb",
        "docker-ce_20.10.24-1~debian.12~bookworm_amd64.deb",
    ]
    for name in ("InRelease", "Release", "Release.gpg"):
        assert os.path.isfile(os.path.join(base, "dists", "bookworm", name))


def test_docker_ce_is_debians_engine_under_dockers_name(repo):
    base = repo["made"]["base"]
    new = os.path.join(base, "dists/bookworm/pool/stable/amd64/docker-ce_20.10.24-1~debian.12~bookworm_amd64.deb")
    old = next(p for p in repo["debs"].iterdir() if p.name.startswith("docker.io_"))
    new_m, old_m = members(new), members(str(old))
    assert new_m["data.tar.gz"] == old_m["data.tar.gz"]  # the engine's files, byte for byte
    fields = dict(apt_repo.deb_control(new))
    assert fields["Package"] == "docker-ce" and fields["Conflicts"] == "docker (<< 1.5~), docker-engine, docker.io"
    depends = [d.strip() for d in fields["Depends"].split(",")]
    assert depends[:2] == ["containerd.io (>= 1.4)", "docker-ce-cli"]
    assert not [d for d in depends if d.startswith(("containerd ", "runc"))]
    assert "tini" in depends and "iptables" in depends
    with tarfile.open(fileobj=io.BytesIO(new_m["control.tar.gz"])) as tar:
        postinst = tar.extractfile("./postinst").read().decode()
        assert "configured docker.io" in postinst and tar.getmember("./postinst").mode & 0o111
    proc = subprocess.run(["dpkg-deb", "--field", new, "Package", "Version"], capture_output=True, text=True)
    assert proc.returncode == 0 and "Package: docker-ce\nVersion: 5:20.10.24-1~debian.12~bookworm" in proc.stdout
    runtime = os.path.join(base, "dists/bookworm/pool/stable/amd64/containerd.io_1.6.20-1_amd64.deb")
    assert dict(apt_repo.deb_control(runtime))["Depends"] == "containerd (>= 1.4~), runc"


def private_apt(work, base, key):
    """apt-get update against the repository (file:), with the source signed-by `key`."""
    for sub in (
        "etc/apt.conf.d",
        "etc/preferences.d",
        "etc/sources.list.d",
        "state/lists/partial",
        "cache/archives/partial",
    ):
        (work / sub).mkdir(parents=True, exist_ok=True)
    (work / "state" / "status").write_text("")
    (work / "etc" / "sources.list.d" / "docker.sources").write_text(
        "Types: deb\nURIs: file://%s\nSuites: bookworm\nComponents: stable\nSigned-By: %s\n" % (base, key)
    )
    (work / "apt.conf").write_text(
        'Dir::Etc "{w}/etc"; Dir::Etc::main "none"; Dir::Etc::parts "{w}/etc/apt.conf.d";\n'
        'Dir::State "{w}/state"; Dir::State::status "{w}/state/status"; Dir::Cache "{w}/cache";\n'
        'APT::Architecture "amd64"; APT::Sandbox::User "root"; Debug::NoLocking "true";\n'.format(w=work)
    )
    env = dict(os.environ, APT_CONFIG=str(work / "apt.conf"), LC_ALL="C")
    update = subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True)
    policy = subprocess.run(
        ["apt-cache", "policy", "docker-ce", "docker-ce-cli", "containerd.io"], env=env, capture_output=True, text=True
    )
    return update, policy


def test_apt_accepts_the_repository_signed_by_its_key(repo, tmp_path):
    update, policy = private_apt(tmp_path, repo["made"]["base"], repo["made"]["key"])
    assert update.returncode == 0 and "W:" not in update.stdout + update.stderr, update.stdout + update.stderr
    assert policy.stdout.count("Candidate: ") == 3 and "Candidate: (none)" not in policy.stdout, policy.stdout
    assert "Candidate: 5:20.10.24-1~debian.12~bookworm" in policy.stdout


def test_apt_refuses_a_signature_of_another_key(repo, tmp_path):
    """The stand-in's signature is real: signed by a key apt was not given, the lists are refused."""
    copy = tmp_path / "www"
    shutil.copytree(
        os.path.join(repo["made"]["base"], "dists", "bookworm"),
        copy / "dists" / "bookworm",
        ignore=shutil.ignore_patterns("pool"),
    )
    other = tmp_path / "other-gnupg"
    fpr = apt_repo.new_key(str(other), "someone else <else@example.invalid>")
    try:
        apt_repo.sign_release(str(copy / "dists" / "bookworm"), str(other), fpr)
    finally:
        apt_repo.stop_agent(str(other))
    update, policy = private_apt(tmp_path / "apt", str(copy), repo["made"]["key"])
    text = update.stdout + update.stderr
    assert "NO_PUBKEY" in text or "is not signed" in text, text
    assert "Candidate: 5:" not in policy.stdout


def test_the_release_lists_the_indexes_it_signs(repo):
    dists = os.path.join(repo["made"]["base"], "dists", "bookworm")
    release = open(os.path.join(dists, "Release")).read()
    for rel in ("stable/binary-amd64/Packages", "stable/binary-amd64/Packages.gz"):
        d = apt_repo._digests(os.path.join(dists, rel))
        assert " %s %16d %s\n" % (d["sha256"], d["size"], rel) in release
    assert "Components: stable" in release and "Architectures: amd64" in release


@pytest.mark.parametrize(
    "version, up",
    [("20.10.24+dfsg1-1+deb12u1+b6", "20.10.24"), ("1.6.20~ds1-1+deb12u3", "1.6.20"), ("2:1.02.185-2", "1.02.185")],
)
def test_upstream_version(version, up):
    assert apt_repo.upstream(version) == up


def test_depends_without():
    assert apt_repo.depends_without(
        "libc6 (>= 2.34), containerd (>= 1.4~), runc | crun, containerd-shim, tini", ["containerd", "runc"]
    ) == ["libc6 (>= 2.34)", "containerd-shim", "tini"]
