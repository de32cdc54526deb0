"""workbench/figures.py: plots written as small palette PNGs, and the committed reports kept small."""

import io
import re
from pathlib import Path

import pytest

from workbench.figures import PALETTE_COLOURS, palette_png, save_figure, shrink_png

ROOT = Path(__file__).resolve().parents[1]
REPORTS_MAX_BYTES = 5_000_000  # reports/ holds the reports the docs cite; the rest are regenerated (wb report)


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    for i in range(5):
        ax.plot(range(10), [(x * (i + 1)) % 7 for x in range(10)], label=f"run {i}")
        ax.fill_between(range(10), [0] * 10, [i] * 10, alpha=0.2)
    ax.legend()
    return plt, fig


def test_a_png_is_written_as_a_palette_image_that_looks_the_same(tmp_path):
    from PIL import Image, ImageChops

    plt, fig = _figure()
    raw = io.BytesIO()
    fig.savefig(raw, format="png", dpi=80)
    path = save_figure(fig, tmp_path / "f.png", dpi=80)
    plt.close(fig)
    with Image.open(path) as small, Image.open(raw) as full:
        assert small.mode == "P" and small.size == full.size
        assert len(small.getcolors(PALETTE_COLOURS + 1) or []) <= PALETTE_COLOURS
        diff = ImageChops.difference(small.convert("RGB"), full.convert("RGB")).convert("L")
        # no pixel further than a few grey levels on average: the plot reads the same
        assert sum(diff.getdata()) / (diff.size[0] * diff.size[1]) < 2.0
    assert path.stat().st_size < len(raw.getvalue())


def test_other_formats_are_written_as_they_are(tmp_path):
    plt, fig = _figure()
    out = save_figure(fig, tmp_path / "f.svg")
    plt.close(fig)
    assert out.read_text().lstrip().startswith("<?xml")


def test_shrinking_twice_changes_nothing_the_second_time(tmp_path):
    plt, fig = _figure()
    fig.savefig(tmp_path / "f.png", dpi=80)
    plt.close(fig)
    before, after = shrink_png(tmp_path / "f.png")
    assert after < before
    assert shrink_png(tmp_path / "f.png") == (after, after)


def test_not_an_image_is_an_error():
    from PIL import UnidentifiedImageError

    with pytest.raises(UnidentifiedImageError):
        palette_png(b"not a png")


def test_committed_reports_are_small_palette_pngs_named_by_finding():
    files = [p for p in (ROOT / "reports").rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    assert total <= REPORTS_MAX_BYTES, f"reports/ is {total / 1e6:.1f} MB (at most 5): keep the reports the docs cite"
    from PIL import Image

    rgba = [str(p.relative_to(ROOT)) for p in files if p.suffix == ".png" and Image.open(p).mode != "P"]
    assert not rgba, f"not palette PNGs (re-encode them with workbench.figures.shrink_png): {rgba}"
    by_issue = [p.name for p in (ROOT / "reports").iterdir() if re.match(r"issue\d", p.name)]
    assert not by_issue, f"report folders named after an issue, not a finding: {by_issue}"
