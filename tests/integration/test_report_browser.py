"""The report in a real browser: headless Chromium renders it offline, screenshots it at 1280 px and
dumps the DOM after load. The template's inline self-check script has by then written into <body>
data-* attributes: JS/resource errors, figures that failed to render, and the page's scroll width.

Skips when no Chromium is installed (CI installs Debian's `chromium`).
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import report_fixtures as rf

from tspbench.report import build_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH"),
    pytest.mark.xdist_group("report-browser"),  # the module-scoped report is built once, on one worker
]
WIDTH = 1280


def chromium(url: str, tmp: Path, *args: str, height: int = 2000) -> subprocess.CompletedProcess:
    """One headless run, offline-leaning flags, its own profile; console messages go to stderr."""
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={tmp / 'profile'}",
        f"--window-size={WIDTH},{height}",
        *args,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


class BodyAttrs(HTMLParser):
    """The <body> attributes and whether the claims table is in the dumped DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.body: dict[str, str] = {}
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = {k: v or "" for k, v in a.items()}
        if a.get("id"):
            self.ids.add(a["id"])


def render(html: Path, tmp: Path, height: int = 2000) -> tuple[BodyAttrs, list[str]]:
    proc = chromium(html.as_uri(), tmp, "--dump-dom", height=height)
    assert proc.returncode == 0, proc.stderr[-2000:]
    parsed = BodyAttrs()
    parsed.feed(proc.stdout)
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return parsed, console


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("browser")
    src = rf.write_records(tmp / "run.jsonl")
    ctx = rf.write_context(tmp)  # validation and plan records: the trust section's and the Pareto page's figures
    return build_report([src, *ctx], out=tmp / "report.html", claims=rf.CLAIMS)


def test_screenshot_at_1280(report, tmp_path):
    png = tmp_path / "report.png"
    proc = chromium(report.as_uri(), tmp_path, f"--screenshot={png}")
    assert proc.returncode == 0 and png.exists(), proc.stderr[-2000:]
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])  # IHDR
    assert width == WIDTH and height > 0


def test_renders_clean(report, tmp_path):
    dom, console = render(report, tmp_path)
    b = dom.body
    assert b.get("data-checked") == "1", "self-check script did not run"
    assert console == [], console  # the page logs nothing, so any console line is a problem
    assert b["data-errors"] == "0"
    n_figs = len(re.findall(r"<figure[^>]*>\s*<strong>[^<]*</strong>\s*<img", report.read_text()))
    assert int(b["data-figures"]) == n_figs > 0
    assert b["data-figures-ok"] == "true", f"figures not rendered: {b['data-figures-bad']}"
    assert int(b["data-scroll-width"]) <= WIDTH, "page overflows horizontally at 1280 px"
    assert {"claims-table", "evidence", "summary-table", "failures-table"} <= dom.ids
    assert {"trust-table", "fig-trust-img", "fig-pareto-0-img", "pareto-table-0"} <= dom.ids
    # what fits (fit records) and the communication figure with its cost-model crossover (crossover records)
    assert {"fig-fit-img", "fig-comm-img"} <= dom.ids
    text = report.read_text()
    comm = text[text.index('id="fig-comm"') : text.index("</figure>", text.index('id="fig-comm"'))]
    assert "from S=32,768 (cost model" in comm and "interpolat" in comm
    fit = text[text.index('id="fig-fit"') : text.index("</figure>", text.index('id="fig-fit"'))]
    assert "Modelled" in fit and "not measured" in fit


def test_self_check_catches_breakage(report, tmp_path):
    """Non-vacuity: a broken figure and a throwing script must be reported by the same check."""
    broken = tmp_path / "broken.html"
    text = report.read_text().replace(
        "</main>",
        '<figure id="bad"><img id="bad-img" src="data:image/png;base64,AAAA"></figure>'
        "<script>throw new Error('boom')</script></main>",
    )
    broken.write_text(text)
    dom, console = render(broken, tmp_path)
    assert dom.body["data-figures-ok"] == "false" and "bad-img" in dom.body["data-figures-bad"]
    assert int(dom.body["data-errors"]) >= 2
    assert any("boom" in line for line in console)


FIRST_SCREEN = 800


def test_first_screen_has_verdict_and_claims(report, tmp_path):
    """At 1280×800 the verdict and the start of the claims table are on screen, one row per published number,
    and no figure is an empty box (figures without data are folded into one list)."""
    png = tmp_path / "first.png"
    proc = chromium(report.as_uri(), tmp_path, f"--screenshot={png}", height=FIRST_SCREEN)
    assert proc.returncode == 0 and png.exists(), proc.stderr[-2000:]
    assert struct.unpack(">II", png.read_bytes()[16:24]) == (WIDTH, FIRST_SCREEN)
    dom, _ = render(report, tmp_path, height=FIRST_SCREEN)
    b = dom.body
    assert int(b["data-viewport-height"]) <= FIRST_SCREEN
    assert 0 <= int(b["data-verdict-top"]) < int(b["data-claims-top"]) < FIRST_SCREEN - 60
    assert int(b["data-claim-rows"]) == len(rf.CLAIMS)
    assert b["data-empty-figures"] == "0"


def test_no_empty_panels_when_data_is_missing(tmp_path):
    """Non-vacuity of the empty-panel check: a report with data for one figure only shows that figure and
    folds the others into a list, not empty boxes."""
    src = rf.write_minimal(tmp_path / "min.jsonl")
    html = build_report([src], out=tmp_path / "min.html", claims=rf.CLAIMS)
    dom, _ = render(html, tmp_path, height=FIRST_SCREEN)
    assert dom.body["data-empty-figures"] == "0" and int(dom.body["data-figures"]) >= 1
    assert "figures-without-data" in dom.ids
