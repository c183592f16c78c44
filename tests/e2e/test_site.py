"""site.yml end to end on the 3-host sim fleet, then the checks an operator would make."""

import json
import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kunlun_fleet import ee, vault
from kunlun_fleet.sim.config import SIM_HOME, host_address
from kunlun_fleet.sim.testing import (
    FLEET_CA,
    HOST_CA,
    SERVING_PORT,
    admitted,
    recap,
    sim,
    ssh,
    worker_open,
    worker_url,
)

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ["kf-node-1", "kf-node-2", "kf-node-3"]
RESTART_TASK = "TASK [serve : Restart | (Re)start kunlun-serve]"
pytestmark = pytest.mark.sim


def run_site(*extra):
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
    )
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-playbook"), "-i", "inventories/sim", "site.yml", *extra],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=3600,
    )
    return proc.returncode, proc.stdout + proc.stderr


def keep(name, text):
    """The run's output under reports/ (the recaps quoted in closing notes and reviews)."""
    (ROOT / "reports").mkdir(exist_ok=True)
    (ROOT / "reports" / name).write_text(text)


# What a run may change on a host, in one text per host: every file and directory of the
# root filesystem and /home (type, mode, owner, size, mtime), the mounts, the logical
# volumes, the systemd units and their states. Left out: what the run's own machinery
# writes (Ansible's temporary files, logs, systemd's and apt's caches, and Python's bytecode
# caches: the modules import the host's own python3-apt, whose .pyc files a host may lack -
# the sim's cached debootstrap root had them, one made afresh in a cold CI run did not) and
# the package lists, which check mode refreshes on purpose to tell which packages it would
# install.
HOST_SNAPSHOT = r"""
find / -xdev \( -path /proc -o -path /sys -o -path /run -o -path /dev -o -path /tmp -o -path /var/tmp \
  -o -path /var/log -o -path /root/.ansible -o -path /var/lib/systemd -o -path /var/cache \
  -o -path /var/lib/apt/lists -o -name __pycache__ \) -prune \
  -o -path /root -prune -o -printf '%y %m %u %s %T@ %p\n' | LC_ALL=C sort
find /home -xdev -printf '%y %m %u %s %T@ %p\n' | LC_ALL=C sort
findmnt -rn -o TARGET,SOURCE,FSTYPE,OPTIONS | LC_ALL=C sort
lvs --noheadings -o vg_name,lv_name,lv_size 2>&1
systemctl list-units --all --no-legend --plain | awk '{print $1, $3, $4}' | LC_ALL=C sort
"""
# The users' files kf-node-3 starts with (the kit's seed manifest), and the same list of
# /home now, without the deployment's own directories.
HOME_SEEDED = "cat /var/lib/kunlun-kit/home.manifest"
HOME_NOW = "/usr/local/lib/kunlun-kit/apply-faults manifest /home --skip newdata --skip docker"


def host_snapshots():
    return {host: ssh(int(host.rsplit("-", 1)[1]), HOST_SNAPSHOT).stdout for host in HOSTS}


def changed_by_stage(out):
    """{(stage, host): {task, ...}} of the tasks and handlers a run reports changed, the
    stage being the play's name up to " | " (site.yml's plays are named by stage)."""
    found, stage, task = {}, None, None
    for line in out.splitlines():
        m = re.match(r"^PLAY \[([^|\]]+)", line)
        if m:
            stage = m.group(1).strip()
            continue
        m = re.match(r"^(?:TASK|RUNNING HANDLER) \[(.+?)\] \*", line)
        if m:
            task = m.group(1)
            continue
        m = re.match(r"^changed: \[([\w.-]+)", line)
        if m and stage and task:
            found.setdefault((stage, m.group(1)), set()).add(task)
    return found


