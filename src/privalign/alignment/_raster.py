"""A small line-chart rasteriser on Pillow: the default PNG path of :mod:`privalign.alignment.figures`.

``privalign simulate`` draws two line charts (one line with error bars per method against N on a log2
axis). Matplotlib's import and layout cost more than the whole Monte Carlo engine on a few prompts,
so PNGs are drawn here instead: Pillow (already a dependency of matplotlib, imported in a few
milliseconds), antialiased by drawing at twice the size and downsampling, with matplotlib's DejaVu Sans font
when matplotlib is installed (found without importing it) and Pillow's built-in font otherwise. Matplotlib
stays the backend for PDF and on request (``backend="matplotlib"``).

The layout mirrors the matplotlib figure: fixed margins, a title, x ticks at the given values, "nice" y
ticks, a light grid, error bars with caps, and a legend in the corner that covers the fewest points.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Series", "render_line_chart", "nice_ticks"]

#: matplotlib's default colour cycle ("tab10"), so both backends colour methods alike.
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


@dataclass
class Series:
    """One line: ``x`` (positive, drawn on a log2 axis), ``y`` and its half error bar ``yerr`` (NaN = none).

    Non-finite ``y`` values leave a gap, as in matplotlib."""

    label: str
    x: np.ndarray
    y: np.ndarray
    yerr: np.ndarray = field(default_factory=lambda: np.zeros(0))


def nice_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Tick values covering ``[lo, hi]`` at a step of 1, 2, 2.5 or 5 × 10^k, about ``target`` of them.

    >>> nice_ticks(0.0, 1.0)
    [0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]
    >>> nice_ticks(3.0, 3.0)
    [3.0]
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"nice_ticks needs finite bounds, got {lo!r}, {hi!r}")
    if hi <= lo:
        return [float(lo)]
    raw = (hi - lo) / max(1, target - 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * mag >= raw * (1 - 1e-9))
    first = math.ceil(lo / step - 1e-9)
    last = math.floor(hi / step + 1e-9)
    return [k * step for k in range(first, last + 1)]


def _tick_label(v: float, step: float) -> str:
    if v == 0:
        return "0"
    if v < 0:
        return "\u2212" + _tick_label(-v, step)  # a minus sign, as matplotlib
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step < 1 else 0
    if step < 1 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-9:
        decimals += 1  # steps like 0.25
    return f"{v:.{decimals}f}"


@lru_cache(maxsize=8)
def _font(size: int) -> Any:
    from PIL import ImageFont

    spec = importlib.util.find_spec("matplotlib")  # locates the package without importing it
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            ttf = Path(root) / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
            if ttf.is_file():
                return ImageFont.truetype(str(ttf), size)
    return ImageFont.load_default(size)


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    h = hex_colour.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def _data_range(series: list[Series]) -> tuple[float, float, float, float]:
    xs, ys = [], []
    for s in series:
        x = np.asarray(s.x, dtype=float)
        y = np.asarray(s.y, dtype=float)
        e = np.asarray(s.yerr, dtype=float) if np.size(s.yerr) else np.zeros_like(y)
        e = np.where(np.isfinite(e), e, 0.0)
        ok = np.isfinite(y) & np.isfinite(x) & (x > 0)
        xs.append(np.log2(x[ok]))
        ys.extend([y[ok] - e[ok], y[ok] + e[ok]])
    xa = np.concatenate(xs) if xs else np.zeros(0)
    ya = np.concatenate(ys) if ys else np.zeros(0)
    x0, x1 = (float(xa.min()), float(xa.max())) if xa.size else (0.0, 1.0)
    y0, y1 = (float(ya.min()), float(ya.max())) if ya.size else (0.0, 1.0)
    px = 0.05 * (x1 - x0) if x1 > x0 else 0.5
    py = 0.05 * (y1 - y0) if y1 > y0 else max(0.5, abs(y0) * 0.05)
    return x0 - px, x1 + px, y0 - py, y1 + py


def render_line_chart(
    series: list[Series],
    path: str | Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    xticks: list[int],
    size: tuple[int, int] = (840, 540),
    supersample: int = 2,
) -> Path:
    """Draw ``series`` as a PNG of ``size`` pixels at ``path`` and return the path.

    Lines get :data:`PALETTE` colours in order; x is drawn on a log2 axis with a tick (labelled by its value)
    at each of ``xticks``.
    """
    from PIL import Image, ImageDraw

    S = int(supersample)
    W, H = size[0] * S, size[1] * S
    k = S * 120 / 72  # pixels per typographic point, as matplotlib at 120 dpi

    def pt(v: float) -> int:
        return max(1, round(v * k))

    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    # matplotlib figure's margins (fig.subplots_adjust(left=0.12, right=0.98, bottom=0.12, top=0.93))
    L, R, B, T = int(0.12 * W), int(0.98 * W), int((1 - 0.12) * H), int((1 - 0.93) * H)
    x0, x1, y0, y1 = _data_range(series)
    yt = nice_ticks(y0, y1)
    y0, y1 = min(y0, yt[0]), max(y1, yt[-1])

    def px(x: float) -> float:
        return L + (math.log2(x) - x0) / (x1 - x0) * (R - L)

    def py(y: float) -> float:
        return B - (y - y0) / (y1 - y0) * (B - T)

    ticks_font, label_font, title_font = _font(pt(10)), _font(pt(9)), _font(pt(12))
    grid = (224, 224, 224)
    for t in yt:
        yy = py(t)
        d.line([(L, yy), (R, yy)], fill=grid, width=pt(0.8))
        d.line([(L - pt(3.5), yy), (L, yy)], fill="black", width=pt(0.8))
        step = yt[1] - yt[0] if len(yt) > 1 else 1.0
        d.text((L - pt(5), yy), _tick_label(t, step), fill="black", font=ticks_font, anchor="rm")
    for t in xticks:
        xx = px(t)
        if L <= xx <= R:
            d.line([(xx, T), (xx, B)], fill=grid, width=pt(0.8))
            d.line([(xx, B), (xx, B + pt(3.5))], fill="black", width=pt(0.8))
            d.text((xx, B + pt(5)), str(t), fill="black", font=ticks_font, anchor="mt")
    d.rectangle([L, T, R, B], outline="black", width=pt(0.8))
    d.text(((L + R) / 2, T - pt(6)), title, fill="black", font=title_font, anchor="md")
    d.text(((L + R) / 2, B + pt(20)), xlabel, fill="black", font=ticks_font, anchor="mt")
    _vertical_text(img, ylabel, x=L - pt(40), y=(T + B) / 2, font=label_font)

    points: list[tuple[float, float]] = []
    for i, s in enumerate(series):
        colour = _rgb(PALETTE[i % len(PALETTE)])
        x = np.asarray(s.x, dtype=float)
        y = np.asarray(s.y, dtype=float)
        e = np.asarray(s.yerr, dtype=float) if np.size(s.yerr) else np.full_like(y, np.nan)
        run: list[tuple[float, float]] = []
        for xi, yi, ei in zip(x, y, e, strict=True):
            if not (np.isfinite(xi) and xi > 0 and np.isfinite(yi)):
                _polyline(d, run, colour, pt(1.5))
                run = []
                continue
            p = (px(xi), py(yi))
            run.append(p)
            points.append(p)
            if np.isfinite(ei) and ei > 0:
                top, bot = py(yi + ei), py(yi - ei)
                d.line([(p[0], top), (p[0], bot)], fill=colour, width=pt(1.5))
                for yy in (top, bot):
                    d.line([(p[0] - pt(2), yy), (p[0] + pt(2), yy)], fill=colour, width=pt(1.5))
        _polyline(d, run, colour, pt(1.5))
        r = pt(1.5)
        for p in run:
            d.ellipse([p[0] - r, p[1] - r, p[0] + r, p[1] + r], fill=colour)
    _legend(d, series, points, box=(L, T, R, B), font=_font(pt(9)), pt=pt)
    out = Path(path)
    # box-filter downsampling (2 × 2 → 1): the antialiasing, at a fraction of a Lanczos resize's cost
    small = img.reduce(S) if S > 1 else img
    if out.suffix.lower() == ".png":  # Pillow then imports its PNG plugin alone (format="PNG" loads five)
        small.save(out, compress_level=1)
    else:
        small.save(out, format="PNG", compress_level=1)
    return out


def _polyline(d: Any, run: list[tuple[float, float]], colour: tuple[int, int, int], width: int) -> None:
    """Segment by segment with round joins: Pillow's joined wide polyline thins steep segments."""
    for a, b in zip(run, run[1:], strict=False):
        d.line([a, b], fill=colour, width=width)
    r = width / 2
    for p in run[1:-1]:
        d.ellipse([p[0] - r, p[1] - r, p[0] + r, p[1] + r], fill=colour)


