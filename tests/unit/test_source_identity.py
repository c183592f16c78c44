"""A vllm-kunlun source tarball is identified by its commit (git archive's pax global
header) or, when it records none, by the sha256 the pin declares for that commit; the
versions it declares are shown, never compared (docs/bundle.md). Through the product's
builder and check (kunlun_fleet/bundle.py, module_utils/bundle_index.py), offline, except
the index's real vllm-kunlun sdist (downloaded once into .cache/index-files)."""

import copy
import hashlib
import io
import os
import subprocess
import sys
import tarfile

import pytest
import yaml

from kunlun_fleet import bundle as product

ROOT = product.ROOT
PINS = product.load_pins()
INDEX_FILES = ROOT / ".cache" / "index-files"
# vllm-kunlun 0.11.1's sdist as the package index serves it (pip download, checked by pip).
SDIST = "vllm_kunlun-0.11.1.tar.gz"
SDIST_SHA256 = "1d45c87c7e76128a66ba6707eccf3571dcbecf9369f6be032444c8c26a20ff53"

# The public 0.15.1-era tree at bd3b083 ("support qwen3.5 moe for vllm 0.15.1") declares
# these (baidu/vLLM-Kunlun: setup.py, pyproject.toml); the content here is a sketch.
SETUP_PY = (
    'from setuptools import setup\n\nif __name__ == "__main__":\n    setup(\n        name="vllm_kunlun",\n'
    '        version="v1.0",\n        packages=["vllm_kunlun"],\n    )\n'
)
PYPROJECT = (
    '[build-system]\nrequires = ["hatchling>=1.22"]\nbuild-backend = "hatchling.build"\n\n'
    '[project]\nname = "vllm-kunlun"\nversion = "0.11.0"\n'
)
TREE = {"setup.py": SETUP_PY, "pyproject.toml": PYPROJECT, "vllm_kunlun/__init__.py": ""}


def pins(commit, sha256=None):
    comp = copy.deepcopy(PINS["kunlun_stack_components"]["vllm_kunlun"])
    comp["commit"] = commit
    if sha256:
        comp["sha256"] = sha256
    return {"kunlun_stack_components": {"vllm_kunlun": comp}}


def git_archive(tmp_path, prefix):
    """`git archive --format=tar.gz [--prefix]` of a commit of TREE: (file, full commit id)."""
    repo = tmp_path / "repo"
    for name, text in TREE.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    env = dict(os.environ, GIT_AUTHOR_DATE="2026-03-03T11:56:25+0800", GIT_COMMITTER_DATE="2026-03-03T11:56:25+0800")

    def git(*args):
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
            cwd=repo,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "support qwen3.5 moe for vllm 0.15.1")
    commit = git("rev-parse", "HEAD")
    out = tmp_path / "vendor" / "vllm-kunlun-0.15.1.dev0-src.tar.gz"
    out.parent.mkdir()
    git("archive", "--format=tar.gz", *(["--prefix=%s/" % prefix] if prefix else []), "-o", str(out), "HEAD")
    return out, commit


