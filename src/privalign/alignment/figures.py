"""Figures of :func:`privalign.alignment.simulation.run_protocol` results, off the hot path.

Rendered with matplotlib's object API (:class:`matplotlib.figure.Figure` on an Agg canvas): no
``pyplot`` import (no global figure manager, no backend selection), no ``tight_layout`` (fixed margins),
and tick labels as plain text (no mathtext parsing). PNG by default; PDF on request (``formats``).
Matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FIGURE_FORMATS", "plot_results", "preload_matplotlib"]

#: Accepted output formats.
FIGURE_FORMATS = ("png", "pdf")

_PANELS = (
    ("true_lift", "true-reward lift over base policy (×100 = accuracy lift, %)", "true_lift", 100.0),
    ("proxy", "expected proxy reward of the selection", "proxy_reward", 1.0),
)


def preload_matplotlib():
    """Import the parts of matplotlib :func:`plot_results` uses, in a daemon thread (started and returned;
    ``join()`` it before plotting). The numerical work that runs meanwhile releases the GIL in its array
    operations, so the import overlaps it; importing twice is harmless."""
    import threading

    def _load() -> None:
        try:
            import matplotlib.backends.backend_agg  # noqa: F401
            import matplotlib.figure  # noqa: F401
            import matplotlib.ticker  # noqa: F401
        except ImportError:  # reported by plot_results
            pass

    th = threading.Thread(target=_load, name="privalign-matplotlib-preload", daemon=True)
    th.start()
    return th


def plot_results(
    results: dict[str, Any],
    out_dir: str | Path,
    *,
    formats: tuple[str, ...] | list[str] = ("png",),
    dpi: int = 120,
) -> list[Path]:
    """Two figures: true-reward (accuracy) lift vs N and expected proxy reward vs N (log2 x-axis, error
    bars = 1 SE over prompts), each written once per format (``true_lift.png``, ``proxy_reward.png``;
    ``.pdf`` too when ``"pdf"`` is in ``formats``). Returns the paths written, figure by figure.

    Raises:
      PrivacyParameterError: an empty ``formats`` or a format other than ``png``/``pdf``.
    """
    from privalign.errors import PrivacyParameterError

    formats = tuple(formats)
    bad = [f for f in formats if f not in FIGURE_FORMATS]
    if not formats or bad:
        raise PrivacyParameterError(
            f"The 'formats' parameter must be a non-empty subset of {FIGURE_FORMATS}. "
            f"Got {formats!r} instead."
        )
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    title = f"{results['n_prompts']} prompts, {results['config']['replicates']} replicates"
    # one Figure (and Agg canvas) for both panels, cleared in between: the canvas's renderer and its text
    # metrics cache are reused (the title, axis label, tick and legend texts repeat)
    fig = Figure(figsize=(7, 4.5), dpi=dpi)
    FigureCanvasAgg(fig)
    for key, ylabel, stem, scale in _PANELS:
        fig.clear()
        fig.subplots_adjust(left=0.12, right=0.98, bottom=0.12, top=0.93)
        ax = fig.add_subplot()
        ns: list[int] = []
        for m in results["methods"]:
            y = np.asarray(m[key], dtype=float) * scale
            se = np.asarray(m[key + "_se"], dtype=float) * scale
            ax.errorbar(m["n"], y, yerr=se, marker="o", ms=3, capsize=2, label=_legend(m))
            ns = sorted(set(ns) | {int(n) for n in m["n"]})
        ax.set_xscale("log", base=2)
        # plain-text tick labels at the N of the grid (at most 7 labelled): no mathtext to lay out
        shown = ns[:: max(1, -(-len(ns) // 7))]
        ax.xaxis.set_major_locator(FixedLocator(shown))
        ax.set_xticklabels([str(n) for n in shown])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("N (candidates per pool)")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_title(title, y=1.0)  # explicit y: no automatic title placement (a tight-bbox pass per draw)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        for fmt in formats:
            path = out / f"{stem}.{fmt}"
            # PNG: lossless at any zlib level; level 1 instead of the default 6 (same pixels, a slightly
            # larger file, a fraction of the encoding time)
            if fmt == "png":
                fig.savefig(path, dpi=dpi, format=fmt, pil_kwargs={"compress_level": 1})
            else:
                fig.savefig(path, dpi=dpi, format=fmt)
            paths.append(path)
    return paths


def _legend(m: dict[str, Any]) -> str:
    pv = m["privacy"]
    if m["spec"]["kind"] == "privbon":
        return f"{m['name']} (ε_eff={pv['epsilon']:.3g}, pure DP)"
    if m["spec"]["kind"] == "privitp":
        return f"{m['name']} (ε1={pv['epsilon1']:.3g}@δ={pv['delta']:g}, ex-post)"
    return m["name"]
