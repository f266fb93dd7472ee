"""`gangwatch report --html` opened in a real browser, one report per incident class: headless Chromium renders
every plot, logs no console error, the screenshot is not blank, and the first plot is the class's and names the
culprit.

A simulated job (16 ranks on 4 nodes: tp 2, pp 2, dp 4) with one fault per class (an Xid 79, a thermal
straggler, a hung data loader, silent data corruption), each on rank 5 (node n001), is replayed with its raw
telemetry into the embedded chDB store (no server needed), and its incident is reported as a user types it.
Chromium then:
- dumps the DOM it built (`--dump-dom`): the plots are the class's, its own first, every figure holds an <svg>
  with drawing in it, and the first one's text names rank 5 on n001 as the culprit;
- logs the page's console to stderr (`--enable-logging=stderr --v=0`): no message from the page at all (the page
  has no script, so any is an error: a broken SVG, a blocked load). The same capture is first shown to catch a
  console.error and a broken SVG path on a probe page, so a Chromium that logs nothing cannot pass by silence;
- screenshots the page, and each plot's SVG on its own: neither is blank (pixel spread).
Nothing may be fetched: no script, stylesheet, font or image from elsewhere (checked on the file), and every
host name resolves to nothing while Chromium runs.

Needs Debian's `chromium` (CI: `apt-get install -y chromium fonts-liberation`); skipped, saying so, without it.
GANGWATCH_REPORT_SHOTS=DIR keeps each class's page and first-plot screenshots there (CLASS.png, CLASS-first.png).
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gangwatch.cli import main
from tests.helpers import need

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium")
CULPRIT = "rank 5 (n001)"
# class -> (its fault, the plots of its page with the first one first, text of the first plot that names the culprit)
CASES = {
    "fail_stop": ("xid79:100:r5", ["failstop", "heatmap", "stages"], [f"{CULPRIT} (culprit)", f"{CULPRIT}: silent",
                                                                     "Xid 79 n001"]),
    "fail_slow": ("thermal_straggler:60:r5:0.3", ["failslow", "deviation", "heatmap", "stages"],
                  [f"{CULPRIT} (culprit)", f"{CULPRIT}: +"]),
    "hang": ("dataloader_hang:100:r5", ["stacks", "failstop", "heatmap", "stages"],
             ["CULPRIT: 1 in", "ranks 5 on n001"]),
    "sdc": ("sdc:100:r5", ["sdc", "heatmap", "stages"], [f"{CULPRIT}: dissents"]),
}
DRAWN = ("path", "rect", "image", "use", "line", "polyline", "polygon")
CONSOLE = re.compile(r":CONSOLE(?:\(\d+\)|:\d+)?\]\s*(?P<msg>.*?),?\s*source:\s*(?P<src>\S+)")


@pytest.fixture(scope="module")
def chromium() -> str:
    return need(CHROMIUM, "chromium is not installed (Debian: apt-get install -y chromium fonts-liberation)")


def browse(binary: str, profile: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium on `url` with the page's console on stderr; no host name resolves."""
    cmd = [binary, "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage", "--no-first-run",
           "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={profile}",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0", *args, url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def console(done: subprocess.CompletedProcess, url: str) -> list[str]:
    """The console messages the page at `url` logged."""
    return [m["msg"] for m in CONSOLE.finditer(done.stderr) if m["src"].startswith(url)]


def pixels_spread(png: Path) -> tuple[float, float]:
    """(standard deviation of the grey levels, share of pixels that are not near-white) of a PNG."""
    import matplotlib.image as mpimg

    img = mpimg.imread(png)[..., :3].mean(axis=2)
    return float(img.std()), float((img < 0.95).mean())


class Dom(HTMLParser):
    """Per `figure[data-plot]`: its <svg> elements, and per svg how many drawing elements it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, list[int]] = {}
        self.figure: str | None = None
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.urls += [v for k, v in attrs if k in ("src", "href", "xlink:href") and v]
        if tag == "figure" and a.get("data-plot"):
            self.figure = a["data-plot"]
            self.plots[self.figure] = []
        elif self.figure is not None and tag == "svg":
            self.plots[self.figure].append(0)
        elif self.figure is not None and tag in DRAWN and self.plots[self.figure]:
            self.plots[self.figure][-1] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self.figure = None


@pytest.fixture(scope="module", params=sorted(CASES))
def page(request, tmp_path_factory) -> tuple[str, Path]:
    """(class, the HTML report of the incident of that class of a replayed simulated job)."""
    cls = request.param
    work = tmp_path_factory.mktemp(cls)
    assert main(["simulate", "--tp", "2", "--pp", "2", "--dp", "4", "--gpus-per-node", "4", "--duration", "200",
                 "--name", cls, "--fault", CASES[cls][0], "--out", str(work / "sim")]) == 0
    assert main(["replay", str(work / "sim" / f"{cls}.jsonl.gz"), "--telemetry", "--out", str(work / "out"),
                 "-q"]) == 0
    from gangwatch.sinks.store import open_store

    store = open_store(f"chdb:{work / 'out' / 'store'}", create=False)
    try:
        ids = [r["id"] for r in store.query(f"SELECT id FROM gw_incidents FINAL WHERE class = '{cls}'")]
    finally:
        store.close()
    assert len(ids) == 1, ids
    html = work / "incident.html"
    assert main(["report", "--incident", ids[0], "--out", str(work / "out"), "--html", str(html)]) == 0
    return cls, html


def test_the_console_capture_catches_an_error(chromium, tmp_path):
    probe = tmp_path / "probe.html"
    probe.write_text('<!DOCTYPE html><html><body><svg><path d="M0 0 L x"/></svg>'
                     '<script>console.error("gw-probe")</script></body></html>', encoding="utf-8")
    url = probe.as_uri()
    got = console(browse(chromium, tmp_path / "profile", url, "--dump-dom"), url)
    assert any("gw-probe" in m for m in got) and any("<path> attribute d" in m for m in got), got


def test_every_plot_renders_in_chromium_and_the_first_names_the_culprit(chromium, page, tmp_path):
    cls, path = page
    _, plots, names = CASES[cls]
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"<(script|link|iframe|object|embed)\b", text, re.I)
    assert not re.search(r"url\(\s*['\"]?(?!#|data:)", text) and "@import" not in text

    url = path.as_uri()
    dumped = browse(chromium, tmp_path / "profile", url, "--dump-dom")
    assert console(dumped, url) == []
    dom = Dom()
    dom.feed(dumped.stdout)
    assert list(dom.plots) == plots, dom.plots  # the class's own plot first, in page order
    for name, svgs in dom.plots.items():
        assert len(svgs) == 1 and svgs[0] >= 10, (name, svgs)  # one svg each, with its axes, ticks and data
    assert all(u.startswith(("#", "data:")) for u in dom.urls), [u for u in dom.urls if not u.startswith("#")][:5]

    svgs = re.findall(r"<svg\b.*?</svg>", dumped.stdout, re.S)
    assert len(svgs) == len(plots)
    first = html.unescape(re.sub(r"<[^>]+>", "\n", svgs[0]))
    assert all(n in first for n in names), (cls, names, sorted({t.strip() for t in first.split("\n") if t.strip()}))

    shot = tmp_path / "page.png"
    done = browse(chromium, tmp_path / "profile", url, f"--screenshot={shot}", "--window-size=1300,1100")
    assert console(done, url) == []
    spread, inked = pixels_spread(shot)
    assert spread > 0.05 and inked > 0.02, (spread, inked)
    keep = os.environ.get("GANGWATCH_REPORT_SHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, Path(keep) / f"{cls}.png")

    for k, svg in enumerate(svgs):
        alone = tmp_path / f"plot{k}.svg"
        alone.write_text(svg, encoding="utf-8")
        png = tmp_path / f"plot{k}.png"
        shown = browse(chromium, tmp_path / "profile", alone.as_uri(), f"--screenshot={png}", "--window-size=1100,900")
        assert console(shown, alone.as_uri()) == []
        spread, inked = pixels_spread(png)
        assert spread > 0.05 and inked > 0.01, (k, spread, inked)
        if keep and k == 0:
            shutil.copyfile(png, Path(keep) / f"{cls}-first.png")
