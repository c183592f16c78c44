"""The report of one upgrade (kunlun_fleet/upgrade/report.py), rendered from the recorded
results in tests/fixtures/upgrade/: report.md and report.html carry the outcome and its
reason, every failed gate with both figures, the golden-output verdict with the failing
prompt; the page fetches nothing and parses; every outcome renders; the schema check names
what is missing. The fixtures' gates and verdicts are what module_utils/canary.py and
library/golden_outputs.py compute from their figures (checked here, so they cannot drift)."""

import copy
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

import golden_outputs as go
from ansible.module_utils import canary

from kunlun_fleet.upgrade import report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade"
NAMES = ("promoted", "rolled-back", "rolled-back-outputs", "refused", "would-upgrade")


def fixture(name):
    return json.loads((FIXTURES / (name + ".json")).read_text())


class Page(HTMLParser):
    """Every start tag with its attributes, and whether the tags nest."""

    VOID = {"meta", "br", "img", "input", "link", "hr", "rect", "line", "polyline", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.stack, self.errors, self.text = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append("</%s> closes %s" % (tag, self.stack[-1] if self.stack else "nothing"))
            return
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(page):
    p = Page()
    p.feed(page)
    p.close()
    return p


@pytest.mark.parametrize("name", NAMES)
def test_the_fixtures_gate_and_verdict_are_what_the_product_computes(name):
    r = fixture(name)
    assert report.check(r)["outcome"] == name.split("-outputs")[0]
    if r["gate"] is None:
        assert r["figures"] is None and r["outputs"] is None
        return
    again = canary.gate(r["figures"]["baseline"], dict(r["figures"]["canary"], outputs=r["outputs"]), r["thresholds"])
    assert again == r["gate"]
    assert set(r["outputs"]) >= {"passed", "verdict", "failing", "divergences"}
    assert r["outputs"]["prompts"] == go.DEFAULT_PROMPTS


def test_rolled_back_names_each_failed_gate_with_both_figures():
    r = fixture("rolled-back")
    md, page = report.render_md(r), report.render_html(r)
    first = md.splitlines()
    assert first[0] == "# Upgrade 0.15.1-4885de2 -> 0.15.1-a17c0de: ROLLED-BACK"
    assert first[2].startswith("**rolled-back**: throughput: canary output 302 tok/s is 33 % of the baseline's 905")
    text = "".join(parse(page).text)
    assert "ROLLED-BACK" in text and r["reason"] in text
    failed = [g for g in r["gate"]["gates"] if not g["passed"]]
    assert [g["name"] for g in failed] == ["single_stream", "throughput", "ttft_p99", "tpot_p99"]
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    for g, (b, c) in zip(
        failed, (("35.1", "32"), ("905", "302")) + (("0.412", "1.62"), ("0.0341", "0.104")), strict=True
    ):
        assert g["message"] in md and g["message"] in text
        assert "%s tok/s" % b in rows[g["name"]] or "%s s" % b in rows[g["name"]], rows[g["name"]]
        assert rows[g["name"]].rstrip().endswith("| FAIL |")
        assert b in g["message"] and c in g["message"]
    assert "| throughput | 905 tok/s | 302 tok/s | 33 % | >= 859 tok/s (95 % of the baseline) | FAIL |" in md
    assert "| failures | 0 | 0 | - | <= 0 | PASS |" in md
    assert "- PASS: outputs equal: 8 prompts, 32 tokens each, token for token" in md
    assert "hosts changed: none of 3" in md


def test_the_golden_verdict_names_the_failing_prompt_and_both_continuations():
    r = fixture("rolled-back-outputs")
    md, page = report.render_md(r), report.render_html(r)
    verdict = r["outputs"]["verdict"]
    assert verdict.startswith("outputs differ: prompt 3 ('def fibonacci(n):') diverges at token 5 of 32")
    d = r["outputs"]["divergences"][3]
    text = "".join(parse(page).text)
    for rendered in (md, text):
        assert "FAIL: " + verdict in rendered
        line = "prompt 3 ('def fibonacci(n):') diverges at token 5 of 32: after %r, baseline %r, canary %r" % (
            d["context"],
            d["baseline_excerpt"],
            d["canary_excerpt"],
        )
        assert line in rendered
    assert "| golden outputs | recorded | differ | - | must pass | FAIL |" in md
    assert r["reason"] in md.splitlines()[2]


def test_promoted():
    r = fixture("promoted")
    md = report.render_md(r)
    assert md.startswith("# Upgrade 0.15.1-4885de2 -> 0.15.1-7d3e9b0: PROMOTED\n")
    assert "## Canary gate: PASS" in md and "All gates passed." in md
    assert "hosts changed: 3 of 3: kf-node-1, kf-node-2, kf-node-3" in md
    page = report.render_html(r)
    assert page.count("<svg") == 2 and 'id="plot-figures"' in page and 'id="plot-series"' in page
    # the two series, one polyline each, one point a second
    p = parse(page)
    lines = [a for t, a in p.tags if t == "polyline"]
    assert [a["stroke"] for a in lines] == [report.BASELINE_COLOR, report.CANARY_COLOR]
    assert [len(a["points"].split()) for a in lines] == [30, 30]


def test_a_stack_with_another_driver_shows_each_hosts_xre_before_and_after():
    r = fixture("promoted")
    assert "XRE before" not in report.render_md(r)  # a plan that read no driver: no columns
    for h in r["hosts"]:
        h.update(driver_before="5.0.21.26", driver_after="5.0.21.27")
    md = report.render_md(r)
    assert "| host | role | stack before | stack after | XRE before | XRE after | changed | note |" in md, md
    assert "| kf-node-2 | canary | 0.15.1-4885de2 | 0.15.1-7d3e9b0 | 5.0.21.26 | 5.0.21.27 | yes |" in md, md
    assert "<th>XRE before</th>" in report.render_html(r)


@pytest.mark.parametrize("name", NAMES)
def test_every_outcome_renders_a_page_that_fetches_nothing(name):
    r = fixture(name)
    page = report.render_html(r)
    p = parse(page)
    assert not p.errors and p.stack == [], (p.errors, p.stack)
    tags = [t for t, _ in p.tags]
    assert "script" not in tags and "link" not in tags and "iframe" not in tags and "img" not in tags
    for tag, attrs in p.tags:
        for key in ("src", "href", "xlink:href", "action", "data", "srcset", "poster"):
            assert key not in attrs, (tag, attrs)
    assert "url(" not in page and "@import" not in page
    assert r["outcome"].upper() in "".join(p.text)
    md = report.render_md(r)
    assert md.splitlines()[2].startswith("**%s**: %s" % (r["outcome"], r["reason"][:60]))
    for step in r["steps"]:
        assert "| %s |" % step["name"] in md


def test_refused_and_check_runs_say_why_there_are_no_figures():
    refused = report.render_html(fixture("refused"))
    assert "<svg" not in refused
    assert "No figures: the run was refused before any host changed." in refused
    assert "0.25.1-2fda97b (known-bad)" in refused
    md = report.render_md(fixture("refused"))
    assert "Not measured: the run was refused before any host changed." in md
    assert "causal_conv1d keyword mismatch" in md.splitlines()[2]
    assert "| preflight | FAIL |" in md and "| promote | skipped |" in md
    check = report.render_md(fixture("would-upgrade"))
    assert check.startswith("# Upgrade 0.15.1-4885de2 -> 0.15.1-7d3e9b0 (check): WOULD-UPGRADE\n")
    assert "- check run: yes: nothing was changed" in check
    assert "| switch canary | would run |" in check


def test_figures_without_a_gate_are_shown_unjudged():
    r = fixture("rolled-back")
    r.update(
        outcome="failed", gate=None, outputs=None, reason="the golden-output check failed: no answer from kf-node-2"
    )
    md = report.render_md(r)
    assert "## Figures (not judged)" in md
    assert "| output tok/s | 905 tok/s | 302 tok/s | 33 % |" in md
    assert "<svg" in report.render_html(r)


def test_a_figure_not_measured_is_said_on_the_plot():
    r = fixture("rolled-back")
    r["figures"]["canary"]["ttft_p99_s"] = None
    svg = report.plot_bars(r)
    assert svg.count("canary not measured") == 1
    assert svg.count('fill="%s"><title>canary' % report.CANARY_COLOR) == 3


def test_write_and_the_resume_line(tmp_path):
    r = fixture("rolled-back")
    out = report.out_dir_for(tmp_path / "reports", r["started"])
    assert out == str(tmp_path / "reports" / "upgrade-20261204T180211Z")
    paths = report.write(r, out)
    assert sorted(paths) == ["html", "md", "results"]
    assert [Path(paths[k]).name for k in ("results", "md", "html")] == ["results.json", "report.md", "report.html"]
    text = Path(paths["results"]).read_text()
    assert json.loads(text) == r
    assert text == json.dumps(r, sort_keys=True, indent=2) + "\n"
    assert Path(paths["md"]).read_text() == report.render_md(r)
    assert Path(paths["html"]).read_text() == report.render_html(r)
    assert sorted(p.name for p in Path(out).iterdir()) == ["report.html", "report.md", "results.json"]
    line = report.resume_line(r, "reports/upgrade-20261204T180211Z")
    assert line == (
        "upgrade 0.15.1-4885de2 -> 0.15.1-a17c0de: rolled-back (throughput: canary output 302 tok/s is 33 % of the "
        "baseline's 905 (needs >= 95 %) (and 3 more gates)); report: reports/upgrade-20261204T180211Z/report.html"
    )
    assert "\n" not in report.resume_line(dict(r, reason="line one\nline two"), out)
    check = report.resume_line(fixture("would-upgrade"), out)
    assert check.startswith("upgrade 0.15.1-4885de2 -> 0.15.1-7d3e9b0 (check): would-upgrade (")


def test_optional_keys_may_be_absent():
    r = fixture("refused")
    for key in report.OPTIONAL:
        r.pop(key)
    assert "Not measured" in report.render_md(r)
    assert report.check(r)["gate"] is None


@pytest.mark.parametrize("key", report.REQUIRED)
def test_the_schema_check_names_a_missing_key(key, tmp_path):
    r = fixture("promoted")
    del r[key]
    with pytest.raises(report.SchemaError, match="missing required key '%s'" % key):
        report.write(r, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written
    with pytest.raises(report.SchemaError, match="'%s'" % key):
        report.render_html(r)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(outcome="rolled back"), "outcome is 'rolled back'; one of failed, promoted, refused, rolled-back"),
        (dict(format=2), "format is 2; this report reads format 1"),
        (dict(to_status="good"), "to_status is 'good'; one of validated, candidate, known-bad, or null"),
        (dict(check="no"), "check is 'no'; true or false"),
        (dict(hosts=[{"host": "kf-node-1"}]), r"hosts\[0\] lacks stack_before, stack_after, changed, note"),
        (dict(figures={"canary": {}}), "figures needs both 'baseline' and 'canary'"),
        (dict(gate={"passed": True}), "gate is not what module_utils/canary.gate"),
    ],
)
def test_the_schema_check_names_a_bad_value(change, message):
    r = copy.deepcopy(fixture("promoted"))
    r.update(change)
    with pytest.raises(report.SchemaError, match=message):
        report.check(r)
    r = fixture("promoted")
    r["steps"][2]["result"] = "done"
    with pytest.raises(report.SchemaError, match=r"steps\[2\] \(distribute image\) result is 'done'"):
        report.check(r)


def test_figures_and_series_as_canary_measure_returns_them():
    """library/canary_measure.py's figures carry more than the gate reads (requests, errors,
    the canary's outputs) and its last second may be a part of one: both render as they are."""
    r = fixture("rolled-back")
    r["figures"]["canary"].update(outputs=r["outputs"], requests=320, completed=320, errors={}, duration_s=30.4)
    r["series"]["canary"][-1] = [30.4, 290.0]
    assert report.render_md(r) == report.render_md(fixture("rolled-back"))
    lines = [a for t, a in parse(report.render_html(r)).tags if t == "polyline"]
    # the axis runs to the tick above, 40 s; the plot from x 64 to 744
    assert lines[1]["points"].split()[-1].startswith("%.1f," % (64 + 680 * 30.4 / 40))
