"""library/engine_debs.py: which of the bundle's .debs apt must be given on a host (absent or
older packages only; never a downgrade, another architecture, or two versions of one package)."""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "library"))

import engine_debs  # noqa: E402

D = "/var/cache/kunlun-fleet/debs/"
SHOW = "${Package}\t${Version}\t${Architecture}\n"
QUERY = "${Package}\t${Version}\t${db:Status-Status}\n"


def compare(a, op, b):
    """dpkg --compare-versions, the real one (the controller is a Debian machine)."""
    return subprocess.run(["dpkg", "--compare-versions", a, op, b]).returncode


class FakeHost:
    """A host's dpkg: .deb fields from `debs`, installed versions from `installed`."""

    def __init__(self, debs, installed, arch="amd64"):
        self.debs, self.installed, self.arch, self.calls = debs, installed, arch, []

    def get_bin_path(self, name, required=False):
        return name

    def run_command(self, argv, environ_update=None):
        self.calls.append(argv)
        if argv[:2] == ["dpkg", "--print-architecture"]:
            return 0, self.arch + "\n", ""
        if argv[0] == "dpkg" and argv[1] == "--compare-versions":
            return compare(*argv[2:]), "", ""
        if argv[:4] == ["dpkg-deb", "--show", "--showformat", SHOW]:
            if argv[4] not in self.debs:
                return 2, "", "dpkg-deb: error: '%s' is not a Debian format archive" % argv[4]
            return 0, "\t".join(self.debs[argv[4]]) + "\n", ""
        if argv[:4] == ["dpkg-query", "--show", "--showformat", QUERY]:
            out = "".join("%s\t%s\tinstalled\n" % (p, v) for p, v in sorted(self.installed.items()) if p in argv[4:])
            return (0 if all(p in self.installed for p in argv[4:]) else 1), out, ""
        raise AssertionError("unexpected command %r" % argv)

    def fail_json(self, **kw):
        raise Failed(kw["msg"])


class Failed(Exception):
    pass


DEBS = {
    D + "docker.io_20.10.24+dfsg1-1+deb12u1+b6_amd64.deb": ("docker.io", "20.10.24+dfsg1-1+deb12u1+b6", "amd64"),
    D + "libdevmapper1.02.1_2%3a1.02.185-2_amd64.deb": ("libdevmapper1.02.1", "2:1.02.185-2", "amd64"),
    D + "netbase_6.4_all.deb": ("netbase", "6.4", "all"),
    D + "libmnl0_1.0.4-3_amd64.deb": ("libmnl0", "1.0.4-3", "amd64"),
    D + "tini_0.19.0-1+b3_amd64.deb": ("tini", "0.19.0-1+b3", "amd64"),
}


def test_a_fresh_host_gets_every_file():
    host = FakeHost(DEBS, {})
    found = engine_debs.plan(host, sorted(DEBS), ["docker.io"])
    assert found["install"] == sorted(DEBS) and found["missing"] == ["docker.io"]
    assert {e["action"] for e in found["debs"]} == {"install"} and found["architecture"] == "amd64"


def test_installed_same_or_newer_is_left_out_older_is_upgraded():
    host = FakeHost(
        DEBS,
        {
            "netbase": "6.4",
            "libmnl0": "1.0.4-3+deb12u1",
            "libdevmapper1.02.1": "2:1.02.175-2",
            "docker.io": "20.10.24+dfsg1-1+deb12u1+b6",
        },
    )
    found = engine_debs.plan(host, sorted(DEBS), ["docker.io"])
    actions = dict((os.path.basename(e["file"]).split("_")[0], e["action"]) for e in found["debs"])
    assert actions == {
        "docker.io": "current",
        "libdevmapper1.02.1": "upgrade",
        "netbase": "current",
        "libmnl0": "newer-installed",
        "tini": "install",
    }
    assert found["install"] == [D + "libdevmapper1.02.1_2%3a1.02.185-2_amd64.deb", D + "tini_0.19.0-1+b3_amd64.deb"]
    assert found["missing"] == []
    entry = next(e for e in found["debs"] if e["package"] == "libmnl0")
    assert entry["installed"] == "1.0.4-3+deb12u1"


def test_a_converged_host_needs_nothing():
    installed = dict((p, v) for p, v, _ in DEBS.values())
    found = engine_debs.plan(FakeHost(DEBS, installed), sorted(DEBS), ["docker.io"])
    assert found["install"] == [] and found["missing"] == []


def test_another_architecture_and_an_older_duplicate_are_left_out():
    debs = dict(DEBS)
    debs[D + "tini_0.19.0-1+b3_arm64.deb"] = ("tini", "0.19.0-1+b3", "arm64")
    debs[D + "tini_0.18.0-1_amd64.deb"] = ("tini", "0.18.0-1", "amd64")
    found = engine_debs.plan(FakeHost(debs, {}), sorted(debs), [])
    actions = dict((os.path.basename(e["file"]), e["action"]) for e in found["debs"])
    assert actions["tini_0.19.0-1+b3_arm64.deb"] == "foreign"
    assert actions["tini_0.18.0-1_amd64.deb"] == "superseded"
    assert actions["tini_0.19.0-1+b3_amd64.deb"] == "install"
    assert len([f for f in found["install"] if "/tini_" in f]) == 1


def test_a_file_that_is_no_deb_is_refused():
    host = FakeHost(DEBS, {})
    with pytest.raises(Failed, match=r"/tmp/broken.deb is not a readable .deb .*nothing was changed"):
        engine_debs.plan(host, ["/tmp/broken.deb"], [])


def test_a_wanted_package_no_file_installs_is_missing():
    found = engine_debs.plan(FakeHost(DEBS, {}), [D + "tini_0.19.0-1+b3_amd64.deb"], ["docker.io", "tini"])
    assert found["missing"] == ["docker.io", "tini"]