def _vertical_text(img: Any, text: str, *, x: float, y: float, font: Any) -> None:
    from PIL import Image, ImageDraw

    left, top, right, bottom = font.getbbox(text)
    tile = Image.new("RGB", (right - left + 4, bottom - top + 4), "white")
    ImageDraw.Draw(tile).text((2 - left, 2 - top), text, fill="black", font=font)
    tile = tile.rotate(90, expand=True)
    img.paste(tile, (int(x), int(y - tile.height / 2)))


def _legend(d: Any, series: list[Series], points: list, *, box: tuple, font: Any, pt: Any) -> None:
    """A framed legend in the inner corner covering the fewest data points (matplotlib's "best", simply)."""
    if not series:
        return
    L, T, R, B = box
    pad, swatch, gap = pt(4), pt(14), pt(2.5)
    rows = [(s.label, _rgb(PALETTE[i % len(PALETTE)])) for i, s in enumerate(series)]
    heights = [font.getbbox(lab or " ")[3] - font.getbbox(lab or " ")[1] for lab, _ in rows]
    row_h = max(max(heights), pt(5)) + gap
    w = max(font.getlength(lab) for lab, _ in rows) + swatch + 3 * pad
    h = row_h * len(rows) + pad
    corners = [
        (R - pad - w, T + pad),  # upper right
        (L + pad, T + pad),  # upper left
        (L + pad, B - pad - h),  # lower left
        (R - pad - w, B - pad - h),  # lower right
    ]

    def covered(c: tuple[float, float]) -> int:
        return sum(c[0] <= p[0] <= c[0] + w and c[1] <= p[1] <= c[1] + h for p in points)

    cx, cy = min(corners, key=covered)
    d.rectangle([cx, cy, cx + w, cy + h], fill="white", outline=(204, 204, 204), width=pt(0.8))
    for k, (label, colour) in enumerate(rows):
        yy = cy + pad / 2 + row_h * k + row_h / 2
        mid, r = cx + pad + swatch / 2, pt(1.5)
        d.line([(cx + pad, yy), (cx + pad + swatch, yy)], fill=colour, width=pt(1.5))
        d.ellipse([mid - r, yy - r, mid + r, yy + r], fill=colour)
        d.text((cx + 2 * pad + swatch, yy), label, fill="black", font=font, anchor="lm")
