"""kunlun_fleet/bench/plan.py: hosts needed for a concurrency, an output rate and a TTFT
p99 limit from the measured per-host curve, never beyond what it covers (then the fleet
curve, a fleet point that met the load, or a refusal), and the `kunlun-fleet plan`
command."""

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
    assert a["binding"] == "TTFT p99" and a["fleet_output_tok_s"] == pytest.approx(
        a["hosts"] * plan.interpolate(CURVE, c)[0], rel=1e-3
    )
    assert "5000 concurrent requests, TTFT p99 <= 2 s: %d hosts" % a["hosts"] in plan.describe(a)


def test_concurrency_alone_within_the_measured_range():
    a = plan.hosts_needed(CURVE, concurrency=2000)
    assert a["hosts"] == 1 and a["covered"] and a["per_host_concurrency"] == 2000


def test_concurrency_beyond_the_measured_range_is_not_covered_and_says_so():
    a = plan.hosts_needed(CURVE, concurrency=5000)
    # fewer than 3 hosts would put more than 2048 on each: never answered from the flat extrapolation
    assert a["hosts"] == 3 and a["covered"] is False
    assert "above the highest per-host concurrency measured (2048)" in a["uncovered"]
    refused = plan.answer(results_of(CURVE), concurrency=5000)
    assert refused["hosts"] is None and "cannot be planned" in plan.describe(refused)


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


def results_of(host_curve, fleet=(), hosts=("h1", "h2", "h3")):
    """results.json's points for a per-host curve (every host alike) and fleet points."""
    points = []
    for h in hosts:
        for c, t, f in host_curve:
            points.append(
                {
                    "label": "%s-c%d" % (h, c),
                    "target": h,
                    "kind": "single" if c == 1 else "sweep",
                    "concurrency": c,
                    "counts": True,
                    "client": {"output_tok_s": t, "ttft_ms": {"p99": f * 1000}},
                }
            )
    for c, t, f in fleet:
        points.append(
            {
                "label": "fleet-c%d" % c,
                "target": "fleet",
                "kind": "single" if c == 1 else "sweep",
                "concurrency": c,
                "counts": True,
                "client": {"output_tok_s": t, "ttft_ms": {"p99": f * 1000}},
            }
        )
    return {
        "meta": {"hosts": list(hosts), "host_count": len(hosts), "inventory_host_count": len(hosts)},
        "points": points,
    }


# The run of issue #29: per host only the single stream (bench_host_concurrency: [1]),
# through the gateway the single stream and 1024 concurrent from 3 hosts (6068 tok/s).
ONE_POINT = [(1, 34.5, 0.12)]
FLEET_1024 = [(1, 33.0, 0.15), (1024, 6068.0, 1.6)]


def test_a_one_point_per_host_curve_answers_nothing_beyond_itself():
    res = results_of(ONE_POINT, FLEET_1024)
    a = plan.answer(res, output_tok_s=5000)
    # not "145 hosts (1 concurrent each)": the fleet of 3 measured 6068 tok/s
    assert (a["hosts"], a["bound"], a["basis"]) == (3, "at most", "fleet point")
    text = plan.describe(a)
    assert text.startswith("5000 output tok/s: at most 3 hosts")
    assert "the per-host curve (one point, 1 concurrent (34 tok/s)" in text and "6068 output tok/s at 1024" in text
    big = plan.answer(res, output_tok_s=20000)
    assert big["hosts"] is None  # not 580 hosts: neither curve shows where a host saturates
    assert "one point" in big["note"] and "bench_host_concurrency" in big["note"]
    c = plan.answer(res, concurrency=1000, ttft_p99_s=2.0)
    assert (c["hosts"], c["bound"], c["basis"]) == (3, "at most", "fleet point")
    assert plan.answer(res, concurrency=5000, ttft_p99_s=2.0)["hosts"] is None


