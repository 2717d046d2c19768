"""Figures drawn from a run directory only (``results.jsonl``, ``summary.json``, ``manifest.json``).

Conventions: the Agg backend; every axis labelled with its unit; log scales for N, n, d, ε and σ grids
that span orders of magnitude; error bars are ±1 standard error unless the legend says otherwise; each
figure is saved as PNG (150 dpi) and PDF under ``RUN/figures/``. Text is readable where the report shows the
figure: every label, tick, title and legend entry is at least :data:`MIN_DISPLAY_PT` points at the width the
report gives it (:func:`readable_text`; a wide figure is shown scaled down, so its fonts are raised).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np

__all__ = [
    "new_figure",
    "save_figure",
    "group_series",
    "errorbar_series",
    "readable_text",
    "displayed_pt",
    "STYLE",
    "SAVE_DPI",
    "REPORT_FIGURE_PX",
    "MIN_DISPLAY_PT",
]

#: Resolution of the saved PNGs.
SAVE_DPI = 150
#: The widest a figure is shown in ``report.html`` (CSS px: the page's content width); a PNG wider than this
#: is scaled down to it, one narrower is shown at its natural width (1 PNG pixel = 1 CSS px).
REPORT_FIGURE_PX = 1166
#: The smallest size (points, as displayed in the report) of any text in a figure.
MIN_DISPLAY_PT = 9.0

# One colour and marker per method, so that a method looks the same in every figure.
STYLE: dict[str, dict] = {
    "BoN": {"color": "#d62728", "marker": "o"},
    "ITP": {"color": "#1f77b4", "marker": "s"},
    "PrivBoN": {"color": "#ff7f0e", "marker": "^"},
    "PrivBoN-Gumbel": {"color": "#ff7f0e", "marker": "^"},
    "PrivBoN-Gaussian": {"color": "#9467bd", "marker": "v"},
    "PrivITP": {"color": "#2ca02c", "marker": "D"},
    "IHT": {"color": "#7f7f7f", "marker": "o"},
    "MLE": {"color": "#000000", "marker": "x"},
    "SampleDPIHT": {"color": "#1f77b4", "marker": "s"},
    "RRIHT": {"color": "#2ca02c", "marker": "D"},
    "DenseRR": {"color": "#ff7f0e", "marker": "^"},
    "DPSGDLinear": {"color": "#d62728", "marker": "v"},
}


#: a display label's family → the colour map of its variants (first match; any other label: Purples)
SHADES = (("BoN", "Oranges"), ("PrivITP", "Greens"), ("ITP", "Blues"))


def _shades(base: str) -> str:
    return next((cmap for family, cmap in SHADES if family in base), "Purples")


def _mpl():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "font.size": 11,
            "axes.titlesize": 12,
            "axes.labelsize": 11,
            "legend.fontsize": 9,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "figure.dpi": 100,
            "savefig.bbox": "tight",
        }
    )
    return plt


def new_figure(ncols: int = 1, nrows: int = 1, *, width: float = 5.2, height: float = 3.8):
    """A figure with ``nrows × ncols`` axes (always returned as a flat list)."""
    plt = _mpl()
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, list(axes.ravel())


def legends_outside(fig) -> None:
    """Move every axes legend placed with ``loc="best"`` below its axes (centred, no frame), so that no legend
    covers data, and re-run the layout so the legends get room."""
    moved = False
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is None or getattr(leg, "_loc", None) != 0:  # 0 = "best"; explicit placements are kept
            continue
        handles, labels = ax.get_legend_handles_labels()
        if not handles:
            continue
        title = leg.get_title().get_text() or None
        size = leg.get_texts()[0].get_fontsize() if leg.get_texts() else None
        leg.remove()
        _legend_below(ax, handles, labels, title=title, size=size, ncol=min(2, len(labels)))
        moved = True
    if moved:
        fig.tight_layout()


def displayed_pt(size_pt: float, png_width_px: float, *, dpi: float = SAVE_DPI) -> float:
    """The size (CSS points) at which text of ``size_pt`` points in a PNG saved at ``dpi`` and
    ``png_width_px`` wide shows in the report (at most :data:`REPORT_FIGURE_PX` wide; 96 CSS px per inch)."""
    shown = min(png_width_px, REPORT_FIGURE_PX) / png_width_px
    return size_pt * dpi / 96.0 * shown


def _texts(fig) -> list:
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def readable_text(fig, *, min_pt: float = MIN_DISPLAY_PT, dpi: float = SAVE_DPI) -> bool:
    """Raise every text of ``fig`` (labels, ticks, titles, legend entries and titles, notes) that would show
    below ``min_pt`` points in the report (:func:`displayed_pt` of the PNG :func:`save_figure` writes) to
    ``min_pt``; figure-level legends go below the figure and the layout is redone so the larger text gets
    room. Returns whether anything was raised."""
    raised = False
    for _ in range(4):  # larger text and the new layout widen the saved (tight) figure a little: settle
        fig.canvas.draw()
        width_px = fig.get_tightbbox(fig.canvas.get_renderer()).width * dpi + 2 * 0.1 * dpi  # savefig pad
        need = min_pt / displayed_pt(1.0, width_px, dpi=dpi)
        small = [t for t in _texts(fig) if t.get_fontsize() < need - 1e-9]
        if not small:
            break
        for t in small:
            t.set_fontsize(need * 1.01)  # 1% to spare: the saved width is rounded to whole pixels
        raised = True
        _relayout(fig)
    return raised


def _legend_below(ax, handles, labels, *, title, size, ncol: int, y: float = -0.2):
    leg = ax.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, y),
        ncol=ncol,
        frameon=False,
        fontsize=size,
        title=title,
        title_fontsize=size,
    )
    leg._privalign_below = (handles, labels, title)  # placed by legends_outside: _relayout may redo it
    return leg


def _wrap_to(text, width_px: float, renderer) -> None:
    """Break ``text`` (a matplotlib Text) into lines no wider than ``width_px`` (at word boundaries)."""
    import textwrap

    w = text.get_window_extent(renderer).width
    if w <= width_px or w <= 0:
        return
    s = text.get_text()
    longest = max(len(line) for line in s.split("\n"))
    chars = max(12, int(longest * width_px / w))
    text.set_text("\n".join(textwrap.fill(line, chars) for line in s.split("\n")))


def _untangle_ticks(ax, renderer) -> None:
    """Tilt the x tick labels of ``ax`` (30°, anchored at their right end) when neighbours overlap."""
    labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
    if any(a.x1 > b.x0 for a, b in zip(boxes, boxes[1:])):
        for t in labels:
            t.set_rotation(30)
            t.set_horizontalalignment("right")
            t.set_rotation_mode("anchor")


def _relayout(fig) -> None:
    """The layout after text was enlarged: titles and legend titles wider than their axes are wrapped; a
    legend below its axes (:func:`legends_outside`) that is now wider than the axes gets one column and sits
    just under the axes' tick and axis labels; a figure legend goes under everything."""
    from matplotlib.transforms import Bbox

    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    for ax in fig.axes:
        box = ax.get_window_extent(r)
        leg = ax.get_legend()
        for t in (ax.title, ax._left_title, ax._right_title, *([leg.get_title()] if leg else [])):
            if t.get_text():
                _wrap_to(t, box.width, r)
        if leg is not None and leg.get_bbox_to_anchor().y1 < box.y0:  # placed below the axes by its figure
            leg._privalign_below = getattr(leg, "_privalign_below", None) or (
                list(leg.legend_handles),
                [t.get_text() for t in leg.get_texts()],
                None,
            )
        _untangle_ticks(ax, r)
    for _ in range(2):
        if fig.get_layout_engine() is None:
            fig.tight_layout()
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        for ax in fig.axes:
            leg = ax.get_legend()
            below = getattr(leg, "_privalign_below", None)
            if leg is None or below is None:
                continue
            leg.set_visible(False)
            y0 = ax.transAxes.inverted().transform((0.0, ax.get_tightbbox(r).y0))[1] - 0.02
            leg.set_visible(True)
            size = leg.get_texts()[0].get_fontsize()
            ncol, wide = leg._ncols, leg.get_window_extent(r).width / ax.get_window_extent(r).width
            if ncol > 1 and wide > 1.2:  # fewer columns, so that it stays about as wide as its axes
                ncol = max(1, int(ncol / wide))
            title = leg.get_title().get_text() or None  # as wrapped above
            leg.remove()
            _legend_below(ax, *below[:2], title=title, size=size, ncol=ncol, y=y0)
    if fig.get_layout_engine() is None:
        fig.tight_layout()  # room for the legends where they now are
    if fig.legends:
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        low = Bbox.union([ax.get_tightbbox(r) for ax in fig.axes if ax.get_visible()]).y0
        y = fig.transFigure.inverted().transform((0.0, low))[1] - 0.01
        for leg in fig.legends:  # e.g. "lower center" over a strip the figure reserved: below it all
            leg.set_loc("upper center")
            leg.set_bbox_to_anchor((0.5, y), transform=fig.transFigure)