@pytest.fixture(scope="module")
def ee_build():
    """The execution environment's build (make ee), started first: it runs beside the
    check from bare hosts and the first run, which need the controller far less than the
    hosts; the second run below waits for it."""
    proc = subprocess.Popen(
        [str(ROOT / ".venv/bin/python"), "-m", "kunlun_fleet.ee", "build"],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def ee_image(ee_build):
    out, err = ee_build.communicate(timeout=1800)
    assert ee_build.returncode == 0, err[-4000:]
    return out.strip()


@pytest.fixture(scope="module")
def bare_check(sim_fleet, ee_build):
    """Bare hosts: all three reset, kf-node-3 as servers are delivered (/home an ext4 LVM
    volume of its own names, mounted by /dev/mapper path, holding users' files). Then the
    operator's first command on new servers, `site.yml --check --diff`, with every host's
    snapshot before and after it."""
    sim("sim-reset", "kf-node-1", "kf-node-2", "kf-node-3", "--fault", "kf-node-3:home_lvm=ext4")
    before = host_snapshots()
    rc, out = run_site("--check", "--diff")
    keep("e2e-check-from-bare.log", out)
    return {"rc": rc, "out": out, "before": before, "after": host_snapshots()}


@pytest.fixture(scope="module")
def first_run(bare_check):
    """From bare hosts (after check mode looked at them): the README's demo command."""
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/kunlun-fleet"), "demo"],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=3600,
        env=dict(os.environ, ANSIBLE_FORCE_COLOR="0"),
    )
    out = proc.stdout + proc.stderr
    keep("e2e-first-run.log", out)
    assert proc.returncode == 0, out[-6000:]
    assert "=== kunlun-fleet demo summary ===" in out and "site.yml: succeeded" in out, out[-3000:]
    return out


def test_first_run_reaches_every_host(first_run):
    hosts = recap(first_run)
    assert {"kf-node-1", "kf-node-2", "kf-node-3"} <= set(hosts), hosts
    assert all(h["failed"] == 0 and h["unreachable"] == 0 for h in hosts.values()), hosts


def test_bare_hosts_start_together_after_the_canary(first_run):
    """The first deploy's serve stage: no host serves anything yet, so none is capacity: the
    canary (the first host), then the two others in one batch, not one at a time
    (serve_max_unavailable, 10 % of 3 hosts, bounds only the hosts that serve)."""
    serve = " ".join(first_run.split("PLAY [Serve | Read every host")[1].split("PLAY [Gateway")[0].split())
    assert re.search(
        r"rollout: 3 of 3 host\(s\) need a restart \(kf-node-1, kf-node-2, kf-node-3\): a canary of the 3 "
        r"host\(s\) that serve nothing, then the other 2 together: none serves, none is capacity",
        serve,
    ), serve[-3000:]
    # The capacity gate's line before each batch names the batch: two batches, in that order.
    batches = re.findall(r"taking out ((?:kf-node-\d(?:, )?)+):", serve)
    assert batches == ["kf-node-1", "kf-node-2, kf-node-3"], batches


def test_check_mode_from_bare_hosts_runs_through_and_changes_nothing(bare_check):
    assert bare_check["rc"] == 0, bare_check["out"][-6000:]
    hosts = recap(bare_check["out"])
    assert all(h["failed"] == 0 and h["unreachable"] == 0 for h in hosts.values()), hosts
    for host in HOSTS:
        before, after = bare_check["before"][host].splitlines(), bare_check["after"][host].splitlines()
        diff = sorted(set(before) ^ set(after))
        assert not diff, "check mode changed %s:\n%s" % (host, "\n".join(diff[:30]))
    # Where a step depends on one check mode cannot make (no Docker yet), it says so in a
    # line and the run goes on to the end.
    out = " ".join(bare_check["out"].split())
    assert re.search(
        r"would build kunlun-serving:[0-9a-f]{16} .*cannot be predicted further.*Docker is not installed yet", out
    )
    # The driver stage names the installer it would run (the one check of it in check mode).
    assert re.search(r"would run /home/newdata/drivers/xre-Linux-x86_64-[0-9.]+\.run --silent --accept-license", out), (
        "no installer line in check mode"
    )
    assert "PLAY [Acceptance" in bare_check["out"]


