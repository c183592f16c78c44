"""The engine stage on one sim host (kf-node-3, or a scratch lane's) from Docker's apt
repository (engine_source: docker),
and its refusal of an unreadable daemon.json.

download.docker.com is not reachable here: a stand-in repository (kunlun_fleet/sim/apt_repo.py:
signed Release/InRelease, the key served ASCII-armored at <repo>/gpg, Docker's layout and
package names) is served over HTTP from this machine on the sim network's bridge address
(an ephemeral port bound to that address only), and the role's engine_docker_repo_url and
engine_docker_repo_key_url point at it. On a fresh host whose /home is already a mounted
XFS volume (HOME_VOLUME; storage then engine from bare hosts is the e2e's chain): check mode
first (truthful: it announces changes and makes none), then the engine for real, then again
(changed=0) and in check mode (changed=0). The host's apt refuses the repository once its
InRelease is signed by another key. Then daemon.json made unreadable (a link to a missing
file) is refused before any change.

The bundle path (engine_source: bundle, offline) is the molecule engine scenario's, the
distribution's the e2e's.
"""

import functools
import hashlib
import http.server
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kunlun_fleet.sim import testing

pytestmark = [pytest.mark.sim, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
# The suite's host and its inventory: a scratch lane's, or kf-node-3 of the shared fleet.
INVENTORY = Path(testing.INVENTORY)
INDEX, HOST = testing.lane_host(3)

# What the engine stage may change, and what must stay as it was when it is not to change.
SNAPSHOT = r"""
echo "== packages"; dpkg-query -W -f '${Package} ${Version} ${db:Status-Status}\n' | sort | sha256sum
dpkg-query -W -f '${Package} ${Version} ${db:Status-Status}\n' \
  docker-ce docker-ce-cli containerd.io docker.io 2>&1 | sort
for d in /etc/apt/sources.list.d /etc/apt/keyrings /etc/docker /etc/systemd/system/docker.service.d /home/docker; do
  echo "== $d"; [ -e "$d" ] && find "$d" -maxdepth 1 -printf '%p %y %m\n' | sort; done
for f in /etc/apt/sources.list.d/* /etc/apt/keyrings/* /etc/docker/*; do [ -f "$f" ] && sha256sum "$f"; done
echo "== units"; systemctl is-active docker.service docker.socket 2>&1 | tr '\n' ' '; echo
"""


def _env():
    return dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_DEPRECATION_WARNINGS="False",
        PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")),
    )


def sim_reset():
    proc = subprocess.run(
        [str(VENV_BIN / "kunlun-fleet"), "sim-reset", HOST],
        cwd=REPO,
        env=_env(),
        text=True,
        capture_output=True,
        timeout=900,
    )
    assert proc.returncode == 0, "sim-reset %s failed:\n%s%s" % (HOST, proc.stdout, proc.stderr)


# The state the engine needs from the storage stage: /home a mounted XFS (ftype=1) volume.
# Made directly on the data disk (about 0.1 CPU-s): the storage stage's run (about 8 CPU-s)
# and the kit's home_lvm fault (about 5, checksumming the users' files it seeds) prove
# nothing more here; storage then engine from bare hosts is the e2e's chain.
HOME_VOLUME = "mkfs.xfs -q -f -n ftype=1 /dev/vdb && mount -t xfs /dev/vdb /home"


def on_host(command, check=True):
    from kunlun_fleet.sim import fleet

    proc = subprocess.run(fleet.ssh_cmd(INDEX, command), text=True, capture_output=True, timeout=600)
    if check:
        assert proc.returncode == 0, "%s: %r failed (rc=%d):\n%s%s" % (
            HOST,
            command,
            proc.returncode,
            proc.stdout,
            proc.stderr,
        )
    return proc


