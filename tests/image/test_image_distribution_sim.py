"""The image stage's distribution on the three sim hosts the e2e left converged and serving
(fleet lane, beside molecule-image; it needs the whole fleet, not one host):

- the builder's registry listens on the fleet address only and refuses a client without
  the fleet's certificate;
- an unchanged re-run changes nothing and moves nothing: the registry's access log shows
  no push (PUT) and no blob fetch during it;
- a host cut off (SSH refused) while the image is distributed: the other host finishes
  with the builder's image ID, the recap names the cut host as unreachable, and the next
  run gives it the tag (only to it) with the builder's image ID;
- image_distribution: stream still works (the builder cannot run a registry).

Nothing serving is stopped: only the tag of the build (kunlun-serving:<hash>) is removed
from the pulling hosts' engines, never :current, which every host keeps with the image it
serves (the running container holds its image by ID).
"""

import re
import subprocess
import time
from pathlib import Path

import pytest

from kunlun_fleet.sim.testing import recap

pytestmark = [pytest.mark.sim, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "inventories" / "sim"
BUILDER, PULLERS = 1, (2, 3)
REGISTRY = "172.31.250.11:5000"


def ssh(index, command, check=True):
    from kunlun_fleet.sim import fleet
    proc = subprocess.run(fleet.ssh_cmd(index, command), capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, "kf-node-%d: %r failed: %s%s" % (index, command, proc.stdout, proc.stderr)
    return proc.stdout.strip()


def env():
    from kunlun_fleet.cli import ansible_env
    return dict(ansible_env(str(INVENTORY)), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")


def play_cmd(*extra):
    return [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(INVENTORY), str(ROOT / "playbooks/image.yml"), *extra]


def play(*extra):
    proc = subprocess.run(play_cmd(*extra), cwd=ROOT, env=env(), capture_output=True, text=True, timeout=1800)
    return proc.returncode, proc.stdout + proc.stderr


def image_ids(index):
    """{tag: image ID} of kunlun-serving on a host."""
    out = ssh(index, "docker images --no-trunc --format '{{.Tag}} {{.ID}}' kunlun-serving")
    return dict(line.split() for line in out.splitlines() if line.strip())


def build_tag(ids):
    tags = [t for t in ids if t not in ("current", "previous")]
    assert len(tags) == 1, ids
    return tags[0]


@pytest.fixture(scope="module")
def converged(sim_fleet):
    """The fleet as the image stage leaves it (registry distribution); the builder's tag and ID."""
    rc, out = play()
    assert rc == 0, out[-6000:]
    ids = image_ids(BUILDER)
    tag = build_tag(ids)
    serving = {i: image_ids(i)["current"] for i in (1, 2, 3)}
    yield tag, ids[tag]
    # every host ends holding :current with the image it held before (and the build tag)
    for i in (1, 2, 3):
        assert image_ids(i).get("current") == serving[i], "kf-node-%d lost its :current tag" % i


def registry_log_since(stamp):
    return ssh(BUILDER, "journalctl -u kunlun-registry --since '%s' --no-pager -o cat" % stamp)


def test_registry_listens_on_the_fleet_address_only(converged):
    sockets = [l for l in ssh(BUILDER, "ss -Hltnp").splitlines() if "docker-registry" in l]
    assert [l.split()[3] for l in sockets] == [REGISTRY], sockets
    ca = "/etc/docker/certs.d/%s/ca.crt" % REGISTRY
    # curl reads "path:password" in --cert (not --key): the colon escaped there, quoted for the shell
    mine = "'/etc/docker/certs.d/%s'" % REGISTRY.replace(":", "\\:")
    # TLS, verified with the fleet's CA, but no client certificate: refused in the handshake
    from kunlun_fleet.sim import fleet
    stamp = ssh(BUILDER, "date '+%Y-%m-%d %H:%M:%S'")
    anon = subprocess.run(fleet.ssh_cmd(2, "curl -sS --cacert %s https://%s/v2/" % (ca, REGISTRY)),
                          capture_output=True, text=True, timeout=60)
    assert anon.returncode != 0, anon.stdout + anon.stderr
    assert re.search(r"TLS handshake error from 172\.31\.250\.12:\d+: tls: client didn't provide a certificate",
                     registry_log_since(stamp)), registry_log_since(stamp)[-2000:]
    ok = ssh(2, "curl -sS -o /dev/null -w '%%{http_code}' --cacert %s --cert %s/client.cert --key %s "
             "https://%s/v2/" % (ca, mine, ca.replace("ca.crt", "client.key"), REGISTRY))
    assert ok == "200"
    # the package's own unit (every address) never runs
    assert ssh(BUILDER, "systemctl is-enabled docker-registry.service", check=False) == "masked"


def test_unchanged_rerun_pushes_and_pulls_nothing(converged):
    stamp = ssh(BUILDER, "date '+%Y-%m-%d %H:%M:%S'")
    time.sleep(1)
    rc, out = play()
    assert rc == 0, out[-6000:]
    hosts = recap(out)
    assert sorted(hosts) == ["kf-node-1", "kf-node-2", "kf-node-3"], hosts
    assert all(h["changed"] == 0 for h in hosts.values()), hosts
    log = registry_log_since(stamp)
    assert not re.search(r'"(PUT|POST|PATCH) /v2/', log), log[-3000:]
    assert not re.search(r'"GET /v2/[^"]*/blobs/', log), log[-3000:]
    assert not re.search(r'"(GET|HEAD) /v2/[^"]*" .*"docker/', log), log[-3000:]
    # and in check mode too (read-only checks only)
    rc, out = play("--check", "--diff")
    assert rc == 0 and all(h["changed"] == 0 for h in recap(out).values()), out[-6000:]


def _cut_ssh(index, on):
    """Refuse SSH on a sim host (from inside it, through the sim engine: SSH is what is cut)."""
    from kunlun_fleet.sim import config, engine
    rule = ["INPUT", "-p", "tcp", "--dport", "22", "-j", "REJECT", "--reject-with", "tcp-reset"]
    engine.docker("exec", config.container_name(index), "iptables", "-I" if on else "-D", *rule, check=on)


def test_host_unreachable_mid_distribution_is_resumed_next_run(converged, tmp_path):
    tag, builder_id = converged
    for i in PULLERS:
        ssh(i, "docker rmi kunlun-serving:%s" % tag)
    log = tmp_path / "image-cut.log"
    cut = False
    try:
        with open(log, "w") as sink:
            proc = subprocess.Popen(play_cmd(), cwd=ROOT, env=env(), stdout=sink, stderr=subprocess.STDOUT, text=True)
            # the distribution is under way: the builder has pushed or found its tag
            deadline = time.monotonic() + 600
            while "TASK [image : Registry trust |" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-6000:]
                time.sleep(0.2)
            _cut_ssh(3, True)
            cut = True
            proc.wait(timeout=1800)
        out = log.read_text()
        hosts = recap(out)
        assert proc.returncode != 0, out[-6000:]
        assert hosts["kf-node-3"]["unreachable"] == 1, hosts
        assert hosts["kf-node-2"]["unreachable"] == 0 and hosts["kf-node-2"]["failed"] == 0, hosts
        assert "UNREACHABLE" in out and "kf-node-3" in out.split("PLAY RECAP")[-1]
    finally:
        if cut:
            _cut_ssh(3, False)
        from kunlun_fleet.sim import fleet
        fleet.drop_control_masters([3])
    # the other host finished: the builder's image under the build tag and :current
    ids2 = image_ids(2)
    assert ids2.get(tag) == builder_id and ids2.get("current") == builder_id, ids2
    assert tag not in image_ids(3)
    # the next run resumes only what is missing: kf-node-3 pulls, nobody else changes
    stamp = ssh(BUILDER, "date '+%Y-%m-%d %H:%M:%S'")
    time.sleep(1)
    rc, out = play()
    assert rc == 0, out[-6000:]
    hosts = recap(out)
    assert hosts["kf-node-3"]["changed"] > 0 and hosts["kf-node-2"]["changed"] == 0 \
        and hosts["kf-node-1"]["changed"] == 0, hosts
    assert re.search(r"changed: \[kf-node-3\]", out.split("Distribute | Pull the image")[1].split("TASK [")[0])
    assert image_ids(3).get(tag) == builder_id
    # the engines' pulls (user agent docker/...; the builder's read-only look is Python's)
    pulls = re.findall(r'^(\S+) - - \[[^]]*\] "(?:GET|HEAD) /v2/kunlun-serving/manifests/[^" ]+ [^"]*" \d+ \d+ "[^"]*" "docker/',
                       registry_log_since(stamp), re.M)
    assert pulls and set(pulls) == {"172.31.250.13"}, pulls


def test_stream_option_still_distributes(converged):
    tag, builder_id = converged
    ssh(2, "docker rmi kunlun-serving:%s" % tag)
    rc, out = play("-e", "image_distribution=stream")
    assert rc == 0, out[-6000:]
    assert re.search(r"changed: \[kf-node-2 -> localhost\]", out.split("Distribute | Stream the image")[1].split("TASK [")[0])
    assert image_ids(2).get(tag) == builder_id
    hosts = recap(out)
    assert hosts["kf-node-3"]["changed"] == 0 and hosts["kf-node-1"]["changed"] == 0, hosts
