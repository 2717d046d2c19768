"""Figures are readable where they are shown: every text (tick and axis labels, titles, legend entries and
titles, notes) is at least 9 pt at the size the report displays the PNG, checked on the matplotlib objects
(their font sizes) and the saved PNG's width, not on pixels. A wide multi-panel figure is shown scaled down
to the page, so its fonts must be larger than a single panel's. Also: the demo's terminal table states each
claim beside its verdict."""

from __future__ import annotations

import struct

import numpy as np

#: The report shows a figure at most this wide (CSS px; report.html's content width), a narrower PNG at its
#: natural width; PNGs are saved at 150 dpi; a CSS inch is 96 px.
REPORT_PX, DPI, MIN_PT = 1166, 150, 9.0


def _png_width(path) -> int:
    return struct.unpack(">I", path.read_bytes()[16:20])[0]


def _shown_pt(size_pt: float, width_px: int) -> float:
    return size_pt * DPI / 96.0 * min(width_px, REPORT_PX) / width_px


def _small_texts(fig, width_px: int) -> list[tuple[str, float]]:
    from matplotlib.text import Text

    return [
        (t.get_text()[:40], round(_shown_pt(t.get_fontsize(), width_px), 2))
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and _shown_pt(t.get_fontsize(), width_px) < MIN_PT - 1e-6
    ]


def _legend_texts(fig) -> list:
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
    return [t for leg in legends for t in (*leg.get_texts(), leg.get_title()) if t.get_text()]


def test_a_wide_figure_with_small_legends_is_saved_readable(tmp_path):
    from privalign.experiments.plotting import new_figure, save_figure

    fig, axes = new_figure(3, 1, width=5.6, height=4.4)
    x = np.linspace(1, 100, 30)
    for k, ax in enumerate(axes):
        for j in range(3):
            ax.plot(x, x ** (0.2 * j) + k, label=f"method {j} at ε = {j + 1}")
        ax.set_xlabel("N (candidates per prompt)")
        ax.set_ylabel("accuracy lift (percentage points)")
        ax.set_title("a long panel title that would run into its neighbour", fontsize=6)
        ax.legend(loc="best", fontsize=5.5, title="±1 SE", title_fontsize=5.5)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=7)
    fig.text(0.01, 0.005, "a note under the figure", fontsize=6)
    save_figure(fig, tmp_path, "wide")
    width = _png_width(tmp_path / "figures" / "wide.png")
    assert width > REPORT_PX  # shown scaled down: the case that made legends ~7 px
    assert len(_legend_texts(fig)) >= 3 * 4 + 3
    assert not _small_texts(fig, width)
    # the enlarged legends still cover no data and no neighbouring axes
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()  # save_figure closed it: a fresh canvas to measure on
    r = fig.canvas.get_renderer()
    for ax in fig.axes:
        leg = ax.get_legend().get_window_extent(r)
        for other in fig.axes:
            ob = other.get_window_extent(r)
            assert not (leg.x0 < ob.x1 and leg.x1 > ob.x0 and leg.y0 < ob.y1 and leg.y1 > ob.y0)


def test_an_experiments_figure_is_readable_in_the_report(tmp_path, monkeypatch):
    """p1-budget's two-panel figure (13 inches wide, legend at 8 pt) as the experiment draws it."""
    from privalign.cli import main
    from privalign.experiments import plotting

    saved = []
    original = plotting.save_figure

    def keep(fig, run_dir, stem):
        saved.append((fig, original(fig, run_dir, stem)))
        return saved[-1][1]

    monkeypatch.setattr(plotting, "save_figure", keep)
    out = tmp_path / "budget"
    assert main(["reproduce", "p1-budget", "--quick", "--out", str(out), "--no-progress"]) == 0
    assert saved
    for fig, stem in saved:
        width = _png_width(out / "figures" / f"{stem}.png")
        assert _legend_texts(fig), stem
        assert not _small_texts(fig, width), (stem, width)


def test_simulation_figures_set_readable_legend_and_label_sizes(tmp_path, monkeypatch):
    """``plot_results`` (matplotlib, 7 in wide at 120 dpi: shown at its natural width): the legend and the
    axis labels are set to at least 9 pt."""
    from matplotlib.figure import Figure

    from privalign.alignment.figures import plot_results
    from privalign.alignment.simulation import MethodSpec, run_protocol
    from privalign.alignment.synthetic import make_synthetic_pool

    sizes: list[tuple[str, float]] = []
    original = Figure.savefig

    def record(self, *a, **k):
        for ax in self.axes:
            sizes.extend(("legend", t.get_fontsize()) for t in ax.get_legend().get_texts())
            sizes.extend(
                [("xlabel", ax.xaxis.label.get_fontsize()), ("ylabel", ax.yaxis.label.get_fontsize())]
            )
        return original(self, *a, **k)

    monkeypatch.setattr(Figure, "savefig", record)
    pool = make_synthetic_pool(4, 64, random_state=0)
    res = run_protocol(
        pool,
        [MethodSpec("bon"), MethodSpec("privbon", epsilon=2.0)],
        n_grid=[1, 2, 4, 8],
        replicates=2,
        random_state=0,
        progress=False,
    )
    plot_results(res, tmp_path, backend="matplotlib")
    assert {k for k, _ in sizes} == {"legend", "xlabel", "ylabel"}
    assert all(s >= MIN_PT for _, s in sizes), sizes