def test_check_mode_from_bare_hosts_predicts_the_first_run(bare_check, first_run):
    """Stage by stage and host by host, check mode announced as many changes as the real run
    made, except in the stages where it said, in a line, that it could not predict further
    (the installer's effects, the image without an engine, the rollout's gate, acceptance):
    there the real run made changes too."""
    predicted, made = changed_by_stage(bare_check["out"]), changed_by_stage(first_run)
    unpredictable = set()
    stage = host = None
    for line in bare_check["out"].splitlines():
        m = re.match(r"^PLAY \[([^|\]]+)", line)
        stage = m.group(1).strip() if m else stage
        m = re.match(r"^(?:changed|ok): \[([\w.-]+)\]", line)
        if m:
            host = m.group(1)
        if "cannot be predicted" in line:
            unpredictable.add((stage, host))
    assert {s for s, _ in unpredictable} >= {"Image", "Driver", "Serve"}, sorted(unpredictable)
    problems = []
    for key in sorted(set(predicted) | set(made)):
        p, m = predicted.get(key, set()), made.get(key, set())
        if key in unpredictable:
            # The line said what a real run would do there: it did something.
            if not m:
                problems.append(
                    "%s on %s: check mode said it could not predict a change the real run did not make" % key
                )
        elif len(p) != len(m):
            problems.append(
                "%s on %s: check mode %d, real run %d; only in check: %s; only in real: %s"
                % (key[0], key[1], len(p), len(m), sorted(p - m), sorted(m - p))
            )
    print("predicted per stage/host: %s" % {"%s/%s" % k: len(v) for k, v in sorted(predicted.items())})
    print("made per stage/host:      %s" % {"%s/%s" % k: len(v) for k, v in sorted(made.items())})
    assert not problems, "\n".join(problems)


def test_delivered_ext4_home_adopted_with_the_users_data(first_run):
    """kf-node-3's /home went through every stage as it was delivered: still its own ext4
    volume (vg0/lv_home, never rebuilt), Docker's data-root on it, the users' files byte for
    byte."""
    assert ssh(3, "findmnt -n -o FSTYPE --mountpoint /home").stdout.strip() == "ext4"
    assert ssh(3, "lvs --noheadings -o lv_name vg0/lv_home").stdout.strip() == "lv_home"
    assert ssh(3, "vgs --noheadings -o vg_name data", check=False).returncode != 0
    assert ssh(3, "docker info --format '{{.DockerRootDir}} {{.Driver}}'").stdout.split() == [
        "/home/docker",
        "overlay2",
    ]
    assert ssh(3, HOME_NOW).stdout == ssh(3, HOME_SEEDED).stdout


def test_image_built_once_and_pulled_by_the_two_others(first_run):
    """The image stage from bare hosts: one build on the builder, pushed once to the
    builder's registry, pulled by the two other hosts; the controller carries no image.
    This is the one proof of that distribution from bare hosts: molecule/image runs on these
    hosts as this file leaves them and builds nothing (its verify runs the proof module on
    every host and checks the registry's binding). The stage's re-run, pushing and pulling
    nothing, and check mode are the whole site's, below."""
    # Task headers only (the timing summary at the end names slow tasks again).
    assert first_run.count("TASK [image : Build | Build the image") == 1, first_run[-3000:]
    push = first_run.split("TASK [image : Push | Push the tag to the fleet registry")[1].split("TASK [")[0]
    assert re.findall(r"changed: \[(kf-node-\d)\]", push) == ["kf-node-1"], push
    pull = first_run.split("TASK [image : Distribute | Pull the image from the builder's registry")[1].split("TASK [")[
        0
    ]
    assert sorted(re.findall(r"changed: \[(kf-node-\d)\]", pull)) == ["kf-node-2", "kf-node-3"], pull
    stream = first_run.split("TASK [image : Distribute | Stream the image")[1].split("TASK [")[0]
    assert "changed:" not in stream, stream


