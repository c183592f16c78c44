"""The upgrade report as a person sees it: report.html written (kunlun_fleet/upgrade/report.py)
from the recorded results in tests/fixtures/upgrade/, opened in headless Chromium (Debian's
`chromium`, the bench page's way: tests/bench/test_bench_page.py), screenshotted. Where the
canary was measured, both plots are drawn and each shows the baseline's and the canary's
colours; a refused upgrade's page has no plot and neither colour. No fleet needed."""

import json
import subprocess
from pathlib import Path

import pytest

import benchkit as bk
from test_bench_page import PY, browser

from kunlun_fleet.upgrade import report

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade"

# Injected into a copy of the page: where the browser laid out each plot.
PROBE = """<script>
window.addEventListener('load', function () {
  var out = [];
  document.querySelectorAll('svg.plot').forEach(function (svg) {
    var r = svg.getBoundingClientRect();
    out.push({id: svg.id, x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height});
  });
  var pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify({plots: out, height: document.documentElement.scrollHeight});
  document.body.appendChild(pre);
});
</script>"""

# In the bench venv (Pillow): per box (the whole page when none), the pixels of each colour
# (within 12 per channel: the edges are anti-aliased, the fills are exact).
MEASURE = r"""
import json, sys
from PIL import Image
img = Image.open(sys.argv[1]).convert("RGB")
boxes, colours = json.loads(sys.argv[2]), json.loads(sys.argv[3])
boxes = boxes or [[0, 0, img.size[0], img.size[1]]]
out = []
for x, y, w, h in boxes:
    px = list(img.crop((int(x), int(y), int(x + w), int(y + h))).getdata())
    counts = {}
    for name, hexa in colours.items():
        ref = tuple(int(hexa[i:i + 2], 16) for i in (1, 3, 5))
        counts[name] = sum(1 for p in px if all(abs(a - b) <= 12 for a, b in zip(p, ref)))
    counts["ink"] = sum(1 for p in px if sum(p) < 720) / max(len(px), 1)
    out.append(counts)
print(json.dumps(out))
"""
WIDTH = 1300
LEGEND = 14 * 14  # the pixels of one legend swatch (report._legend)
COLOURS = {"baseline": report.BASELINE_COLOR, "canary": report.CANARY_COLOR}


def probe(page: Path, tmp: Path):
    probed = tmp / ("probe-" + page.parent.name + ".html")
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    # laid out at the screenshot's width (the height does not change the layout)
    dom = browser("--window-size=%d,1000" % WIDTH, "--virtual-time-budget=5000", "--dump-dom", probed.as_uri())
    text = dom.split('<pre id="probe">', 1)[1].split("</pre>", 1)[0]
    return json.loads(text.replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


def shoot(results, tmp: Path, name: str):
    """Write the report, lay it out, screenshot it; (the plots' boxes, their colour counts)."""
    if not PY.exists():
        pytest.skip(bk.NO_VENV)
    out = tmp / name
    paths = report.write(results, out)
    page = Path(paths["html"])
    info = probe(page, tmp)
    shot = out / "report.png"
    browser("--window-size=%d,%d" % (WIDTH, info["height"] + 50), "--screenshot=%s" % shot, page.as_uri())
    boxes = [[p["x"], p["y"], p["w"], p["h"]] for p in info["plots"]]
    proc = subprocess.run(
        [str(PY), "-c", MEASURE, str(shot), json.dumps(boxes), json.dumps(COLOURS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return info["plots"], json.loads(proc.stdout)


def fixture(name):
    return json.loads((FIXTURES / (name + ".json")).read_text())


@pytest.mark.parametrize("name", ["promoted", "rolled-back"])
def test_both_plots_show_the_baseline_and_the_canary(name, tmp_path):
    plots, counts = shoot(fixture(name), tmp_path, name)
    assert [p["id"] for p in plots] == ["plot-figures", "plot-series"]
    assert all(p["w"] > 600 and p["h"] > 200 for p in plots), plots
    bars, series = counts
    # beyond each plot's legend swatch: four bars of each colour, 50-odd px wide (the
    # shortest, the rolled-back canary's throughput, 33 % on a 400 % scale, is 20 px tall),
    # and a 2.5 px line across 680 px
    for who in ("baseline", "canary"):
        assert bars[who] - LEGEND > 4 * 50 * 25, (name, bars)
        assert series[who] - LEGEND > 600, (name, series)
    assert bars["ink"] > 0.1 and series["ink"] > 0.02, counts


def test_the_measure_sees_a_missing_canary(tmp_path):
    """The check can fail: the canary measured nothing, so only the baseline is drawn."""
    r = fixture("rolled-back")
    r["figures"]["canary"] = {k: None for k in r["figures"]["canary"]}
    r["series"]["canary"] = []
    plots, counts = shoot(r, tmp_path, "no-canary")
    assert [p["id"] for p in plots] == ["plot-figures", "plot-series"]
    for box in counts:
        assert box["baseline"] - LEGEND > 600, counts
        assert box["canary"] <= LEGEND, counts  # the legend's swatch alone


def test_a_refused_upgrade_has_no_plot(tmp_path):
    plots, counts = shoot(fixture("refused"), tmp_path, "refused")
    assert plots == []
    (page,) = counts  # the whole page
    assert page["baseline"] == 0 and page["canary"] == 0, page
    assert page["ink"] > 0.01  # the page itself rendered
    text = (tmp_path / "refused" / "report.html").read_text()
    assert "No figures: the run was refused before any host changed." in text
