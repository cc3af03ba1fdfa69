"""A real Chromium (Debian's `chromium` package) that opens a page headless and says what rendered.

Not a test module: tests call ``render_check``. CI installs the browser (.ci/run); a developer
without it gets a skip that says so, CI gets a failure.
"""
from __future__ import annotations

import html
import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Headless, nothing fetched or synced in the background: the page must render from itself alone.
# The window is a common laptop screen (1366 x 768): "the first screen" in the report's tests.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--window-size=1366,768")
# Appended to a copy of the page: after the load event, what the browser made of every image.
_PROBE = """<script>window.addEventListener("load", () => {
  const images = Array.from(document.images);
  const probe = document.createElement("pre");
  probe.id = "render-probe";
  probe.textContent = JSON.stringify({
    images: images.length,
    drawn: images.filter(i => i.complete && i.naturalWidth > 0).length,
    sections: Array.from(document.querySelectorAll("h2")).map(h => h.textContent),
    height: document.body.scrollHeight,
    // Accessibility and the first screen: every figure's alt text and caption; where the summary sits.
    described: Array.from(document.querySelectorAll("figure")).filter(f => f.querySelector("img[alt]")
      && f.querySelector("img").alt.trim() && f.querySelector("figcaption")
      && f.querySelector("figcaption").textContent.trim()).length,
    figures: document.querySelectorAll("figure").length,
    summary_bottom: (s => s ? s.getBoundingClientRect().bottom : null)(document.getElementById("summary")),
    viewport: window.innerHeight});
  document.body.appendChild(probe);
});</script>"""


def require_chromium() -> str:
    """The browser's path; skips locally without it, fails on CI (which must have it)."""
    if CHROMIUM:
        return CHROMIUM
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed: .ci/run installs Debian's package before the tests")
    pytest.skip("needs Chromium for the page-rendering check: apt-get install chromium (README, 'Tests')")


def render_check(page: pathlib.Path, work: pathlib.Path) -> dict:
    """Opens a copy of the page (with the probe) in headless Chromium; returns images, drawn, sections, height."""
    browser = require_chromium()
    work.mkdir(parents=True, exist_ok=True)
    copy = work / "probed.html"
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    out = subprocess.run([browser, *FLAGS, f"--user-data-dir={work / 'profile'}", "--virtual-time-budget=10000",
                          "--dump-dom", copy.resolve().as_uri()], capture_output=True, text=True, timeout=180)
    found = re.search(r'<pre id="render-probe">(.*?)</pre>', out.stdout, re.S)
    assert found, f"the page did not finish loading in Chromium: {out.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1)))