@pytest.fixture(scope="module")
def converged_runs(first_run, ee_image, tmp_path_factory):
    """The second run and check mode on the converged fleet, side by side: both find a fleet
    that needs nothing (the second run must change nothing, asserted below), so they run at
    once instead of one after the other (each is mostly the controller's CPU; on this 2-core
    machine the pair takes about a minute less). Check mode keeps its own fact cache: the
    two never write the same files.

    The second run is the one an AWX job makes: site.yml through ansible-navigator in the
    execution environment (execution-environment.yml), which must find the fleet the
    runner delivered (`kunlun-fleet demo` above) as converged as the runner left it."""
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
    )
    cmd = [str(ROOT / ".venv/bin/ansible-playbook"), "-i", "inventories/sim", "site.yml"]
    check_env = dict(env, ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path_factory.mktemp("check-facts")))
    # The sim inventory names files outside the project: the SSH key and the bundle (under
    # the sim's home) and this machine's CA certificates (group_vars/all/machine.yml). The
    # EE reaches the sim hosts as the controller does (the host's network).
    ee_cmd = ee.navigator_command(
        ee_image,
        "site.yml",
        "inventories/sim",
        mounts=[SIM_HOME, "/usr/local/share/ca-certificates"],
        container_options=["--network=host"],
        pass_env=["ANSIBLE_VAULT_PASSWORD_FILE", "ANSIBLE_FORCE_COLOR", "ANSIBLE_CALLBACK_RESULT_FORMAT"],
    )
    # The builder's clock before both runs: its registry's log since then (read below).
    stamp = ssh(1, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    time.sleep(1)
    # The engine's events, followed live from before the run (its history is a short ring
    # buffer that the other lanes' containers overwrite within minutes).
    events = subprocess.Popen(
        ["docker", "events", "--filter", "type=container", "--filter", "event=start", "--filter", "image=" + ee_image]
        + ["--format", "{{.Actor.Attributes.name}}"],
        env=ee.docker_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    procs = {
        "second": subprocess.Popen(
            ee_cmd, cwd=ROOT, env=ee.docker_env() | env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        ),
        "check": subprocess.Popen(
            cmd + ["--check", "--diff"],
            cwd=ROOT,
            env=check_env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        ),
    }
    outs = {name: proc.communicate(timeout=3600)[0] for name, proc in procs.items()}
    # ansible-runner marks each event in a container's output with an erased escape
    # sequence (invisible on a terminal): gone, the text is ansible-playbook's.
    outs["second"] = ee.plain_output(outs["second"])
    events.terminate()
    started_containers = events.communicate(timeout=60)[0].split()
    keep("e2e-second-run.log", outs["second"])
    keep("e2e-check-converged.log", outs["check"])
    found = {name: (procs[name].returncode, outs[name]) for name in procs}
    found["ee_image"], found["ee_containers"] = ee_image, started_containers
    found["registry_log"] = ssh(1, "journalctl -u kunlun-registry --since '%s' --no-pager -o cat" % stamp).stdout
    return found


def test_second_run_in_the_execution_environment_changes_nothing(converged_runs):
    rc, out = converged_runs["second"]
    assert rc == 0, out[-6000:]
    # It ran in the EE: the engine started a container of that image during the run.
    assert converged_runs["ee_containers"], "no container of %s started during the run" % converged_runs["ee_image"]
    changed = {h: r["changed"] for h, r in recap(out).items() if r["changed"]}
    assert changed == {}, "second run changed: %s\n%s" % (changed, out[-4000:])
    # The serve stage checked every host for real (a completion each) and rolled nothing:
    # no batch, no drain, no restart.
    assert "rollout: no host needs a restart; every host was checked" in out, out[-3000:]
    assert RESTART_TASK not in out and "Take the host out" not in out
    ready = out.split("TASK [serve : Ready | /v1/models lists the model and a completion returns text]")[1]
    assert sorted(re.findall(r"^ok: \[(kf-node-\d)\]", ready.split("\nTASK [")[0], re.M)) == HOSTS, ready[:2000]
    # The image stage moved nothing either: the builder's registry logged no push and no
    # blob or manifest fetch during the re-run (nor during the check run beside it).
    log = converged_runs["registry_log"]
    assert not re.search(r'"(PUT|POST|PATCH) /v2/', log), log[-3000:]
    assert not re.search(r'"GET /v2/[^"]*/blobs/', log), log[-3000:]
    assert not re.search(r'"(GET|HEAD) /v2/[^"]*" .*"docker/', log), log[-3000:]


def test_check_diff_changes_nothing(converged_runs):
    rc, out = converged_runs["check"]
    assert rc == 0, out[-6000:]
    changed = {h: r["changed"] for h, r in recap(out).items() if r["changed"]}
    assert changed == {}, "check mode reports changes on a converged fleet: %s\n%s" % (changed, out[-4000:])
    assert "would be (re)started" not in out


# ------------------------------------------------------------------ the fleet endpoint
# The tests below run after the two above, in file order, on the converged fleet; each
# leaves every host serving the current image again.


def ansible_playbook(playbook, *extra):
    # Results as JSON: one line each, so long messages (the capacity gate's) are not folded.
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
    )
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-playbook"), "-i", "inventories/sim", playbook, *extra],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=3600,
    )
    return proc.returncode, proc.stdout + proc.stderr


