"""``docs/paper_index.md``, generated: paper → algorithm → module → experiment → config → figure → claims.

The experiments, their configs, figures and the claims they test are read from the registry
(:data:`privalign.experiments.registry.EXPERIMENTS`) and the claims table
(:data:`privalign.experiments.report.CLAIMS`); only the algorithm → module rows are written here, and a test
checks that every module they name imports and every experiment they name is registered
(``tests/experiments/test_paper_index.py``, which also fails when ``docs/paper_index.md`` differs from
:func:`render_paper_index`). Regenerate with ``python -m privalign.experiments.paper_index >
docs/paper_index.md``.
"""

from __future__ import annotations

import inspect
import re

__all__ = ["ALGORITHMS", "PAPERS", "render_paper_index", "figure_stems", "claims_of"]

PAPERS = {
    "paper1": 'Paper 1 — "Privacy Without Regret: Differentially Private Inference-Time Alignment" '
    "(arXiv 2608.26324)",
    "paper2": 'Paper 2 — "Private Sparse RLHF" (sparse reward estimation under DP)',
    "beyond": "Beyond the papers",
}

#: (paper, algorithm or result, modules (dotted paths, each importable), experiments (registry names)).
ALGORITHMS: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = [
    ("paper1", "BoN", ("privalign.alignment.bon.BestOfN",), ("p1-scaling", "p1-scaling-imdb")),
    (
        "paper1",
        "ITP (Huang et al. 2025, arXiv 2503.21878)",
        ("privalign.alignment.itp.InferenceTimePessimism", "privalign.alignment.normalizer.solve_normalizer"),
        ("p1-scaling", "p1-beta-sweep", "p1-itp-vs-privitp"),
    ),
    (
        "paper1",
        "PrivBoN (Gumbel, σ = 2Δ_r/ε)",
        ("privalign.alignment.priv_bon.PrivBoN",),
        ("p1-scaling", "p1-sigma-sweep", "p1-privacy-sweep"),
    ),
    (
        "paper1",
        "PrivBoN-Gaussian (ablation, no ε)",
        ("privalign.experiments.paper1.gaussian_rnm_outcomes",),
        ("p1-sigma-sweep",),
    ),
    (
        "paper1",
        "PrivITP (two-phase Gaussian; ex-post accounting)",
        ("privalign.alignment.priv_itp.PrivITP", "privalign.accounting.expost"),
        ("p1-scaling", "p1-itp-vs-privitp", "p1-privacy-sweep"),
    ),
    (
        "paper1",
        "critical budget ε* = 2Δ_r√C/ε_RM",
        ("privalign.alignment.theory",),
        ("p1-epsilon-star",),
    ),
    (
        "paper1",
        'adaptive composition ("FSRC")',
        ("privalign.accounting.filters", "privalign.alignment.session"),
        ("p1-budget",),
    ),
    (
        "paper1",
        "evaluation protocol (§5.4)",
        ("privalign.alignment.simulation.run_protocol",),
        ("p1-scaling", "p1-scaling-imdb", "p1-privacy-sweep", "p1-privacy-sweep-imdb"),
    ),
    (
        "paper2",
        "Sample-DP IHT (Peeling)",
        ("privalign.estimation.iht.SampleDPIHT", "privalign.mechanisms"),
        ("p2-rates", "p2-accuracy", "p2-winrate", "p2-rlhf-bon", "p2-rlhf"),
    ),
    (
        "paper2",
        "RR-IHT (label DP)",
        ("privalign.estimation.iht.RRIHT",),
        ("p2-rates", "p2-accuracy", "p2-winrate", "p2-rlhf-bon", "p2-rlhf"),
    ),
    (
        "paper2",
        "dense RR, DP-SGD (baselines)",
        ("privalign.estimation.baselines.DenseRR", "privalign.estimation.baselines.DPSGDLinear"),
        ("p2-rates", "p2-accuracy", "p2-winrate", "p2-rlhf-bon", "p2-rlhf"),
    ),
    (
        "paper2",
        "non-private IHT, MLE (references)",
        ("privalign.estimation.iht.IHT", "privalign.estimation.baselines.MLE"),
        ("p2-rates", "p2-accuracy"),
    ),
    (
        "paper2",
        "win rates (RR-IHT > Sample-DP IHT > RR > DP-SGD), best-of-16 over SmolLM2 pools",
        ("privalign.experiments.winrate",),
        ("p2-winrate",),
    ),
    (
        "paper2",
        "PPO-aligned policies: higher reward at the same KL for sparse methods (best-of-n at exact KL; "
        "GRPO + LoRA, SmolLM2-135M)",
        ("privalign.experiments.rlhf_bon", "privalign.rlhf", "privalign.experiments.rlhf"),
        ("p2-rlhf-bon", "p2-rlhf"),
    ),
    (
        "beyond",
        "train-time vs inference-time privacy at equal total (ε, δ) over T queries",
        ("privalign.estimation.iht.SampleDPIHT", "privalign.alignment.priv_bon.PrivBoN"),
        ("beyond-train-vs-inference",),
    ),
    (
        "beyond",
        "one gold-vs-KL frontier: label-/sample-DP DPO, private linear and MiniLM reward models → best-of-n "
        "and GRPO, PrivBoN per answer (IMDb, SmolLM2-135M)",
        (
            "privalign.experiments.frontier",
            "privalign.rlhf.dpo",
            "privalign.estimation.transformer.DPTransformerRM",
            "privalign.alignment.priv_bon.PrivBoN",
        ),
        ("beyond-frontier",),
    ),
    (
        "beyond",
        "membership inference by repeated queries; audit ε lower bound vs claimed ε",
        ("privalign.alignment", "privalign.audit.audit.epsilon_lower_bound"),
        ("beyond-membership",),
    ),
    (
        "beyond",
        "user-level label-DP (≤ K labels per annotator, randomized response at ε/K) vs record-level: "
        "accuracy at equal per-person ε and an attack on a heavy annotator's type, audited",
        (
            "privalign.mechanisms.user_level.UserRandomizedResponse",
            "privalign.estimation.users",
            "privalign.audit.audit.audit_threshold",
        ),
        ("beyond-user-level",),
    ),
    (
        "beyond",
        "grading the planted real-text control: best-of-N over-optimisation (paired max-t) and the capacity "
        "diagnostic vs a planted bonus of 0.5–10 within-prompt SDs",
        (
            "privalign.pipeline.planted.feature_hits",
            "privalign.pipeline.analysis.bon_curve",
            "privalign.alignment.capacity.capacity_diagnostic",
        ),
        ("beyond-planted-sweep",),
    ),
]