def test_the_fleet_curve_answers_where_the_per_host_curve_does_not_reach():
    # per host: 1 and 64 concurrent, still rising; the fleet (3 hosts) up to 3072, flat at its end
    fleet = [(192, 4650.0, 0.9), (768, 9600.0, 1.5), (3072, 9700.0, 9.0)]
    res = results_of([(1, 35.0, 0.1), (64, 1550.0, 0.8)], fleet)
    a = plan.answer(res, output_tok_s=20000)
    # fleet curve per host: 3200 tok/s at 256, 3233 at 1024 (flat): 7 hosts at 1024 each
    assert (a["hosts"], a["basis"], a["bound"]) == (7, "fleet curve", "exact")
    assert a["per_host_concurrency"] == 1024.0
    assert "still rising at its end" in a["note"] and "from the fleet curve (3 hosts" in a["note"]
    # what the per-host curve covers it still answers itself: TTFT p99 crosses 0.5 s at 37 per host
    b = plan.answer(res, output_tok_s=800, ttft_p99_s=0.5)
    assert (b["basis"], b["hosts"], b["per_host_concurrency"]) == ("per-host curve", 1, 37.0)


def test_an_output_rate_at_the_end_of_a_rising_curve_is_not_covered():
    rising = [(1, 35.0, 0.1), (64, 1550.0, 0.8), (256, 3200.0, 1.5)]
    a = plan.hosts_needed(rising, output_tok_s=5000)
    assert a["covered"] is False and "has not flattened" in a["uncovered"]
    # with a TTFT limit crossed inside the curve the operating point is measured
    b = plan.hosts_needed(rising, output_tok_s=5000, ttft_p99_s=1.0)
    assert b["covered"] is True and b["per_host_concurrency"] < 256


def test_the_report_section_says_what_each_curve_covers():
    section = plan.plan_section(results_of(ONE_POINT, FLEET_1024), [{"output_tok_s": 5000}])
    assert section["per_host_extent"].startswith("one point, 1 concurrent")
    assert section["fleet_hosts"] == 3 and section["fleet_curve"] == [
        {"concurrency": 341.3, "output_tok_s": 2022.7, "ttft_p99_s": 1.6}
    ]
    assert section["answers"][0]["text"].startswith("5000 output tok/s: at most 3 hosts")


@pytest.mark.parametrize("text, seconds", [("2s", 2.0), ("500ms", 0.5), ("2", 2.0), ("1.5m", 90.0)])
def test_parse_seconds(text, seconds):
    assert plan.parse_seconds(text) == seconds


def _results_file(tmp_path):
    points = []
    for h in ("h1", "h2"):
        for c, t, f in CURVE:
            points.append(
                {
                    "label": "%s-c%d" % (h, c),
                    "target": h,
                    "kind": "single" if c == 1 else "sweep",
                    "concurrency": c,
                    "counts": True,
                    "client": {"output_tok_s": t, "ttft_ms": {"p99": f * 1000}},
                }
            )
    points.append(
        {
            "label": "h1-c4096",
            "target": "h1",
            "kind": "sweep",
            "concurrency": 4096,
            "counts": False,
            "client": {"output_tok_s": 99999.0, "ttft_ms": {"p99": 1.0}},
        }
    )
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
    one = tmp_path / "one.json"
    one.write_text(json.dumps(results_of(ONE_POINT, FLEET_1024)))
    rc = cli.main(["plan", "--output-tok-s", "5000", "--results", str(one)])
    out = capsys.readouterr().out
    assert rc == 0 and "5000 output tok/s: at most 3 hosts" in out
    assert "per-host curve (one point, 1 concurrent" in out and "fleet curve per host, 3 hosts" in out


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


def test_plan_and_stacks_refuse_bad_input_with_the_refusal_code(tmp_path, capsys):
    # Every command refuses input it cannot use with 3 (docs/cli.md, exit codes); plan and
    # stacks once exited 1 for it, the code of an error.
    from kunlun_fleet import cli, runner

    assert cli.main(["plan", "--concurrency", "10", "--results", str(tmp_path / "none.json")]) == runner.REFUSED
    assert "no bench results" in capsys.readouterr().err
    assert cli.main(["plan", "--results", str(tmp_path / "none.json")]) == runner.REFUSED
    assert cli.main(["stacks", "-i", str(tmp_path / "no-inventory")]) == runner.REFUSED
    assert "not a directory" in capsys.readouterr().err