def endpoint():
    data = json.loads((ROOT / "reports" / "acceptance.json").read_text())
    return data["fleet_url"], data["model"], vault.read_api_key(str(ROOT / "inventories" / "sim"))


def unit_image(index):
    return ssh(index, "cat /etc/kunlun-serve/image").stdout.strip()


def test_acceptance_lines(first_run):
    """A line per host and one for the endpoint, each with a measured figure and the verdict
    that figure earns against the target. The figure is the stand-in's pace on a shared
    machine, not asserted (the sim inventory reports a miss without failing the run; the
    FAIL path that stops a run is tested in tests/serving/test_acceptance_standin.py)."""
    lines = (ROOT / "reports" / "acceptance.txt").read_text().splitlines()
    parsed = [
        re.match(
            r"^(PASS|FAIL) (kf-node-\d|fleet endpoint \S+): single stream ([0-9.]+) tok/s "
            r"\(target (\d+)\), first token [0-9.]+ s",
            line,
        )
        for line in lines
    ]
    assert all(parsed) and len(parsed) == 4, lines
    assert [m.group(2) for m in parsed[:3]] == ["kf-node-1", "kf-node-2", "kf-node-3"], lines
    assert parsed[3].group(2).startswith("fleet endpoint http://"), lines
    for m in parsed:
        rate, target = float(m.group(3)), float(m.group(4))
        assert rate > 0 and m.group(1) == ("PASS" if rate >= target else "FAIL"), m.group(0)
    # Measured over the whole length asked for (ignore_eos), not up to the first end of sentence.
    assert all(line.endswith(", 128 tokens") for line in lines if " kf-node-" in line), lines
    # The demo ends with the lines and how to call the endpoint, never with the key.
    assert "fleet endpoint: http://" in first_run and re.search("(PASS|FAIL) fleet endpoint", first_run)
    assert endpoint()[2] not in first_run


def test_openai_client_streams_through_the_gateway(first_run):
    import openai

    url, model, key = endpoint()
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
    assert model in [m.id for m in client.models.list()]
    chunks, text, running_at_first, finish = 0, "", None, None
    # The workers' counters are read from this machine: admitted to vLLM's port as the
    # bench is (the host firewall opens it to the gateways and the monitoring hosts only).
    with admitted(1, 2, 3):
        stream = client.chat.completions.create(
            model=model,
            stream=True,
            max_tokens=48,
            messages=[{"role": "user", "content": "Say something about the sea."}],
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if running_at_first is None:
                    running_at_first = running_requests()
                chunks += 1
                text += chunk.choices[0].delta.content
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
    assert chunks > 10 and text.strip() and finish, (chunks, text, finish)
    # Unbuffered, as an order of events: the first token reached the client while a
    # worker was still generating the request (a buffering hop would hold it to the end).
    assert running_at_first >= 1, running_at_first
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="not-the-key", max_retries=0).models.list()


def running_requests():
    """vllm:num_requests_running summed over the three workers (their own /metrics)."""
    total = 0.0
    for i in (1, 2, 3):
        with worker_open(worker_url(i) + "/metrics") as resp:
            text = resp.read().decode()
        total += sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running")
        )
    return total


