"""module_utils/bundle_manifest.py: the offline bundle against its manifest."""

import hashlib

import pytest

from ansible.module_utils.bundle_manifest import check_bundle, parse_manifest


def write_bundle(root, files):
    lines = []
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        lines.append("%s  %s" % (hashlib.sha256(data).hexdigest(), rel))
    (root / "MANIFEST.sha256").write_text("\n".join(sorted(lines)) + "\n")


def test_parse_rejects_malformed_lines():
    with pytest.raises(ValueError, match="line 2"):
        parse_manifest("%s  a\nnot a line\n" % ("a" * 64))
    assert parse_manifest("%s *b/c\n" % ("B" * 64)) == {"b/c": "b" * 64}  # sha256sum's binary mark
    assert parse_manifest("%s  b/c\n" % ("B" * 64)) == {"b/c": "b" * 64}


def test_sound_bundle(tmp_path):
    write_bundle(tmp_path, {"drivers/x.run": b"installer", "wheels/a.whl": b"wheel"})
    assert check_bundle(str(tmp_path), ["drivers/x.run"], str(tmp_path / "cache.json")) == []


def test_every_problem_is_named(tmp_path):
    write_bundle(tmp_path, {"drivers/x.run": b"installer", "wheels/a.whl": b"wheel", "src/s.tgz": b"src"})
    (tmp_path / "wheels/a.whl").write_bytes(b"tampered")
    (tmp_path / "src/s.tgz").unlink()
    (tmp_path / "extra.bin").write_bytes(b"x")
    problems = check_bundle(str(tmp_path), ["drivers/x.run", "images/base.tar", "extra.bin"])
    by_path = {p: s for p, s, _ in problems}
    assert set(by_path) == {"wheels/a.whl", "src/s.tgz", "images/base.tar", "extra.bin"}
    assert by_path["wheels/a.whl"].startswith("checksum mismatch: sha256 ")
    assert by_path["src/s.tgz"] == "listed in the manifest but missing"
    assert by_path["images/base.tar"] == "missing"
    assert by_path["extra.bin"] == "present but not in the manifest"


def test_cache_does_not_hide_a_changed_file(tmp_path):
    write_bundle(tmp_path, {"a.bin": b"one"})
    cache = str(tmp_path / "cache.json")
    assert check_bundle(str(tmp_path), [], cache) == []
    (tmp_path / "a.bin").write_bytes(b"two, longer")  # size changes: the cache entry is stale
    assert [p for p, _, _ in check_bundle(str(tmp_path), [], cache)] == ["a.bin"]


def test_missing_directory_and_manifest(tmp_path):
    assert "does not exist" in check_bundle(str(tmp_path / "nope"), [])[0][1]
    assert check_bundle(str(tmp_path), [])[0][0] == "MANIFEST.sha256"


def test_only_required_verifies_the_stage_s_files_and_returns_their_sums(tmp_path):
    """A stage that uses one artifact (the driver's installer) verifies that one and gets
    its manifest sha256 back (the image role's tag), not the whole bundle."""
    write_bundle(tmp_path, {"drivers/x.run": b"installer", "wheels/a.whl": b"wheel"})
    (tmp_path / "wheels/a.whl").write_bytes(b"tampered")
    sums = {}
    assert check_bundle(str(tmp_path), ["drivers/x.run"], only_required=True, sums_out=sums) == []
    assert sums == {"drivers/x.run": hashlib.sha256(b"installer").hexdigest()}
    # The whole bundle still names the tampered wheel; a tampered required file fails either way.
    assert [p for p, _, _ in check_bundle(str(tmp_path), ["drivers/x.run"])] == ["wheels/a.whl"]
    (tmp_path / "drivers/x.run").write_bytes(b"installer, changed")
    assert [p for p, _, _ in check_bundle(str(tmp_path), ["drivers/x.run"], only_required=True)] == ["drivers/x.run"]


def test_the_cache_remembers_what_a_file_says_with_its_digest(tmp_path):
    """metadata() reads a file once per (size, mtime), a reader's refusal included; a changed
    file is read again; the entries of files gone are dropped when the cache is saved."""
    from ansible.module_utils.bundle_manifest import SumCache

    path, cache_file = tmp_path / "a.whl", str(tmp_path / "cache.json")
    path.write_bytes(b"one")
    reads = []

    def reader(p):
        reads.append(p)
        if open(p, "rb").read() == b"bad":
            raise ValueError("not a wheel")
        return {"version": "1"}

    cache = SumCache(cache_file)
    assert cache.metadata(str(path), "wheel", reader) == {"version": "1"}
    cache.digest(str(path))
    cache.save()
    again = SumCache(cache_file)
    assert again.metadata(str(path), "wheel", reader) == {"version": "1"} and len(reads) == 1
    path.write_bytes(b"bad")
    assert again.metadata(str(path), "wheel", reader) == {"error": "not a wheel"}
    assert again.metadata(str(path), "wheel", reader) == {"error": "not a wheel"} and len(reads) == 2
    gone = tmp_path / "gone.bin"
    gone.write_bytes(b"x")
    again.digest(str(gone))
    gone.unlink()
    again.save()
    assert list(SumCache(cache_file).entries) == [str(path)]
