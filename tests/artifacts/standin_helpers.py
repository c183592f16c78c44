"""Helpers for the stand-in artifact tests (vllm simulator, bundle)."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "kunlun_fleet" / "sim" / "artifacts"
VLLM_SRC = ARTIFACTS / "vllm_src"
PINS = ROOT / "roles" / "kunlun_stack" / "defaults" / "main.yml"


def load_pins():
    from kunlun_fleet.bundle import load_pins as stack_pins

    return stack_pins()


def bundle_files(bundle_dir: Path) -> dict:
    """{pin key: file relative to the bundle} from the bundle's index, bundle.yml."""
    index = yaml.safe_load((Path(bundle_dir) / "bundle.yml").read_text())
    return {key: entry["path"] for key, entry in index["artifacts"].items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python310():
    """The interpreter of the sim's base image on this machine (kunlun_fleet.sim.base_python:
    a CPython 3.10 where the machine has one, else Debian's python3.11, the fallback), or None.
    The stand-in wheels the bundle holds are tagged for the same one."""
    from kunlun_fleet.sim import base_python
    from kunlun_fleet.sim.config import SimError

    try:
        return base_python.interpreter(base_python.resolve())
    except SimError:
        return None


# Why a test that needs it skips (an error under make test / CI).
NO_PY310 = (
    "needs the base image's Python on this machine: a CPython 3.10 (`pyenv install 3.10`, or "
    "KUNLUN_SIM_PYTHON310_PREFIX), or Debian's python3.11 with python3-venv (the fallback)"
)


def install_stack(bundle_dir: Path, work: Path, python: str) -> dict:
    """A venv under work holding the stand-in stack from bundle_dir, installed in the
    serving image's order (the torch .run, the four wheels, vllm and transformers
    force-reinstalled, vllm-kunlun built from its tarball); pip where the image uses uv.
    Each file is the one the bundle's index (bundle.yml) names.
    Returns {venv, python, src, env, sh} (sh runs a command in env)."""
    files = bundle_files(bundle_dir)
    venv = work / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    # No bytecode compiled at install time, as uv installs in the image (its default): the
    # modules imported are compiled when first imported (transformers alone: ~7 CPU-s less).
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1", PIP_COMPILE="false")
    env.pop("PYTHONPATH", None)
    # The venv's bytecode in its own __pycache__ (see venv_env), not under the run's prefix.
    env.pop("PYTHONPYCACHEPREFIX", None)

    def sh(*cmd, **kw):
        proc = subprocess.run(list(cmd), env=kw.pop("env", env), capture_output=True, text=True, **kw)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    # torch: the vendor's .run installs with pip into the active environment
    sh(
        "bash",
        str(bundle_dir / files["torch"]),
        env=dict(env, CONDA_PREFIX=str(venv), PATH=f"{venv}/bin:{os.environ['PATH']}"),
    )
    for pkg in ("kunlun_ops", "triton", "xspeedgate_ops", "cocopod"):
        sh(py, "-m", "pip", "install", "--no-deps", str(bundle_dir / files[pkg]))
    for pkg in ("vllm", "transformers"):
        sh(py, "-m", "pip", "install", "--no-deps", "--force-reinstall", str(bundle_dir / files[pkg]))
    src = work / "vllm-kunlun"
    src.mkdir()
    sh("tar", "-xzf", str(bundle_dir / files["vllm_kunlun"]), "-C", str(src))
    # The tree is where the bundle's identity of the tarball says (git archive --prefix: one
    # top-level directory), as the image build finds it.
    from kunlun_fleet.bundle import module_utils

    top = module_utils()[0].read_source(str(bundle_dir / files["vllm_kunlun"]))["top_dir"]
    src = src / top if top else src
    sh(py, "setup.py", "build", cwd=src)
    sh(py, "setup.py", "install", cwd=src)
    return {"venv": venv, "python": py, "src": src, "sh": sh, "env": env}


_SHARED = {}


def shared_stack(tmp_path_factory, python: str) -> dict:
    """The stand-in stack from a bundle of its own, installed once per test process (about
    20 CPU-s each time) for every test that runs it: tests/artifacts and
    tests/unit/test_stack_proof.py. A test that changes it puts back what it changed (a
    wheel reinstalled, a package moved aside, a patch reverted). install_stack's dict, and
    the bundle's path as "bundle"."""
    if "stack" not in _SHARED:
        from kunlun_fleet.sim import bundle

        tmp = tmp_path_factory.mktemp("stack")
        out = tmp / "bundle"
        bundle.build(str(out), force=True, log=lambda *_: None)
        stack = install_stack(out, tmp, python)
        _SHARED["stack"] = dict(stack, bundle=out)
    return _SHARED["stack"]


def make_dev_dir(path: Path, count: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (path / f"xpu{i}").touch()
    (path / "xpuctrl").touch()
    return path


def server_env(dev_dir: Path, **extra) -> dict:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": str(VLLM_SRC),
            "KUNLUN_SIM_DEV_DIR": str(dev_dir),
            "KUNLUN_SIM_LOAD_SECONDS": "0",
            "KUNLUN_SIM_TOKENS_PER_SECOND": "400",
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("XPU_VISIBLE_DEVICES", None)
    env.pop("VLLM_API_KEY", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def venv_env(dev_dir: Path, **extra) -> dict:
    """server_env for a venv holding the installed stack (no source tree on the path)."""
    env = server_env(dev_dir, **extra)
    env.pop("PYTHONPATH", None)
    # Bytecode beside the venv's files, where Python keeps it by default: a package moved
    # aside takes its own along. Under the run's prefix (tests/conftest.py), keyed by path,
    # source mtime and size, a variant installed in its place from a tarball (mtimes kept)
    # whose files differ only in a commit id ran the moved package's bytecode.
    env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def make_dead_node(path: Path) -> Path:
    """A device node with no driver behind it (open: ENXIO), like the kit makes for a card
    in error: a character node on an unregistered major (root), else a UNIX socket, which
    open(2) also answers with ENXIO."""
    import errno
    import stat as st

    if path.exists() or path.is_symlink():
        path.unlink()
    try:
        os.mknod(str(path), st.S_IFCHR | 0o666, os.makedev(61, 0))
    except PermissionError:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    try:
        os.close(os.open(str(path), os.O_RDWR))
    except OSError as exc:
        assert exc.errno == errno.ENXIO, exc
    else:
        raise AssertionError(f"{path} opens: not a dead node")
    return path


def run_server_once(args, env, timeout=30, python=None):
    """Run the api_server expecting it to exit by itself (refusals, argparse errors)."""
    return subprocess.run(
        [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )


def make_ca(directory: Path, name="kf test CA"):
    """A self-signed CA in `directory` (ca.crt, and its key kept in memory): the tests' stand-in
    for the fleet CA (roles/kunlun_stack/tasks/fleet_ca.yml; ECDSA P-384 as there)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    (directory / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return {"cert": cert, "key": key, "file": directory / "ca.crt"}


def issue_cert(ca, directory: Path, stem="server", names=("127.0.0.1", "localhost"), client=False):
    """A server key (0600) and certificate from `ca` (make_ca's) for `names` (IP addresses and
    DNS names), as the fleet CA issues a serving host's (roles/serve/tasks/tls.yml): (key, cert).
    With client, a client certificate instead (extended key usage clientAuth)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def san(name):
        try:
            return x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            return x509.DNSName(name)

    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca["cert"].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([san(n) for n in names]), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]),
            critical=False,
        )
        .sign(ca["key"], hashes.SHA256())
    )
    key_file, cert_file = directory / (stem + ".key"), directory / (stem + ".crt")
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_file.chmod(0o600)
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_file, cert_file


class Server:
    def __init__(self, args, env, log_path: Path, python=None, port=None, ca_file=None):
        # port: a restart of a server at the address it had (a worker the gateway knows).
        # ca_file: the server serves TLS (its args name a key and a certificate) from that CA.
        self.port = port or free_port()
        self.ca_file = ca_file
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [
                python or sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                *args,
            ],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.base = f"{'https' if ca_file else 'http'}://127.0.0.1:{self.port}"

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def wait_ready(self, budget=30.0):
        import ssl
        import urllib.request

        context = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2, context=context) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"server not ready within {budget}s:\n{self.output()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