def play(playbooks, *args):
    """ansible-playbook <playbooks> --limit HOST; (proc, recap of the last play recap)."""
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(INVENTORY)]
        + [str(REPO / "playbooks" / p) for p in playbooks]
        + ["--limit", HOST]
        + list(args),
        cwd=REPO,
        env=_env(),
        text=True,
        capture_output=True,
        timeout=1800,
    )
    recaps = re.findall(
        r"^%s\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)" % re.escape(HOST),
        proc.stdout,
        re.M,
    )
    recap = (
        dict(zip(("ok", "changed", "unreachable", "failed", "skipped"), map(int, recaps[-1]), strict=True))
        if recaps
        else {}
    )
    return proc, recap


class RepoServer:
    """The repository directory over HTTP on (address, ephemeral port); the paths asked for are
    kept; `override` maps a path to other bytes (a re-signed InRelease)."""

    def __init__(self, root, address):
        self.requests, self.override = [], {}
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):
                server.requests.append(self.path)
                body = server.override.get(self.path)
                if body is None:
                    return super().do_GET()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer((address, 0), functools.partial(Handler, directory=str(root)))
        self.url = "http://%s:%d" % (address, self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def docker_repo(sim_fleet, tmp_path_factory):
    from kunlun_fleet.sim import apt_repo, bundle
    from kunlun_fleet.sim.config import GATEWAY

    root = tmp_path_factory.mktemp("docker-repo")
    home = root / "gnupg"
    made = apt_repo.build(str(root / "www"), bundle.ensure_debs(), str(home))
    server = RepoServer(root / "www", GATEWAY)
    made.update(
        server=server,
        home=home,
        root=root,
        url="%s/%s" % (server.url, apt_repo.REPO_PATH),
        key_url="%s/%s/gpg" % (server.url, apt_repo.REPO_PATH),
    )
    yield made
    server.close()
    apt_repo.stop_agent(str(home))


@pytest.fixture(scope="module")
def runs(docker_repo):
    """A fresh host with /home mounted (HOME_VOLUME): check mode, then the engine from the
    repository, then again. The host is reset again at the end (the next suite in the lane finds it fresh),
    except in a scratch lane, where the next suite resets it first."""
    extra = [
        "-e",
        "engine_source=docker",
        "-e",
        "engine_docker_repo_url=" + docker_repo["url"],
        "-e",
        "engine_docker_repo_key_url=" + docker_repo["key_url"],
    ]
    sim_reset()
    on_host(HOME_VOLUME)
    found = {"extra": extra, "fresh": on_host(SNAPSHOT).stdout}
    found["check"] = play(["engine.yml"], "--check", "--diff", *extra)
    found["after_check"] = on_host(SNAPSHOT).stdout
    found["first"] = play(["engine.yml"], *extra)
    found["second"] = play(["engine.yml"], *extra)
    found["check_converged"] = play(["engine.yml"], "--check", "--diff", *extra)
    yield found
    if testing.closing_resets():
        sim_reset()


def test_check_mode_announces_and_changes_nothing(runs):
    proc, recap = runs["check"]
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and recap.get("failed") == 0, out[-4000:]
    assert recap["changed"] > 0, out[-4000:]
    assert "docker-ce, docker-ce-cli, containerd.io would be installed from" in out, out[-4000:]
    assert runs["after_check"] == runs["fresh"]
    assert not re.search(r"^(docker-ce|containerd.io) \S+ installed$", runs["after_check"], re.M), runs["after_check"]
    assert "/etc/apt/sources.list.d/docker.sources" not in runs["after_check"]


def host_state(command):
    """{key: value} from the "key=value" lines a shell snippet prints on the host."""
    out = on_host(command).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_installs_from_the_repository(runs, docker_repo):
    proc, recap = runs["first"]
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and recap.get("failed") == 0 and recap["changed"] > 0, out[-6000:]
    state = host_state(r"""
        for p in docker-ce docker-ce-cli containerd.io docker.io; do
          echo "$p=$(dpkg-query -W -f '${Version} ${db:Status-Status}' $p 2>/dev/null || echo absent)"; done
        echo "origin=$(apt-cache policy docker-ce | awk '/\*\*\*/{getline; print $2, $3}')"
        echo "uris=$(sed -n 's/^URIs: //p' /etc/apt/sources.list.d/docker.sources)"
        echo "signed_by=$(sed -n 's/^Signed-By: //p' /etc/apt/sources.list.d/docker.sources)"
        echo "key=$(sha256sum < /etc/apt/keyrings/docker.asc | cut -d' ' -f1)"
        echo "engine=$(docker info --format '{{.DockerRootDir}} {{.Driver}} {{.ServerVersion}}')"
        echo "active=$(systemctl is-active docker.service)"
        """)
    versions = docker_repo["packages"]
    for name in ("docker-ce", "docker-ce-cli", "containerd.io"):
        assert state[name] == versions[name] + " installed", state
    assert state["docker.io"] != "installed" and not state["docker.io"].endswith(" installed"), state
    assert state["origin"] == "%s bookworm/stable" % docker_repo["url"], state
    assert state["uris"] == docker_repo["url"] and state["signed_by"] == "/etc/apt/keyrings/docker.asc", state
    assert state["key"] == hashlib.sha256(open(docker_repo["key"], "rb").read()).hexdigest(), state
    assert state["engine"].startswith("/home/docker overlay2 20.10.24") and state["active"] == "active", state
    asked = docker_repo["server"].requests
    for path in ("/linux/debian/gpg", "/linux/debian/dists/bookworm/InRelease"):
        assert path in asked, asked
    assert any(p.startswith("/linux/debian/dists/bookworm/pool/stable/amd64/docker-ce_") for p in asked), asked


def test_second_run_changes_nothing(runs):
    proc, recap = runs["second"]
    assert proc.returncode == 0 and recap.get("changed") == 0 and recap.get("failed") == 0, proc.stdout[-4000:]


def test_check_mode_on_the_converged_host_changes_nothing(runs):
    proc, recap = runs["check_converged"]
    assert proc.returncode == 0 and recap.get("changed") == 0 and recap.get("failed") == 0, proc.stdout[-4000:]


# apt-get update of the role's Docker source alone: the Debian mirror's lists (a fetch and
# a parse each time) have nothing to do with this signature.
APT_UPDATE_DOCKER = (
    "apt-get update -o Dir::Etc::SourceList=/etc/apt/sources.list.d/docker.sources"
    " -o Dir::Etc::SourceParts=/nonexistent -o APT::Get::List-Cleanup=0 2>&1"
)


def test_apt_refuses_the_repository_signed_by_another_key(runs, docker_repo):
    """The signature the role's signed-by key checks is real: re-signed by another key, apt refuses."""
    from kunlun_fleet.sim import apt_repo

    dists = Path(docker_repo["dists"])
    other = docker_repo["root"] / "other-gnupg"
    resigned = docker_repo["root"] / "resigned"
    resigned.mkdir()
    (resigned / "Release").write_bytes((dists / "Release").read_bytes())
    fpr = apt_repo.new_key(str(other), "someone else <else@kunlun-fleet.invalid>")
    try:
        apt_repo.sign_release(str(resigned), str(other), fpr)
    finally:
        apt_repo.stop_agent(str(other))
    server = docker_repo["server"]
    server.override = {
        "/linux/debian/dists/bookworm/InRelease": (resigned / "InRelease").read_bytes(),
        "/linux/debian/dists/bookworm/Release.gpg": (resigned / "Release.gpg").read_bytes(),
    }
    try:
        bad = on_host(APT_UPDATE_DOCKER, check=False)
    finally:
        server.override = {}
    assert "NO_PUBKEY" in bad.stdout or "is not signed" in bad.stdout, bad.stdout
    assert docker_repo["url"] in bad.stdout
    good = on_host(APT_UPDATE_DOCKER, check=False)
    assert good.returncode == 0 and "NO_PUBKEY" not in good.stdout, good.stdout


# daemon.json that cannot be read, here a link to a file on a filesystem not mounted yet (the
# old role took it for absent and replaced it with a file of its own keys). One kind is
# enough on the host: the role refuses every unreadable kind at the same assert, and which
# kinds are unreadable (a directory, a dangling link, an I/O error) is engine_state's, told
# apart in tests/unit/test_engine_state.py (test_a_directory_is_unreadable_not_absent,
# test_a_dangling_link_is_unreadable_not_absent).
def test_unreadable_daemon_json_is_refused_before_any_change(runs):
    make = "ln -s /srv/site-config/daemon.json /etc/docker/daemon.json"
    why = "unreadable (a symbolic link to /srv/site-config/daemon.json, which does not exist)"
    on_host("mv /etc/docker/daemon.json /root/daemon.json.kept && " + make)
    try:
        before = on_host(SNAPSHOT).stdout + on_host("ls -l /etc/docker/daemon.json").stdout
        proc, recap = play(["engine.yml"], *runs["extra"])
        after = on_host(SNAPSHOT).stdout + on_host("ls -l /etc/docker/daemon.json").stdout
    finally:
        on_host("rm -rf /etc/docker/daemon.json && mv /root/daemon.json.kept /etc/docker/daemon.json")
    out = re.sub(r"\s+", " ", proc.stdout + proc.stderr)
    assert proc.returncode != 0 and recap.get("failed") == 1, out[-4000:]
    for phrase in (
        "%s: /etc/docker/daemon.json is %s" % (HOST, why),
        "nothing was changed",
        "Fix: make /etc/docker/daemon.json a readable regular file",
    ):
        assert phrase in out, "missing %r in:\n%s" % (phrase, out[-4000:])
    assert after == before
    assert "== units\nactive active" in before, before


@pytest.fixture
def debs_bundle(tmp_path):
    """A bundle holding only debs/ (the engine's closure) and its manifest, to damage."""
    from kunlun_fleet.sim import bundle

    out = tmp_path / "bundle"
    bundle.fetch_debs(str(out), log=lambda *_: None)
    bundle.write_manifest(str(out))
    return out


# One refused run for both damages the manifest check finds (bundle_check lists every
# problem at once: a corrupt .deb and one the manifest does not list), one for the assert
# before it (no .deb of the engine at all).
@pytest.mark.parametrize(
    "damage, phrases",
    [
        (
            "corrupt-and-unlisted",
            ["debs/docker.io_", "the manifest says", "present but not in the manifest", "debs/tini_"],
        ),
        ("no-engine", ["holds no .deb of docker.io", "apt-get download"]),
    ],
)
def test_bundle_debs_are_checked_on_the_controller_first(sim_fleet, debs_bundle, damage, phrases):
    """engine_source: bundle refuses, before the host is touched, .debs that do not match the
    bundle's manifest or lack the engine."""
    debs = debs_bundle / "debs"
    if damage == "corrupt-and-unlisted":
        with open(next(debs.glob("docker.io_*.deb")), "ab") as fh:
            fh.write(b"\0")
        manifest = debs_bundle / "MANIFEST.sha256"
        manifest.write_text("".join(line for line in manifest.read_text().splitlines(True) if "debs/tini_" not in line))
    else:
        next(debs.glob("docker.io_*.deb")).unlink()
    before = on_host(SNAPSHOT).stdout
    proc, recap = play(["engine.yml"], "-e", "engine_source=bundle", "-e", "kunlun_stack_bundle_dir=%s" % debs_bundle)
    out = re.sub(r"\s+", " ", proc.stdout + proc.stderr)
    assert proc.returncode != 0 and recap.get("changed") == 0, out[-4000:]
    for phrase in phrases + ["nothing was changed"]:
        assert phrase in out, "missing %r in:\n%s" % (phrase, out[-4000:])
    assert on_host(SNAPSHOT).stdout == before
