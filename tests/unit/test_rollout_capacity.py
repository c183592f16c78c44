"""The serve rollout's arithmetic (module_utils/rollout_capacity.py) and the serve_rollout
module against in-process /metrics servers: batch sizes under the max-unavailable bound
(3 and 40 hosts), the per-host capacity read from a real bench results.json's curve, and
a batch that would overload the rest held back, then let go, or stopping the rollout."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible.module_utils import rollout_capacity as rc
import serve_rollout

# The per-host curve of the sim fleet's bench (reports/bench-20261130T193349Z/results.json).
SIM_CURVE = [
    {"concurrency": 1, "output_tok_s": 34.7, "ttft_p99_s": 0.089},
    {"concurrency": 64, "output_tok_s": 1038.5, "ttft_p99_s": 3.556},
    {"concurrency": 256, "output_tok_s": 1572.1, "ttft_p99_s": 13.995},
]
HOSTS40 = ["p800-%02d" % i for i in range(1, 41)]


# --- max-unavailable and batches -------------------------------------------------------


@pytest.mark.parametrize(
    "value,total,hosts",
    [
        ("10%", 3, 1),
        ("10%", 40, 4),
        ("10%", 9, 1),
        ("10%", 15, 1),
        ("10%", 20, 2),
        ("25%", 40, 10),
        ("50%", 3, 1),
        ("100%", 3, 3),
        (1, 40, 1),
        ("2", 40, 2),
        (5, 3, 3),
        ("10%", 0, 0),
    ],
)
def test_parse_bound(value, total, hosts):
    assert rc.parse_bound(value, total) == hosts


@pytest.mark.parametrize("value", ["0", 0, "-1", "0%", "150%", "ten", "1.5", ""])
def test_parse_bound_refuses(value):
    with pytest.raises(ValueError):
        rc.parse_bound(value, 40)


def test_plan_40_hosts_all_changed_canary_then_four():
    serial, why = rc.plan(HOSTS40, 40, "10%")
    assert serial == [1, 4]
    assert "at most 4 host(s)" in why
    # As Ansible cuts them: 1, then 4 x 9, then the last 3.
    assert batches(HOSTS40, serial) == [1] + [4] * 9 + [3]


def test_plan_default_3_hosts_one_at_a_time():
    assert rc.plan(["kf-node-1", "kf-node-2", "kf-node-3"], 3, "10%")[0] == [1, 1]


def test_plan_nothing_to_restart_has_no_batches():
    assert rc.plan([], 40, "10%") == ([], "no host needs a restart")


def test_plan_explicit_batches_are_of_the_fleet():
    # Two hosts need a restart out of 40: "50%" is still 20 hosts (of the fleet), not 1.
    serial, why = rc.plan(HOSTS40[:2], 40, "10%", batches=[1, "50%"])
    assert serial == [1, 20] and "explicit" in why


def test_plan_shrinks_to_what_the_load_lets_out():
    serial, why = rc.plan(HOSTS40, 40, "10%", can_go=2)
    assert serial == [1, 2] and "shrunk to 2" in why
    # No headroom at all: one at a time; each batch then waits at its gate.
    assert rc.plan(HOSTS40, 40, "10%", can_go=0)[0] == [1, 1]
    # Headroom beyond the bound changes nothing.
    assert rc.plan(HOSTS40, 40, "10%", can_go=30)[0] == [1, 4]


def batches(hosts, serial):
    """Ansible's cut of a host list by a serial list (playbook_executor: the last repeats)."""
    out, i, left = [], 0, list(hosts)
    while left:
        n = serial[min(i, len(serial) - 1)]
        out.append(len(left[:n]))
        left, i = left[n:], i + 1
    return out


# --- capacity from the bench's curve ----------------------------------------------------


def test_host_capacity_best_output():
    cap, note = rc.host_capacity(SIM_CURVE)
    assert cap == 256 and note == "a host carries 256 concurrent: its best output, 1572 tok/s, on the bench's curve"


def test_host_capacity_within_ttft_limit_interpolates_like_the_plan():
    cap, _ = rc.host_capacity(SIM_CURVE, ttft_p99_s=2.0)
    # The capacity plan's answer for TTFT p99 <= 2 s: 35.7 concurrent per host.
    assert cap == pytest.approx(35.7, abs=0.1)


