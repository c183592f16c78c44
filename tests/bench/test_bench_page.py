"""The bench report as a person sees it: report.html rendered (in the bench venv, with
matplotlib) from the results of a recorded local run, opened in headless Chromium
(Debian's `chromium`), screenshotted; every plot loaded and is not blank in the screenshot.
No fleet needed."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import benchkit as bk

pytestmark = pytest.mark.slow
FIXTURE = Path(__file__).parent / "fixtures" / "raw.json"
PY = bk.BENCH_VENV / "bin" / "python"

# Injected into a copy of the page: what the browser made of every image, and where it is.
PROBE = """<script>
window.addEventListener('load', function () {
  var out = [];
  document.querySelectorAll('img').forEach(function (img) {
    var r = img.getBoundingClientRect();
    out.push({alt: img.alt, complete: img.complete, w: img.naturalWidth, h: img.naturalHeight,
              x: r.left + window.scrollX, y: r.top + window.scrollY, cw: r.width, ch: r.height});
  });
  var pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify({images: out, height: document.documentElement.scrollHeight});
  document.body.appendChild(pre);
});
</script>"""

# In the bench venv (Pillow comes with aiperf): per box, distinct colours and the share of
# pixels that are not the page's white.
MEASURE = r"""
import json, sys
from PIL import Image
img = Image.open(sys.argv[1]).convert("RGB")
out = []
for x, y, w, h in json.loads(sys.argv[2]):
    box = img.crop((int(x), int(y), int(x + w), int(y + h)))
    px = list(box.getdata())
    out.append({"colours": len(set(px)), "ink": sum(1 for p in px if sum(p) < 720) / max(len(px), 1),
                "size": box.size})
print(json.dumps({"size": img.size, "boxes": out}))
"""


def chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("needs Debian's chromium (apt-get install chromium; scripts/install-system-deps.sh installs it)")


def browser(*args, timeout=120):
    cmd = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--no-first-run",
        "--disable-extensions",
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def probe(page: Path, tmp: Path):
    probed = tmp / ("probe-" + page.name)
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = browser("--virtual-time-budget=10000", "--dump-dom", probed.as_uri())
    text = dom.split('<pre id="probe">', 1)[1].split("</pre>", 1)[0]
    return json.loads(text.replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    if not PY.exists():
        pytest.skip(bk.NO_VENV)
    run = tmp_path_factory.mktemp("bench-20260101T000000Z")
    shutil.copy(FIXTURE, run / "raw.json")
    proc = subprocess.run(
        [str(PY), "-m", "kunlun_fleet.bench", "render", str(run)],
        cwd=str(bk.ROOT),
        env={"PYTHONPATH": str(bk.ROOT), "MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin", "HOME": str(run)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0].split(" ", 1)[0] in ("PASS", "FAIL")
    assert "report: %s" % (run / "report.html") in proc.stdout
    return run


def test_the_page_renders_its_plots(rendered, tmp_path):
    page = rendered / "report.html"
    info = probe(page, tmp_path)
    imgs = info["images"]
    assert [i["alt"] for i in imgs] == [
        "output tok/s vs concurrency",
        "TTFT percentiles vs concurrency",
        "TPOT percentiles vs concurrency",
    ]
    assert all(i["complete"] and i["w"] > 300 and i["h"] > 200 for i in imgs), imgs  # none broken
    shot = tmp_path / "report.png"
    browser("--window-size=1300,%d" % (info["height"] + 50), "--screenshot=%s" % shot, page.as_uri())
    boxes = [[i["x"], i["y"], i["cw"], i["ch"]] for i in imgs]
    proc = subprocess.run(
        [str(PY), "-c", MEASURE, str(shot), json.dumps(boxes)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = json.loads(proc.stdout)
    for img, box in zip(imgs, measured["boxes"], strict=True):
        # a drawn plot: lines, labels and a legend in many colours, not an empty frame
        assert box["colours"] > 50 and box["ink"] > 0.02, (img["alt"], box)
    # the gates are at the top of the page, above the first plot
    text = page.read_text()
    assert text.index("<h2>Gates") < text.index("<img")
    shutil.copy(shot, rendered / "report-screenshot.png")


def test_the_probe_sees_a_broken_image(rendered, tmp_path):
    """The check can fail: the same page with one image's data cut short."""
    text = (rendered / "report.html").read_text()
    start = text.index("base64,") + len("base64,")
    broken = tmp_path / "broken.html"
    broken.write_text(text[:start] + "iVBORw0KGgoAAAANSUhEUgAA" + text[text.index("'", start) :])
    imgs = probe(broken, tmp_path)["images"]
    assert imgs[0]["w"] == 0 and all(i["w"] > 0 for i in imgs[1:])
