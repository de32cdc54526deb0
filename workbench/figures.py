"""Figures written small: every PNG the workbench draws is a 128-colour palette image.

matplotlib writes RGBA PNGs; a report's plots (lines, bands, text on white) use few colours, so
Pillow's median-cut quantisation to a 128-colour palette keeps them visually the same at about a third
of the bytes (the committed reports' PNGs went from 13.9 MB to 4.3 MB). Other formats (SVG, PDF) are
written as they are.
"""

from __future__ import annotations

import io
from pathlib import Path

PALETTE_COLOURS = 128


def palette_png(data: bytes) -> bytes:
    """PNG bytes ``data`` re-encoded as a 128-colour palette PNG (median cut, no dithering, optimised).

    Raises:
        PIL.UnidentifiedImageError: ``data`` is not an image.
    """
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        q = im.convert("RGB").quantize(PALETTE_COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out = io.BytesIO()
    q.save(out, format="PNG", optimize=True)
    return out.getvalue()


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write the matplotlib figure ``fig`` to ``path`` (format from the suffix; PNG as a palette image);
    returns the path. Does not close the figure."""
    out = Path(path)
    if out.suffix.lower() != ".png":
        fig.savefig(out, dpi=dpi)
        return out
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    out.write_bytes(palette_png(buf.getvalue()))
    return out


def shrink_png(path: str | Path) -> tuple[int, int]:
    """Re-encode the PNG at ``path`` as a palette image in place, unless it already is one; returns
    (bytes before, bytes after)."""
    from PIL import Image

    p = Path(path)
    before = p.stat().st_size
    with Image.open(p) as im:
        if im.mode == "P":
            return before, before
    p.write_bytes(palette_png(p.read_bytes()))
    return before, p.stat().st_size
