"""kunlun_fleet/bench/plan.py: hosts needed for a concurrency, an output rate and a TTFT
p99 limit from the measured per-host curve, and the `kunlun-fleet plan` command."""

import json

import pytest

from kunlun_fleet import cli
from kunlun_fleet.bench import plan

# One host as the notes measured it, roughly: (concurrency, output tok/s, TTFT p99 s).
CURVE = [(1, 35.0, 0.1), (64, 1550.0, 0.8), (256, 3200.0, 1.5), (1024, 3300.0, 12.0), (2048, 3300.0, 30.0)]


def test_interpolation_between_and_beyond_the_measured_points():
    assert plan.interpolate(CURVE, 64) == (1550.0, 0.8)
    tput, ttft = plan.interpolate(CURVE, 160)
    assert tput == pytest.approx(1550 + (160 - 64) / 192 * 1650) and ttft == pytest.approx(0.8 + 0.5 * 0.7)
    assert plan.interpolate(CURVE, 4096) == (3300.0, None)  # flat throughput, TTFT unknown
    assert plan.interpolate(CURVE, 0.5) == (17.5, 0.1)


def test_concurrency_with_a_ttft_limit():
    a = plan.hosts_needed(CURVE, concurrency=5000, ttft_p99_s=2.0)
    # 5000 / N concurrent per host must keep TTFT p99 <= 2 s: between 256 (1.5 s) and 1024 (12 s)
    c = 5000 / a["hosts"]
    assert plan.interpolate(CURVE, c)[1] <= 2.0
    assert plan.interpolate(CURVE, 5000 / (a["hosts"] - 1))[1] > 2.0
    assert a["binding"] == "TTFT p99" and a["fleet_output_tok_s"] == pytest.approx(a["hosts"] * plan.interpolate(CURVE, c)[0], rel=1e-3)
    assert "5000 concurrent requests, TTFT p99 <= 2 s: %d hosts" % a["hosts"] in plan.describe(a)


def test_concurrency_alone_may_go_beyond_the_measured_range_and_says_so():
    a = plan.hosts_needed(CURVE, concurrency=5000)
    assert a["hosts"] == 1 and "above the highest measured (2048)" in a["note"]


def test_output_rate_with_and_without_a_ttft_limit():
    a = plan.hosts_needed(CURVE, output_tok_s=5000)
    assert a["hosts"] == 2 and a["per_host_concurrency"] == 1024  # the best measured output: 3300 at 1024
    b = plan.hosts_needed(CURVE, output_tok_s=5000, ttft_p99_s=2.0)
    # TTFT p99 reaches 2 s between 256 (1.5 s) and 1024 (12 s): at about 293 concurrent, 3205 tok/s
    assert b["hosts"] == 2 and b["per_host_concurrency"] == pytest.approx(292.6, abs=0.1)
    assert b["ttft_p99_s"] == 2.0 and b["fleet_output_tok_s"] == pytest.approx(2 * 3204.8, abs=0.5)
    c = plan.hosts_needed(CURVE, output_tok_s=20000, ttft_p99_s=2.0)
    assert c["hosts"] == 7


def test_a_ttft_limit_below_the_curve_cannot_be_bought_with_hosts():
    a = plan.hosts_needed(CURVE, concurrency=100, ttft_p99_s=0.05)
    assert a["hosts"] is None and "more hosts cannot bring it down" in a["note"]
    assert plan.describe(a).endswith("more hosts cannot bring it down")


def test_no_curve_no_plan():
    assert plan.hosts_needed([], concurrency=10)["hosts"] is None


@pytest.mark.parametrize("text, seconds", [("2s", 2.0), ("500ms", 0.5), ("2", 2.0), ("1.5m", 90.0)])
def test_parse_seconds(text, seconds):
    assert plan.parse_seconds(text) == seconds


def _results_file(tmp_path):
    points = []
    for h in ("h1", "h2"):
        for c, t, f in CURVE:
            points.append({"label": "%s-c%d" % (h, c), "target": h, "kind": "single" if c == 1 else "sweep",
                           "concurrency": c, "counts": True,
                           "client": {"output_tok_s": t, "ttft_ms": {"p99": f * 1000}}})
    points.append({"label": "h1-c4096", "target": "h1", "kind": "sweep", "concurrency": 4096, "counts": False,
                   "client": {"output_tok_s": 99999.0, "ttft_ms": {"p99": 1.0}}})
    run = tmp_path / "reports" / "bench-20260101T000000Z"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"meta": {"hosts": ["h1", "h2"]}, "points": points}))
    return run / "results.json"


def test_the_curve_is_the_mean_of_the_hosts_and_skips_points_that_do_not_count(tmp_path):
    from kunlun_fleet.bench import results

    res = results.load(str(_results_file(tmp_path)))
    curve = plan.per_host_curve(res)
    assert [c for c, _, _ in curve] == [1, 64, 256, 1024, 2048]
    assert curve[2] == (256, 3200.0, 1.5)


def test_plan_command(tmp_path, capsys):
    path = _results_file(tmp_path)
    rc = cli.main(["plan", "--concurrency", "5000", "--ttft-p99", "2s", "--results", str(path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "5000 concurrent requests, TTFT p99 <= 2 s:" in out and "hosts" in out
    assert "assumption: Load spread evenly over the hosts by the gateway" in out
    rc = cli.main(["plan", "--concurrency", "100", "--ttft-p99", "10ms", "--results", str(path)])
    assert rc == 1 and "cannot be planned" in capsys.readouterr().out


def test_bench_command_builds_the_playbook_run(monkeypatch, tmp_path):
    seen = {}

    def run_playbook(command, playbook, args, **kwargs):
        seen.update(command=command, playbook=playbook, args=args, **kwargs)
        return 0

    monkeypatch.setattr("kunlun_fleet.runner.run_playbook", run_playbook)
    inv = tmp_path / "inv"
    inv.mkdir()
    rc = cli.main(["bench", "-i", str(inv), "--concurrency", "1,64", "--requests", "50", "--check", "-v"])
    assert rc == 0
    assert (seen["command"], seen["playbook"], seen["inventory"]) == ("bench", "playbooks/bench.yml", str(inv))
    args = seen["args"]
    assert json.loads(args[args.index("-e") + 1]) == {"bench_concurrency": [1, 64], "bench_requests": 50}
    assert "--check" in args and args[-1] == "-v"


def test_bench_command_refuses_bad_concurrency(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "-i", "x", "--concurrency", "1,0"])
    assert "concurrency values must be 1 or more" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "-i", "x", "--duration", "5", "--requests", "3"])