def test_host_capacity_without_a_curve():
    assert rc.host_capacity([]) == (None, "no per-host curve (no bench results)")
    cap, note = rc.host_capacity(SIM_CURVE, ttft_p99_s=0.01)
    assert cap is None and "no measured concurrency" in note


def test_host_capacity_reads_a_real_results_json(tmp_path):
    from kunlun_fleet.bench import plan

    results = {
        "meta": {"hosts": ["h1"]},
        "points": [
            {
                "target": "h1",
                "kind": "sweep",
                "counts": True,
                "concurrency": c,
                "client": {"output_tok_s": t, "ttft_ms": {"p99": f * 1000}},
            }
            for c, t, f in [(1, 34.7, 0.089), (64, 1038.5, 3.556), (256, 1572.1, 13.995)]
        ],
    }
    section = plan.plan_section(results, [])
    # What results.json stores as plan.per_host_curve is what the rollout reads.
    assert rc.host_capacity(section["per_host_curve"])[0] == 256


# --- load and the verdict ---------------------------------------------------------------

METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen3.8-27B-INT8-W8A8-Dynamic"} 200.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen3.8-27B-INT8-W8A8-Dynamic"} 31.0
vllm:num_requests_running_total_not_this 9.0
vllm:generation_tokens_total{model_name="x"} 12345.0
"""


def test_in_flight_reads_running_and_waiting():
    assert rc.in_flight(METRICS) == 231.0
    assert rc.in_flight("") == 0.0


def test_assess_40_hosts_under_load():
    loads = {h: 150.0 for h in HOSTS40}  # 6000 in flight, 256 a host
    v = rc.assess(loads, HOSTS40[:4], 256)
    assert v["ok"] and v["remaining"] == 36 and v["capacity_left"] == 36 * 256
    assert v["can_go"] == 40 - 24  # ceil(6000 / 256) = 24 hosts must stay
    # At 240 a host (9600) the rest of a 4-host batch carries 9216: too much.
    loads = {h: 240.0 for h in HOSTS40}
    v = rc.assess(loads, HOSTS40[:4], 256)
    assert not v["ok"] and v["can_go"] == 2
    assert rc.plan(HOSTS40, 40, "10%", can_go=v["can_go"])[0] == [1, 2]


def test_assess_hosts_down_carry_nothing():
    # A host that did not answer is not serving: its batch slot costs no capacity.
    v = rc.assess({"a": 100.0, "b": 100.0}, ["c"], 256)
    assert v["ok"] and v["out"] == [] and v["remaining"] == 2


def test_assess_idle_or_new_fleet_always_fits():
    assert rc.assess({}, ["a"], 256)["ok"]
    assert rc.assess({"a": 0.0}, ["a"], 256)["ok"]


def test_a_batch_of_hosts_that_serve_nothing_goes_however_loaded_the_rest():
    # 1000 in flight on two hosts of 256: already over, and a batch of the serving "a" waits;
    # a batch of hosts that serve nothing takes nothing out (starting them adds capacity).
    loads = {"a": 500.0, "b": 500.0}
    assert not rc.assess(loads, ["a"], 256)["ok"]
    v = rc.assess(loads, ["c", "d"], 256)
    assert v["ok"] and v["out"] == [] and v["remaining"] == 2


# --- the hosts that serve nothing: after the canary, together ---------------------------


def test_rollout_order_puts_the_hosts_that_serve_nothing_first():
    assert rc.rollout_order(["a", "b", "c", "d"], {"a": 1.0, "c": 0.0}) == ["b", "d", "a", "c"]
    assert rc.rollout_order(["a", "b"], {}) == ["a", "b"]


def test_first_deploy_of_39_bare_hosts_is_a_canary_then_one_wave():
    serial, why = rc.plan(HOSTS40[:39], 39, "10%", idle=39)
    assert serial == [1, 38]
    assert batches(HOSTS40[:39], serial) == [1, 38]
    assert "none serves" in why
    # Bounded by serve_idle_batch_max: the wave in parts of at most 16.
    serial, why = rc.plan(HOSTS40[:39], 39, "10%", idle=39, idle_batch_max=16)
    assert batches(HOSTS40[:39], serial) == [1, 16, 16, 6] and "serve_idle_batch_max" in why


def test_hosts_added_to_a_serving_fleet_start_together_then_the_serving_ones_in_batches():
    # 5 new hosts and 35 serving ones that need a restart, out of 40: the canary and the 4
    # other new hosts, then the serving ones 4 at a time (10 %).
    hosts = rc.rollout_order(HOSTS40, {h: 10.0 for h in HOSTS40[5:]})
    assert hosts[:5] == HOSTS40[:5]
    serial, why = rc.plan(hosts, 40, "10%", idle=5)
    assert batches(hosts, serial) == [1, 4] + [4] * 8 + [3]
    assert "then the 35 serving host(s)" in why
    # A single idle host is the canary; the serving ones follow in batches.
    assert batches(HOSTS40, rc.plan(HOSTS40, 40, "10%", idle=1)[0]) == [1] + [4] * 9 + [3]
    # None idle: as before.
    assert rc.plan(HOSTS40, 40, "10%", idle=0) == rc.plan(HOSTS40, 40, "10%")
    # Explicit batches stay the operator's.
    assert rc.plan(HOSTS40, 40, "10%", batches=[1, 2], idle=10)[0] == [1, 2]


def test_assess_without_curve_only_the_bound():
    v = rc.assess({"a": 1e6}, ["a"], None)
    assert v["ok"] and v["capacity_left"] is None


# --- the module against real HTTP servers -------------------------------------------------


class Metrics(ThreadingHTTPServer):
    def __init__(self, running, context=None):
        self.running = running
        self.scheme = "https" if context is not None else "http"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(h):  # noqa: N805
                body = (
                    'vllm:num_requests_running{model_name="m"} %s\nvllm:num_requests_waiting{model_name="m"} 0\n'
                    % self.running()
                ).encode()
                h.send_response(200)
                h.send_header("Content-Length", str(len(body)))
                h.end_headers()
                h.wfile.write(body)

            def log_message(h, *a):  # noqa: N805
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        if context is not None:  # a worker serving TLS with a certificate of the fleet CA
            self.socket = context.wrap_socket(self.socket, server_side=True)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        return "%s://127.0.0.1:%d" % (self.scheme, self.server_address[1])


class Done(Exception):
    pass


def run(args, check=False):
    def exit_json(self, **kw):
        raise Done(dict(kw, failed=False))

    def fail_json(self, **kw):
        raise Done(dict(kw, failed=True))

    with mock.patch.multiple(basic.AnsibleModule, exit_json=exit_json, fail_json=fail_json):
        with patch_module_args(dict(args, _ansible_check_mode=check)):
            with pytest.raises(Done) as err:
                serve_rollout.main()
    return err.value.args[0]


@pytest.fixture
def fleet():
    load = {"a": 200, "b": 200, "c": 200}
    servers = {h: Metrics(lambda h=h: load[h]) for h in load}
    yield load, {h: s.url for h, s in servers.items()}
    for s in servers.values():
        s.shutdown()


def test_module_plan_reads_the_fleet_and_shrinks(fleet):
    load, workers = fleet
    workers["d"] = "http://127.0.0.1:9"  # does not answer: not serving
    res = run({"mode": "plan", "workers": workers, "hosts": ["a", "b", "c", "d"], "curve": SIM_CURVE})
    assert not res["failed"] and res["load"] == 600 and res["not_answering"] == ["d"]
    # 600 in flight, 256 a host: 3 of 3 serving hosts must stay; the batches shrink to 1.
    assert res["serial"] == [1, 1]
    # d serves nothing: it comes first, the canary, then the serving ones.
    assert res["hosts"] == ["d", "a", "b", "c"] and res["idle"] == ["d"]
    assert "4 of 4 host(s) need a restart" in res["msg"] and "600 request(s) in flight" in res["msg"]


def test_module_reads_tls_workers_with_the_ca_given_as_text(tmp_path):
    """Workers serving TLS (docs/gateway.md "Workers over TLS"): read with the fleet CA's
    certificate given as text (ca_cert), which needs no file where the module runs; without
    it they do not answer (their certificate is not verified), so they count as not serving."""
    import ssl
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "artifacts"))
    from standin_helpers import issue_cert, make_ca

    ca = make_ca(tmp_path, "kf rollout test CA")
    key, cert = issue_cert(ca, tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    servers = {h: Metrics(lambda: 100, context) for h in ("a", "b")}
    try:
        workers = {h: s.url for h, s in servers.items()}
        assert all(u.startswith("https://") for u in workers.values())
        args = {"mode": "plan", "workers": workers, "hosts": ["a"], "curve": SIM_CURVE}
        res = run(dict(args, ca_cert=ca["file"].read_text()))
        assert not res["failed"] and res["load"] == 200 and res["not_answering"] == [], res
        res = run(args)
        assert res["not_answering"] == ["a", "b"], res
    finally:
        for s in servers.values():
            s.shutdown()


def test_module_plan_nothing_to_do(fleet):
    _, workers = fleet
    res = run({"mode": "plan", "workers": workers, "hosts": [], "curve": SIM_CURVE})
    assert res["serial"] == [] and "no host needs a restart" in res["msg"]


def test_module_gate_goes_when_the_rest_carries_it(fleet):
    load, workers = fleet
    load.update(a=100, b=100, c=100)
    res = run({"mode": "gate", "workers": workers, "hosts": ["a"], "curve": SIM_CURVE})
    assert res["ok"] and not res["failed"] and res["capacity_left"] == 512
    assert res["msg"] == (
        "capacity: 300 request(s) in flight on 3 serving host(s); taking out a leaves 2 host(s) x 256 = 512 "
        "concurrent (a host carries 256 concurrent: its best output, 1572 tok/s, on the bench's curve): go"
    )


def test_module_gate_waits_then_goes():
    """600 in flight > 512 left: the gate polls; host a's load drops at its third read (by
    count, not by a clock the module's start-up time would shift), then the gate goes."""
    reads = []

    def load_a():
        reads.append(1)
        return 200 if len(reads) < 3 else 50

    servers = {"a": Metrics(load_a), "b": Metrics(lambda: 200), "c": Metrics(lambda: 200)}
    try:
        workers = {h: srv.url for h, srv in servers.items()}
        res = run(
            {"mode": "gate", "workers": workers, "hosts": ["a"], "curve": SIM_CURVE, "timeout": 20, "interval": 0.3}
        )
    finally:
        for srv in servers.values():
            srv.shutdown()
    assert res["ok"] and not res["failed"] and len(reads) == 3
    # Two waits of one interval each between the three reads.
    assert res["waited"] >= 0.6
    assert "go after waiting" in res["msg"]