def plain_tarball(path, files, top=""):
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo((top + "/" if top else "") + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def build(tmp_path, vendor, pin):
    lines = []
    rc, _ = product.build(
        str(tmp_path / "bundle"), vendor=str(vendor), pins=pin, cache_path=str(tmp_path / "sums.json"), log=lines.append
    )
    return rc, "\n".join(lines)


def check(tmp_path, pin):
    lines = []
    rc = product.check(str(tmp_path / "bundle"), pins=pin, cache_path=str(tmp_path / "sums.json"), log=lines.append)
    return rc, "\n".join(lines)


def entry(tmp_path):
    return yaml.safe_load((tmp_path / "bundle" / "bundle.yml").read_text())["artifacts"]["vllm_kunlun"]


@pytest.mark.parametrize("prefix", ["vLLM-Kunlun-bd3b083", ""])
def test_a_git_archive_is_its_commit_whatever_version_it_declares(tmp_path, prefix):
    """The bd3b083 form (setup.py v1.0, pyproject.toml 0.11.0) against the pin 0.15.1.dev0:
    taken, by its commit; its versions are recorded and shown."""
    path, commit = git_archive(tmp_path, prefix)
    rc, text = build(tmp_path, path.parent, pins(commit[:7]))
    assert rc == product.OK, text
    got = entry(tmp_path)
    assert got["commit"] == commit and got["commit_from"] == "git archive"
    assert got["declared"] == {"pyproject.toml": "0.11.0", "setup.py": "v1.0"}
    assert got["version"] == "0.11.0" and got["top_dir"] == prefix
    assert "it declares 0.11.0 (pyproject.toml), v1.0 (setup.py) (shown, not compared)" in text
    rc, text = check(tmp_path, pins(commit[:7]))
    assert rc == product.OK, text
    # another commit is refused, naming both
    rc, text = build(tmp_path / "other", path.parent, pins("4885de2"))
    assert rc == product.WRONG
    assert "is commit %s (git archive's pax header; vllm-kunlun declaring" % commit in text
    assert "the pin is 4885de2" in text


def test_a_tarball_that_records_no_commit_is_the_commit_its_declared_sha256_says(tmp_path):
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    path = vendor / "vllm-kunlun-0.15.1.dev0-4885de2.tar.gz"
    plain_tarball(path, TREE, "vllm-kunlun")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    rc, text = build(tmp_path / "a", vendor, pins("4885de2"))
    assert rc == product.WRONG
    assert (
        "vllm-kunlun declaring 0.11.0 (pyproject.toml), v1.0 (setup.py) records no commit (an sdist or a plain "
        "tarball, not a git archive): nothing shows it is commit 4885de2" in text
    )
    assert "kunlun_stack_components.vllm_kunlun.sha256" in text
    # the operator declares the file the vendor gave as that commit: its sha256 is its identity
    rc, text = build(tmp_path / "b", vendor, pins("4885de2", digest))
    assert rc == product.OK, text
    got = entry(tmp_path / "b")
    assert (got["commit"], got["commit_from"], got["sha256"]) == ("4885de2", "the sha256 the pin declares", digest)
    rc, text = check(tmp_path / "b", pins("4885de2", digest))
    assert rc == product.OK, text
    rc, text = check(tmp_path / "b", pins("4885de2", "0" * 64))
    assert rc == product.ERROR
    assert (
        "sha256 %s is not the one declared for commit 4885de2 (kunlun_stack_components.vllm_kunlun.sha256: %s)"
        % (digest, "0" * 64)
        in text
    )


def test_a_tree_without_setup_py_where_the_build_looks_is_refused(tmp_path):
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    path = vendor / "vllm-kunlun.tar.gz"
    plain_tarball(path, {"a/pyproject.toml": PYPROJECT, "b/setup.py": SETUP_PY})
    from kunlun_fleet.bundle import module_utils

    ident, _, _ = module_utils()
    with pytest.raises(ValueError, match="no PKG-INFO, setup.py or pyproject.toml at its top or in its one"):
        ident.read_source(str(path))
    plain_tarball(path, {"pyproject.toml": PYPROJECT})
    rc, text = build(tmp_path, vendor, pins("4885de2", hashlib.sha256(path.read_bytes()).hexdigest()))
    assert rc == product.WRONG
    assert (
        "has no setup.py at its top or in its one top-level directory (none): the image builds it with "
        "setup.py build and install" in text
    )


def index_sdist():
    """The index's vllm-kunlun 0.11.1 sdist, downloaded once into .cache/index-files."""
    path = INDEX_FILES / SDIST
    if not path.exists():
        INDEX_FILES.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--disable-pip-version-check",
                "-d",
                str(INDEX_FILES),
                "vllm-kunlun==0.11.1",
            ],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0 and path.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SDIST_SHA256
    return path


@pytest.mark.network
def test_the_index_s_vllm_kunlun_sdist_is_identified_by_name_and_version(tmp_path):
    """A real artifact of the project: an sdist (PKG-INFO, in vllm_kunlun-0.11.1/, no setup.py,
    no commit) is vllm-kunlun 0.11.1 and is not the pin."""
    from kunlun_fleet.bundle import module_utils

    ident, _, _ = module_utils()
    path = index_sdist()
    said = ident.read_source(str(path))
    assert (said["name"], said["version"], said["commit"], said["top_dir"], said["setup_py"]) == (
        "vllm-kunlun",
        "0.11.1",
        "",
        "vllm_kunlun-0.11.1",
        False,
    )
    assert said["declared"] == {"PKG-INFO": "0.11.1", "pyproject.toml": "0.11.1"}
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    os.link(path, vendor / SDIST) if os.stat(path).st_dev == os.stat(vendor).st_dev else (vendor / SDIST).write_bytes(
        path.read_bytes()
    )
    rc, text = build(tmp_path, vendor, pins("4885de2"))
    assert rc == product.WRONG, text
    row = [line for line in text.splitlines() if line.startswith("vllm_kunlun ")][0]
    assert "WRONG" in row
    assert "vllm-kunlun declaring 0.11.1 (PKG-INFO), 0.11.1 (pyproject.toml) records no commit" in row
    assert "nothing shows it is commit 4885de2" in row
    assert "has no setup.py at its top or in its one top-level directory (vllm_kunlun-0.11.1)" in row