def test_workers_serve_tls_from_the_fleet_ca_only(first_run):
    """No key in clear on the fleet network: every worker's port speaks TLS with a certificate
    the inventory's fleet CA issued for the host's serving address, and nothing else - a
    plain HTTP request gets no HTTP answer at all, and a client that trusts only the
    system's store refuses the certificate. Asked from the gateway host (kf-node-1), which
    reaches the workers as the router does, with its copy of the fleet CA's certificate."""
    fleet_ca = Path(FLEET_CA).read_text()
    assert ssh(1, "cat %s" % HOST_CA).stdout == fleet_ca
    for i in (1, 2, 3):
        address = "%s:%d" % (host_address(i), SERVING_PORT)
        got = ssh(1, "curl -s --cacert %s -o /dev/null -w '%%{http_code}' https://%s/health" % (HOST_CA, address))
        assert got.stdout == "200", got.stdout
        cert = ssh(
            1,
            "openssl s_client -connect %s -CAfile %s -verify_return_error </dev/null 2>/dev/null"
            " | openssl x509 -noout -issuer -ext subjectAltName" % (address, HOST_CA),
        ).stdout
        assert "CN = kunlun-fleet image registry CA" in cert, cert
        assert "IP Address:%s, IP Address:127.0.0.1, DNS:localhost" % host_address(i) in cert, cert
        # curl's 52: "Empty reply from server"; 60: the certificate could not be verified.
        plain = ssh(1, "curl -s -o /dev/null http://%s/health" % address, check=False)
        assert plain.returncode == 52, (plain.returncode, plain.stdout)
        stranger = ssh(1, "curl -s -o /dev/null https://%s/health" % address, check=False)
        assert stranger.returncode == 60, (stranger.returncode, stranger.stdout)


def started_at(index):
    return ssh(index, "systemctl show -P ActiveEnterTimestampMonotonic kunlun-serve.service").stdout.strip()


# The rollback playbook (`kunlun-fleet stage rollback --limit`, one host) is proved once, on
# the image a real promotion kept as previous: tests/upgrade/test_promotion_sim.py
# (suite upgrade-sim, on the fleet this file leaves). Hosts one after another under load,
# each behind the capacity gate and drained: tests/upgrade/test_driver_rolling_sim.py.


def ask(url, model, key):
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
    return client.completions.create(model=model, prompt="Hi", max_tokens=8).choices[0].text


def test_broken_image_is_rolled_back_and_the_fleet_answers(first_run):
    # A broken image on every host: vllm-kunlun without its _kunlun extension (a build that
    # did not produce it); the platform plugin fails to load, the server exits at start.
    # The three builds side by side (each host has its own engine).
    with ThreadPoolExecutor(3) as pool:
        list(
            pool.map(
                lambda i: ssh(
                    i,
                    "printf 'FROM kunlun-serving:current\\nRUN rm /opt/vllm_kunlun/lib/python3*/"
                    "site-packages/vllm_kunlun/_kunlun*.so\\n' | docker build -q -t kunlun-serving:broken -",
                ),
                (1, 2, 3),
            )
        )
    good = unit_image(1)
    others = {i: started_at(i) for i in (2, 3)}
    rc, out = ansible_playbook("playbooks/serve.yml", "-e", "serve_image_tag=broken")
    assert rc != 0, out[-4000:]
    assert "kf-node-1 failed readiness on kunlun-serving:broken" in out, out[-4000:]
    # The service log the failure shows names the real cause.
    assert "cannot import name '_kunlun' from 'vllm_kunlun'" in out, out[-4000:]
    assert "It is back on %s" % good in out, out[-4000:]
    # The canary went back to its image and serves; the rollout stopped before the others.
    assert unit_image(1) == good
    assert ssh(1, "systemctl is-active kunlun-serve.service").stdout.strip() == "active"
    assert {i: started_at(i) for i in (2, 3)} == others
    url, model, key = endpoint()
    assert ask(url, model, key)
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda i: ssh(i, "docker image rm kunlun-serving:broken"), (1, 2, 3)))