_FIGURE = re.compile(r"""save_figure\(\s*fig\s*,\s*[a-z_]+\s*,\s*["']([A-Za-z0-9_-]+)["']""")


def figure_stems(name: str) -> list[str]:
    """The figure stems an experiment's plot function writes (read from its source)."""
    from privalign.experiments.registry import get_experiment

    fn = get_experiment(name).plot
    stems = set(_FIGURE.findall(inspect.getsource(fn)))
    stem = inspect.getclosurevars(fn).nonlocals.get("stem")  # plots made by a factory (paper 1's scans)
    if isinstance(stem, str):
        stems.add(stem)
    return sorted(stems)


def claims_of(name: str) -> list[str]:
    """Ids of the claims whose rule reads this experiment (``CLAIMS``: ``experiment`` or ``also``)."""
    from privalign.experiments.report import CLAIMS

    return [c.id for c in CLAIMS if c.evaluate is not None and name in (c.experiment, *c.also)]


def _code(xs: list[str] | tuple[str, ...]) -> str:
    return ", ".join(f"`{x}`" for x in xs) or "—"


def render_paper_index() -> str:
    """The markdown of ``docs/paper_index.md``."""
    from privalign.experiments.registry import EXPERIMENTS
    from privalign.experiments.report import CLAIMS

    lines = [
        "# Paper index: paper → algorithm → module → experiment → config → figure → claims",
        "",
        "Generated from the experiment registry and the claims table by `python -m "
        "privalign.experiments.paper_index > docs/paper_index.md`; `tests/experiments/test_paper_index.py` "
        "fails when this file differs. Claim ids refer to the claims table of `privalign report` "
        "(`privalign.experiments.report.CLAIMS`). Configs live in `src/privalign/experiments/configs/` (each "
        "has a `_quick` sibling); figures are written to `RUN/figures/<stem>.png|pdf`.",
    ]
    for paper, title in PAPERS.items():
        lines += ["", f"## {title}", "", "### Algorithms", ""]
        lines += ["| algorithm / result | modules | experiments |", "|---|---|---|"]
        for p, alg, mods, exps in ALGORITHMS:
            if p == paper:
                lines.append(f"| {alg} | {_code(mods)} | {_code(exps)} |")
        lines += ["", "### Experiments", ""]
        lines += ["| experiment | what | config | figures | claims |", "|---|---|---|---|---|"]
        for e in EXPERIMENTS.values():
            if e.paper == paper:
                lines.append(
                    f"| `{e.name}` | {e.title} | `{e.config_name}.toml` | {_code(figure_stems(e.name))} | "
                    f"{', '.join(claims_of(e.name)) or '—'} |"
                )
        untested = [c for c in CLAIMS if c.paper.lower().replace(" ", "") == paper and c.evaluate is None]
        if untested:
            lines += ["", "Not testable here: " + "; ".join(f"{c.id} ({c.reason})" for c in untested) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(render_paper_index(), end="")
