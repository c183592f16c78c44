"""Local stand-in fleets for the bench tests: stand-in vllm servers on 127.0.0.1 (from
kunlun_fleet/sim/artifacts/vllm_src, as tests/artifacts does), a round-robin TCP proxy in
front of them as the fleet endpoint, and an inventory whose hosts are this machine."""

import asyncio
import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "artifacts"))

from standin_helpers import Server, free_port, load_pins, make_dev_dir, server_env  # noqa: E402

from kunlun_fleet.sim.artifacts.model import build_model_dir  # noqa: E402

BENCH_VENV = ROOT / ".cache" / "bench-venv"
AIPERF = BENCH_VENV / "bin" / "aiperf"
API_KEY = "kf-bench-test-key-7c41d9e2a0"
SERVED = "Qwen3.8-27B-INT8-W8A8-Dynamic"
# Why a test that needs the bench venv cannot run (an error under make test / CI).
NO_VENV = "needs the bench venv: `make bench-setup` (requirements-bench.txt into .cache/bench-venv)"


def model_dir(base: Path) -> Path:
    pins = load_pins()
    d = base / pins["kunlun_stack_model"]["directory"]
    if not (d / "tokenizer.json").exists():
        build_model_dir(str(d), pins)
    return d


def serving_args(model: Path, max_num_seqs=256):
    s = load_pins()["kunlun_stack_serving"]
    return [
        "--model",
        str(model),
        "--tensor-parallel-size",
        str(s["tensor_parallel_size"]),
        "--dtype",
        s["dtype"],
        "--quantization",
        s["quantization"],
        "--max-model-len",
        str(s["max_model_len"]),
        "--mamba-ssm-cache-dtype",
        s["mamba_ssm_cache_dtype"],
        "--gpu-memory-utilization",
        str(s["gpu_memory_utilization"]),
        "--max-num-seqs",
        str(max_num_seqs),
        "--api-key",
        API_KEY,
        "--served-model-name",
        SERVED,
        "--disable-uvicorn-access-log",
    ]


def start_servers(tmp: Path, count: int, max_num_seqs=256, **env):
    """`count` stand-in servers with the product's flags, ready; returns their Server objects."""
    model = model_dir(tmp / "models")
    dev = make_dev_dir(tmp / "dev", 8)
    servers = []
    try:
        for i in range(count):
            srv = Server(serving_args(model, max_num_seqs), server_env(dev, **env), tmp / ("server%d.log" % i))
            servers.append(srv)
        for srv in servers:
            srv.wait_ready()
    except Exception:
        for srv in servers:
            srv.stop()
        raise
    return servers


class Proxy:
    """A round-robin TCP proxy (a connection each to the next backend): the fleet endpoint."""

    def __init__(self, backends):
        self.backends = itertools.cycle(backends)
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)
        self.url = "http://127.0.0.1:%d" % self.port

    def _run(self):
        asyncio.set_event_loop(self.loop)

        async def pipe(reader, writer):
            try:
                while True:
                    data = await reader.read(65536)
                    if not data:
                        break
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                try:
                    writer.close()
                except Exception:
                    pass

        async def handle(reader, writer):
            host, port = next(self.backends)
            try:
                br, bw = await asyncio.open_connection(host, port)
            except OSError:
                writer.close()
                return
            await asyncio.gather(pipe(reader, bw), pipe(br, writer))

        async def main():
            server = await asyncio.start_server(handle, "127.0.0.1", self.port, backlog=4096)
            self.ready.set()
            async with server:
                await server.serve_forever()

        try:
            self.loop.run_until_complete(main())
        except RuntimeError:
            pass

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)


def write_inventory(path: Path, servers, gateway_url, model: Path, report_dir: Path, **settings):
    """An inventory whose xpu_servers are this machine (connection local), one stand-in
    server each; the bench's URLs point at the stand-ins and the proxy."""
    hosts = {"h%d" % (i + 1): srv for i, srv in enumerate(servers)}
    (path / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    inv = {"all": {"children": {"xpu_servers": {"hosts": {h: {} for h in hosts}}, "gateways": {"hosts": {}}}}}
    (path / "hosts.yml").write_text(yaml.safe_dump(inv))
    gv = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(ROOT / ".venv" / "bin" / "python"),
        "ansible_become": False,
        "vault_kunlun_api_key": API_KEY,
        "bench_tokenizer": str(model),
        "bench_report_dir": str(report_dir),
        "bench_install_venv": False,
        "bench_host_urls": {h: srv.base for h, srv in hosts.items()},
        "bench_gateway_url": gateway_url,
        "bench_image_pin_file": str(path / "image-pin"),
        # The "hosts" are this machine's stand-in servers, behind no host firewall: nothing
        # to admit the controller to (roles/firewall, entry point admit).
        "firewall_enabled": False,
        # ... and serve plain HTTP (no certificate of a fleet CA to verify them with).
        "kunlun_stack_serving_tls": False,
    }
    gv.update(settings)
    (path / "group_vars" / "all" / "bench.yml").write_text(yaml.safe_dump(gv))
    (path / "image-pin").write_text("sha256:0123456789abcdef\n")
    return hosts


def run_bench(inventory: Path, *args, timeout=900):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_VAULT_PASSWORD_FILE", None)
    cmd = [
        str(ROOT / ".venv" / "bin" / "ansible-playbook"),
        str(ROOT / "playbooks" / "bench.yml"),
        "-i",
        str(inventory),
        *args,
    ]
    return subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=timeout)


def run_dirs(report_dir: Path):
    return sorted(p for p in report_dir.glob("bench-*") if p.is_dir())


def load_results(run_dir: Path):
    return json.loads((run_dir / "results.json").read_text())
