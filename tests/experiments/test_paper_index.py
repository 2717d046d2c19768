"""``docs/paper_index.md`` is generated from the experiment registry and the claims table and cannot go stale:
the file must equal :func:`render_paper_index`, and every module and experiment the algorithm rows
name must exist."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from privalign.experiments.paper_index import ALGORITHMS, PAPERS, claims_of, figure_stems, render_paper_index
from privalign.experiments.registry import EXPERIMENTS, UNAVAILABLE

DOC = Path(__file__).resolve().parents[2] / "docs" / "paper_index.md"


def test_paper_index_doc_is_the_generated_one():
    if UNAVAILABLE:
        pytest.skip(f"experiments left out of the registry here: {sorted(UNAVAILABLE)}")
    assert DOC.read_text(encoding="utf-8") == render_paper_index(), (
        "docs/paper_index.md is stale: regenerate it with "
        "`python -m privalign.experiments.paper_index > docs/paper_index.md`"
    )


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("row", ALGORITHMS, ids=lambda r: r[1][:40])
def test_every_algorithm_row_names_real_modules_and_registered_experiments(row):
    paper, _, modules, experiments = row
    assert paper in PAPERS
    for m in modules:
        _resolve(m)
    for e in experiments:
        assert e in EXPERIMENTS, e


def test_every_experiment_has_a_row_figures_and_the_claims_that_read_it():
    named = {e for *_, exps in ALGORITHMS for e in exps}
    assert set(EXPERIMENTS) <= named, set(EXPERIMENTS) - named
    assert figure_stems("p1-scaling") == ["scaling"] and figure_stems("p2-rlhf") == ["rlhf_gold_vs_kl"]
    assert claims_of("p2-rlhf") == ["P2-6"] and claims_of("beyond-train-vs-inference") == ["B-1"]
    assert all(figure_stems(e) for e in EXPERIMENTS), [e for e in EXPERIMENTS if not figure_stems(e)]
