"""Figures of :func:`privalign.alignment.simulation.run_protocol` results, off the hot path.

Two backends draw the same two charts:

* ``"pillow"`` (PNG; the default for PNG when Pillow is installed): :mod:`privalign.alignment._raster`, a
  small line-chart rasteriser that needs no matplotlib import (matplotlib's import and layout cost more than
  the engine on a few prompts).
* ``"matplotlib"`` (PNG and PDF; used for every format when PDF is asked for, so both look alike),
  rendered with matplotlib's object API (:class:`matplotlib.figure.Figure` on an Agg canvas): no
  ``pyplot`` import (no global figure manager, no backend selection), no ``tight_layout`` (fixed margins),
  and tick labels as plain text (no mathtext parsing). Imported only when it draws.

PNG by default; PDF on request (``formats``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FIGURE_BACKENDS", "FIGURE_FORMATS", "needs_matplotlib", "plot_results", "preload_matplotlib"]

#: Accepted output formats.
FIGURE_FORMATS = ("png", "pdf")
#: Accepted backends: ``auto`` = Pillow for PNG (matplotlib if Pillow is missing), matplotlib for PDF.
FIGURE_BACKENDS = ("auto", "pillow", "matplotlib")

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
    backend: str = "auto",
) -> list[Path]:
    """Two figures: true-reward (accuracy) lift vs N and expected proxy reward vs N (log2 x-axis, error
    bars = 1 SE over prompts), each written once per format (``true_lift.png``, ``proxy_reward.png``;
    ``.pdf`` too when ``"pdf"`` is in ``formats``). Returns the paths written, figure by figure.

    ``backend``: ``"auto"`` (Pillow for PNG, matplotlib for PDF), ``"pillow"`` (PNG only) or
    ``"matplotlib"``. ``dpi`` applies to matplotlib; Pillow PNGs are 840 × 540 pixels (7 × 4.5 in at 120 dpi).

    Raises:
      PrivacyParameterError: an empty ``formats``, a format other than ``png``/``pdf``, an unknown
        ``backend``, or ``backend="pillow"`` with ``"pdf"`` in ``formats``.
    """
    from privalign.errors import PrivacyParameterError

    formats = tuple(formats)
    bad = [f for f in formats if f not in FIGURE_FORMATS]
    if not formats or bad:
        raise PrivacyParameterError(
            f"The 'formats' parameter must be a non-empty subset of {FIGURE_FORMATS}. "
            f"Got {formats!r} instead."
        )
    if backend not in FIGURE_BACKENDS:
        raise PrivacyParameterError(
            f"The 'backend' parameter must be one of {FIGURE_BACKENDS}. Got {backend!r} instead."
        )
    if backend == "pillow" and "pdf" in formats:
        raise PrivacyParameterError(
            "The 'backend' parameter 'pillow' draws PNG only; PDF needs backend 'matplotlib' or 'auto'. "
            f"Got formats {formats!r}."
        )
    if not needs_matplotlib(formats, backend):
        return _plot_pillow(results, Path(out_dir))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    title, shown = _title_and_ticks(results)
    # one Figure (and Agg canvas) for both panels, cleared in between: the canvas's renderer and its text
    # metrics cache are reused (the title, axis label, tick and legend texts repeat)
    fig = Figure(figsize=(7, 4.5), dpi=dpi)
    FigureCanvasAgg(fig)
    for key, ylabel, stem, scale in _PANELS:
        fig.clear()
        fig.subplots_adjust(left=0.12, right=0.98, bottom=0.12, top=0.93)
        ax = fig.add_subplot()
        for m in results["methods"]:
            y = np.asarray(m[key], dtype=float) * scale
            se = np.asarray(m[key + "_se"], dtype=float) * scale
            ax.errorbar(m["n"], y, yerr=se, marker="o", ms=3, capsize=2, label=_legend(m))
        ax.set_xscale("log", base=2)
        # plain-text tick labels at the N of the grid: no mathtext to lay out
        ax.xaxis.set_major_locator(FixedLocator(shown))
        ax.set_xticklabels([str(n) for n in shown])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("N (candidates per pool)")
        ax.set_ylabel(ylabel, fontsize=9)
        ax.set_title(title, y=1.0)  # explicit y: no automatic title placement (a tight-bbox pass per draw)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
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


def needs_matplotlib(formats: tuple[str, ...] | list[str], backend: str = "auto") -> bool:
    """Whether :func:`plot_results` with these arguments draws with matplotlib (so that callers import it
    ahead, e.g. in :func:`preload_matplotlib`, only when it will be used)."""
    if backend == "matplotlib" or "pdf" in formats:
        return True
    if backend == "pillow":
        return False
    return importlib.util.find_spec("PIL") is None


def _plot_pillow(results: dict[str, Any], out: Path) -> list[Path]:
    from privalign.alignment._raster import Series, render_line_chart

    out.mkdir(parents=True, exist_ok=True)
    title, shown = _title_and_ticks(results)
    paths = []
    for key, ylabel, stem, scale in _PANELS:
        series = [
            Series(
                _legend(m),
                np.asarray(m["n"], dtype=float),
                np.asarray(m[key], dtype=float) * scale,
                np.asarray(m[key + "_se"], dtype=float) * scale,
            )
            for m in results["methods"]
        ]
        paths.append(
            render_line_chart(
                series,
                out / f"{stem}.png",
                title=title,
                xlabel="N (candidates per pool)",
                ylabel=ylabel,
                xticks=shown,
            )
        )
    return paths


def _title_and_ticks(results: dict[str, Any]) -> tuple[str, list[int]]:
    """The panels' title and the N labelled on the x axis (every N of the grid, thinned to at most 7), shared
    by both backends so that they label the same ticks."""
    title = f"{results['n_prompts']} prompts, {results['config']['replicates']} replicates"
    ns = sorted({int(n) for m in results["methods"] for n in m["n"]})
    return title, ns[:: max(1, -(-len(ns) // 7))]


def _legend(m: dict[str, Any]) -> str:
    # read from the privacy report, not the method's name: a Gumbel scale means the exponential mechanism
    # (pure DP; ε = ∞ at scale 0), a phase-1 ε1 the ex-post two-phase mechanism
    pv = m["privacy"]
    if "scale" in pv:
        return f"{m['name']} (ε_eff={pv['epsilon']:.3g}, pure DP)"
    if "epsilon1" in pv:
        return f"{m['name']} (ε1={pv['epsilon1']:.3g}@δ={pv['delta']:g}, ex-post)"
    return m["name"]