def test_module_gate_stops_the_rollout_after_its_timeout(fleet):
    _, workers = fleet
    res = run({"mode": "gate", "workers": workers, "hosts": ["a"], "curve": SIM_CURVE, "timeout": 1, "interval": 0.3})
    assert res["failed"] and not res["ok"]
    assert "600 request(s) in flight on 3 serving host(s); taking out a leaves 2 host(s) x 256 = 512" in res["msg"]
    assert "the rollout stops here, this batch was not touched" in res["msg"]


def test_module_gate_check_mode_does_not_wait(fleet):
    _, workers = fleet
    res = run({"mode": "gate", "workers": workers, "hosts": ["a"], "curve": SIM_CURVE, "timeout": 60}, check=True)
    assert not res["failed"] and not res["ok"] and res["waited"] < 5
    assert "would wait up to 60 s" in res["msg"]


def test_module_gate_without_curve_says_only_the_bound_applies(fleet):
    _, workers = fleet
    res = run({"mode": "gate", "workers": workers, "hosts": ["a", "b"], "curve": []})
    assert res["ok"] and res["capacity"] is None
    assert "no per-host curve (no bench results)" in res["msg"] and "only serve_max_unavailable" in res["msg"]


def test_module_refuses_a_bad_bound(fleet):
    _, workers = fleet
    res = run({"mode": "plan", "workers": workers, "hosts": ["a"], "max_unavailable": "0%"})
    assert res["failed"] and "serve_max_unavailable" in res["msg"]