def save_figure(fig, run_dir: str | Path, stem: str) -> str:
    """Save ``fig`` as ``RUN/figures/<stem>.png`` and ``.pdf``; close it; return ``stem``. Legends placed with
    ``loc="best"`` are moved below their axes first (:func:`legends_outside`): a legend never covers data;
    then every text is made readable at the size the report shows the figure (:func:`readable_text`)."""
    plt = _mpl()
    legends_outside(fig)
    readable_text(fig)
    d = Path(run_dir) / "figures"
    d.mkdir(parents=True, exist_ok=True)
    fig.savefig(d / f"{stem}.png", dpi=SAVE_DPI)
    fig.savefig(d / f"{stem}.pdf")
    plt.close(fig)
    return stem


def group_series(
    records: Iterable[dict], key: str, x: str, y: str, se: str | None = None, where: dict | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Group records by ``record[key]`` into sorted ``(x, y, se)`` arrays (se = 0 when absent)."""
    acc: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for r in records:
        if where and any(r.get(k) != v for k, v in where.items()):
            continue
        if r.get(x) is None or r.get(y) is None:
            continue
        acc[str(r[key])].append((float(r[x]), float(r[y]), float(r.get(se) or 0.0) if se else 0.0))
    out = {}
    for k, rows in acc.items():
        rows.sort()
        a = np.array(rows)
        out[k] = (a[:, 0], a[:, 1], a[:, 2])
    return out


def errorbar_series(
    ax,
    series: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
    *,
    order: list[str] | None = None,
    label_fmt: str = "{}",
) -> None:
    """Plot each series with ±1 SE error bars, using :data:`STYLE` where the name is known."""
    import matplotlib

    names = [n for n in (order or sorted(series)) if n in series]
    bases = [n.split(" ")[0] for n in names]
    shared = {b for b in bases if bases.count(b) > 1}
    rank: dict[str, int] = {}
    for name in names:
        xs, ys, ses = series[name]
        base = name.split(" ")[0]
        st = dict(STYLE.get(base, {}))
        if base in shared:  # several variants of one method: shades of one colour map, same marker
            k = rank[base] = rank.get(base, -1) + 1
            cmap = matplotlib.colormaps[_shades(base)]
            st["color"] = cmap(0.45 + 0.5 * k / max(bases.count(base) - 1, 1))
        ax.errorbar(
            xs, ys, yerr=ses, label=label_fmt.format(name), capsize=3, linewidth=1.5, markersize=5, **st
        )