def test_demo_table_states_each_claim_beside_its_verdict():
    """``privalign demo`` prints, under each claim's verdict, what the claim says and then what was found:
    "does not hold" reads against the claim's own statement."""
    from privalign.cli.demo import claims_table

    rows = [
        {
            "id": "P1-5",
            "claim": "PrivITP matches or beats PrivBoN at equivalent privacy. [paper]",
            "verdict": "does not hold",
            "plain": "PrivBoN gave higher accuracy than PrivITP at equal privacy (ε = 1, 2): by up to 45 "
            "percentage points at N = 1,024 (significant).",
            "measured": "m",
        },
        {
            "id": "P1-9",
            "claim": "Regret bounds. [paper]",
            "verdict": "not testable here",
            "plain": "Not tested here: asymptotic.",
            "measured": "asymptotic",
        },
    ]
    lines = claims_table(rows, width=90).splitlines()
    assert all(len(line) <= 90 for line in lines)
    flat = " ".join(x.strip() for x in lines)
    for r in rows:
        head = next(i for i, line in enumerate(lines) if line.startswith(r["id"] + " "))
        assert r["verdict"] in lines[head] and "Claim: " + r["claim"][:20] in lines[head]
        assert "Claim: " + r["claim"] in flat and "Found: " + r["plain"] in flat
        assert flat.index("Claim: " + r["claim"]) < flat.index("Found: " + r["plain"])


def test_plain_readings_give_every_amount_its_unit():
    """Lifts in accuracy are percentage points, other true rewards are in true-reward units, P1-8's costs are
    ε: the units the demo's "fell by 60" lacked."""
    from privalign.experiments.plain import monotone, p1_1, p1_5, p1_8

    acc = {"what": "accuracy", "unit": " points", "bon_drop": 60.0, "bon_from_N": 16, "n_max": 1024}
    assert "accuracy fell by 60 percentage points from N = 16" in p1_1("holds", acc)
    tr = {**acc, "what": "true reward", "unit": "", "bon_drop": 0.3}
    assert "true reward fell by 0.3 true-reward units" in p1_1("holds", tr)
    f5 = {"what": "accuracy", "epsilons": [1, 2], "privbon_ahead": 3, "points": 4, "gap": 45.0, "gap_N": 1024}
    assert "by up to 45 percentage points" in p1_5("does not hold", {**f5, "gap_epsilon": 20})
    up = {"method": "ITP", "what": "true reward", "n_max": 256, "upper_drop": 2.1}
    assert "any fall is below 2.1 true-reward units" in monotone("holds", up)
    f8 = {"n_from": 128, "n_max": 1024, "e_from": 9.0, "e_to": 9.0, "eps_max_from": 34.0, "eps_max_to": 222.0}
    assert "(expected ε 9 → 9)" in p1_8("holds", f8) and "(ε_max 34 → 222)" in p1_8("holds", f8)


def test_scaling_records_say_their_lifts_are_accuracy_on_a_0_1_truth(tmp_path):
    """p1-scaling on a pool whose truth is correct/incorrect: the records' truth_kind is "accuracy" (the
    lifts are ×100: percentage points), separate from the pool's kind; it was overwritten by the pool kind,
    so the plain readings said "true reward fell by 60" for 60 percentage points of accuracy."""
    import json

    from privalign.cli import main

    rng = np.random.default_rng(0)
    pool = [
        {
            "prompt": f"q{i}",
            "responses": [
                {"text": f"r{j}", "proxy_reward": float(rng.normal()), "is_correct": bool(rng.random() < 0.4)}
                for j in range(16)
            ],
        }
        for i in range(4)
    ]
    (tmp_path / "pool.json").write_text(json.dumps(pool))
    (tmp_path / "c.toml").write_text(
        'pool = "pool.json"\nreplicates = 2\nmethods = ["BoN"]\nmc_draws = 2\nn_max_log2 = 2\n'
        'transform = "global_z"\nscore_low = -3.0\nscore_high = 3.0\nsensitivity = 6.0\n'
    )
    out = tmp_path / "run"
    argv = [
        "reproduce",
        "p1-scaling",
        "--config",
        str(tmp_path / "c.toml"),
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    assert recs and {r["truth_kind"] for r in recs} == {"accuracy"}
    assert json.loads((out / "summary.json").read_text())["lift_unit"] == "percentage points"
