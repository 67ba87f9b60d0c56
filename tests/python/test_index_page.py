"""The dump's index page renders in headless Chromium: a screenshot that is not blank, and a DOM
with the summary table and a graph picture (an inline SVG with Graphviz, DOT text without).

Chromium comes from Debian's `chromium` package (scripts/setup_env.sh installs it); the tests
skip only when it is missing."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch
from magi_compiler import _dump, magi_compile
from torch import nn

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"
)


class PageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.up = nn.Linear(32, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.up(self.norm(x))) * 0.5 + 1.0


def chromium(*args: str) -> str:
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("dumps")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(_dump.ENABLE_ENV, "1")
        mp.setenv(_dump.DIR_ENV, str(root))
        torch._dynamo.reset()
        model = magi_compile(PageModel())
        with torch.no_grad():
            model(torch.randn(4, 8, 32))
    (name,) = os.listdir(root)
    return os.path.join(root, name, "index.html")


def test_screenshot_is_not_blank(page, tmp_path):
    image = pytest.importorskip("PIL.Image", reason="pillow reads the screenshot (setup_env.sh)")
    shot = tmp_path / "page.png"
    chromium(f"--screenshot={shot}", "--window-size=1280,2000", f"file://{page}")
    pixels = image.open(shot).convert("L")
    assert pixels.size == (1280, 2000)
    histogram = pixels.histogram()
    background = max(histogram)
    # Text, tables and the graph cover a good part of the page: far from one flat colour.
    assert background < 0.97 * sum(histogram), "the screenshot is (nearly) one colour"
    assert sum(1 for n in histogram if n > 100) > 20, "too few distinct shades for a page"


def test_dom_has_the_summary_table_and_a_graph_picture(page):
    dom = chromium("--dump-dom", f"file://{page}")
    assert '<table id="summary">' in dom
    assert "aten::" in dom
    assert '<figure class="graph">' in dom
    if shutil.which("dot"):
        assert "<svg" in dom  # the final graph of each lowered graph, inline
    else:
        assert '<pre class="dot">' in dom
    assert 'id="timeline"' in dom and "offload/inference.json" in dom
