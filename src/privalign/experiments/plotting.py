"""Figures drawn from a run directory only (``results.jsonl``, ``summary.json``, ``manifest.json``).

Conventions: the Agg backend; every axis labelled with its unit; log scales for N, n, d, ε and σ grids
that span orders of magnitude; error bars are ±1 standard error unless the legend says otherwise; each
figure is saved as PNG (150 dpi) and PDF under ``RUN/figures/``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np

__all__ = ["new_figure", "save_figure", "group_series", "errorbar_series", "STYLE"]

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
        ax.legend(
            handles,
            labels,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.2),
            ncol=min(2, len(labels)),
            frameon=False,
            fontsize=size,
            title=title,
            title_fontsize=size,
        )
        moved = True
    if moved:
        fig.tight_layout()


def save_figure(fig, run_dir: str | Path, stem: str) -> str:
    """Save ``fig`` as ``RUN/figures/<stem>.png`` and ``.pdf``; close it; return ``stem``. Legends placed with
    ``loc="best"`` are moved below their axes first (:func:`legends_outside`): a legend never covers data."""
    plt = _mpl()
    legends_outside(fig)
    d = Path(run_dir) / "figures"
    d.mkdir(parents=True, exist_ok=True)
    fig.savefig(d / f"{stem}.png", dpi=150)
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
