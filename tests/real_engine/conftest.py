"""The real-engine lane: ONE real vLLM 0.15.1 and ONE stand-in for the whole session
(engine.start_pair), both started from the serve role's rendering. Starting the real one
costs about half a minute of CPU: nothing here starts a second."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import contract  # noqa: E402
import engine  # noqa: E402


@pytest.fixture(scope="session")
def servers(tmp_path_factory):
    if not engine.ENGINE_PYTHON.exists():
        pytest.skip(engine.NO_ENGINE)
    pair = engine.start_pair(tmp_path_factory.mktemp("real-engine"))
    yield pair
    for srv in pair.values():
        srv.stop()


@pytest.fixture(scope="session")
def real_routes(servers, tmp_path_factory):
    """Every route the real server registers, read from its program (engine.route_table)."""
    return engine.route_table(servers["real"], tmp_path_factory.mktemp("routes") / "routes.json")


@pytest.fixture(scope="session")
def clients(servers):
    return {name: contract.Client(srv) for name, srv in servers.items()}


@pytest.fixture(params=["real", "standin"])
def which(request):
    return request.param
