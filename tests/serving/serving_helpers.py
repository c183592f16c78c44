"""The stand-in vllm 0.15.1 server on 127.0.0.1, and serving_ready run the way a play runs it."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "artifacts"))

from standin_helpers import free_port, load_pins, make_dev_dir, server_env  # noqa: E402

from kunlun_fleet.sim.artifacts.model import build_model_dir  # noqa: E402
from plugins.filter.serving import vllm_argv  # noqa: E402


@pytest.fixture(scope="session")
def pins():
    return load_pins()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, pins):
    d = tmp_path_factory.mktemp("models") / pins["kunlun_stack_model"]["directory"]
    build_model_dir(str(d), pins)
    return d


def serving_args(pins, model_dir):
    """The product's flags, built by the filter the serve unit uses (plugins/filter/serving.py);
    the port is the stand-in's own."""
    return ["--model", str(model_dir), *vllm_argv(dict(pins["kunlun_stack_serving"], port=None))]


class StandIn:
    """The stand-in api_server as a service: its log in a file, its exit code in another
    (what systemd would know), started and stopped by the test."""

    def __init__(self, tmp: Path, pins, model_dir, api_key, served_name, devices=8, load_seconds=2):
        self.tmp = tmp
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log_path = tmp / "serve.log"
        self.exit_path = tmp / "serve.exit"
        dev = make_dev_dir(tmp / "dev", devices)
        env = server_env(
            dev,
            KUNLUN_SIM_LOAD_SECONDS=str(load_seconds),
            XPU_VISIBLE_DEVICES=pins["kunlun_stack_serving_env"]["XPU_VISIBLE_DEVICES"],
        )
        argv = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *serving_args(pins, model_dir),
            "--api-key",
            api_key,
            "--served-model-name",
            served_name,
        ]
        self.argv, self.env = argv, env
        self.proc = None

    def start(self):
        # sh records the exit code, like a supervisor would; the server's output goes to the log.
        script = '"$@" >"%s" 2>&1; echo $? >"%s"' % (self.log_path, self.exit_path)
        self.proc = subprocess.Popen(["sh", "-c", script, "sh", *self.argv], env=self.env, start_new_session=True)
        return self

    def failed_command(self):
        return "test -s %s" % self.exit_path

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


@pytest.fixture()
def standin(tmp_path, pins, model_dir):
    started = []

    def make(**kw):
        # Each server its own directory (log, exit code, device nodes).
        home = tmp_path / ("standin-%d" % len(started))
        home.mkdir()
        srv = StandIn(home, pins, model_dir, **kw)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


def run_module(tmp_path, *args, check=False, background=False):
    """serving_ready as tasks of a real ansible-playbook run on localhost (json callback), a
    task per argument dict, each run whatever the one before it gave."""
    play = [
        {
            "name": "readiness",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [{"name": "serving_ready", "serving_ready": a, "ignore_errors": True} for a in args],
        }
    ]
    book = tmp_path / "ready.yml"
    book.write_text(json.dumps(play))
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_CALLBACKS_ENABLED="ansible.posix.json",
        ANSIBLE_LIBRARY=str(ROOT / "library"),
        ANSIBLE_MODULE_UTILS=str(ROOT / "module_utils"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
        ANSIBLE_NOCOLOR="1",
    )
    cmd = [
        str(ROOT / ".venv/bin/ansible-playbook"),
        "-i",
        "localhost,",
        "-c",
        "local",
        "-e",
        "ansible_python_interpreter=%s" % sys.executable,
        str(book),
    ]
    if check:
        cmd.append("--check")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if background:
        return proc
    return finish(proc)


def finish(proc, timeout=120):
    """([each task's result], the run's output)."""
    out, err = proc.communicate(timeout=timeout)
    try:
        doc = json.loads(out)
        results = [task["hosts"]["localhost"] for task in doc["plays"][0]["tasks"]]
    except (ValueError, KeyError, IndexError):
        raise AssertionError(
            "no task result from ansible-playbook (rc %s):\n%s\n%s" % (proc.returncode, out, err)
        ) from None
    return results, out + err


def wait_for(path: Path, budget=60.0):
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        if path.exists():
            return
        time.sleep(0.05)
    raise AssertionError("%s did not appear within %s s" % (path, budget))
