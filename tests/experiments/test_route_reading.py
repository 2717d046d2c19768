"""The route reading across beyond-frontier runs (issue 37 item 6): sources, gold by n, leaders, the
family-wise three-valued verdict (each value on constructed summaries), the CLI's errors and the committed
docs block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privalign.experiments import route_reading as rr

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "choosing-a-route.md"


def _comparison(eps, budget, diff, se, p, *, winner="bon:A@8", runner="bon:B@8", verdict="inconclusive"):
    return {
        "epsilon": eps, "budget": budget,
        "ranking": [
            {"route": winner, "label": "A", "gold": 0.6 + diff},
            {"route": runner, "label": "B", "gold": 0.6},
        ],
        "nonprivate_dpo_gold": 0.65, "margin": 0.02, "winner": winner, "runner_up": runner, "diff": diff,
        "ci": [diff - 2 * se, diff + 2 * se], "se": se, "p_value": p, "holm_alpha": 0.05,
        "verdict": verdict,
    }  # fmt: skip


def _summary(tmp_path: Path, name: str, n: int, comps: list, **extra) -> Path:
    d = tmp_path / name
    d.mkdir()
    s = {
        "experiment": "beyond-frontier",
        "data": {"n_pairs": n, **extra.pop("data", {})},
        "comparisons": comps,
    }
    s.update(extra)
    (d / "summary.json").write_text(json.dumps(s), encoding="utf-8")
    return d


def test_committed_runs_load_with_their_n_labeller_and_both_judges():
    src = rr.load_source(ROOT / "docs/results/beyond-frontier")
    assert (src.n, src.labeller) == (400, "minilm")
    assert {c.judge for c in src.comparisons} == {"minilm", "vader"}
    assert {c.epsilon for c in src.comparisons} == {2.0, 8.0}


def test_the_vader_labeller_run_loads_with_three_judges():
    src = rr.load_source(ROOT / "docs/results/beyond-frontier-vader")
    assert (src.n, src.labeller) == (400, "vader")
    assert {c.judge for c in src.comparisons} == {"minilm", "vader", "ngram"}
    # the main comparisons are the MiniLM judge's, read once
    assert sum(c.judge == "minilm" for c in src.comparisons) == 6


def test_detectable_margin_is_the_normal_power_formula():
    # z_{0.95} + z_{0.8} = 1.6449 + 0.8416
    assert rr.detectable_margin(1.0, 0.05) == pytest.approx(2.4865, abs=1e-4)
    assert rr.detectable_margin(0.01, 0.05 / 36) == pytest.approx(0.01 * (2.9913 + 0.8416), abs=1e-5)


def test_the_family_verdict_takes_each_of_its_three_values(tmp_path):
    comps = [
        _comparison(8.0, 0.5, 0.05, 0.005, 0.0005),  # ahead, p tiny: holds
        _comparison(8.0, 1.0, 0.001, 0.002, 0.4),  # within ±0.02 at Bonferroni: does not hold
        _comparison(8.0, 2.0, 0.01, 0.05, 0.3),  # wide: inconclusive
    ]
    rows = rr.across_runs([rr.load_source(_summary(tmp_path, "r", 400, comps))])
    assert [r["family_verdict"] for r in rows] == ["holds", "does not hold", "inconclusive"]
    # Holm by ascending p (0.0005, 0.3, 0.4): α/3, α/2, α
    assert [r["family_alpha"] for r in rows] == pytest.approx([0.05 / 3, 0.05, 0.05 / 2])


def test_holm_over_runs_is_stricter_than_each_run_alone(tmp_path):
    # p = 0.02 holds alone (α = 0.05) but not among 5 comparisons with larger p-values (α/5 = 0.01 first).
    one = [_comparison(8.0, 0.5, 0.03, 0.01, 0.02)]
    assert rr.across_runs([rr.load_source(_summary(tmp_path, "a", 400, one))])[0]["family_verdict"] == "holds"
    more = one + [_comparison(8.0, b, 0.0, 0.05, 0.5) for b in (1.0, 2.0, 3.0, 4.0)]
    rows = rr.across_runs([rr.load_source(_summary(tmp_path, "b", 400, more))])
    assert rows[0]["family_verdict"] == "inconclusive"


def test_gold_by_n_aligns_runs_and_leaves_missing_routes_blank(tmp_path):
    a = _summary(tmp_path, "a", 400, [_comparison(8.0, 1.0, 0.02, 0.01, 0.1, winner="bon:T@8")])
    b = _summary(tmp_path, "b", 2000, [_comparison(8.0, 1.0, 0.04, 0.01, 0.1)])
    rows = rr.gold_by_n([rr.load_source(a), rr.load_source(b)], 1.0)
    by_route = {r["route"]: r["gold"] for r in rows}
    assert by_route["bon:B@8"] == {400: pytest.approx(0.6), 2000: pytest.approx(0.6)}
    assert by_route["bon:T@8"] == {400: pytest.approx(0.62)}
    assert by_route["bon:A@8"] == {2000: pytest.approx(0.64)}
    assert by_route["dpo:none"] == {400: 0.65, 2000: 0.65}
    md = rr.render([rr.load_source(a), rr.load_source(b)], 1.0)
    assert "| minilm | minilm | 8 | A | 0.620 | 0.640 |" not in md  # A and T are distinct routes
    assert "| 0.620 |  |" in md


def test_labeller_and_extra_judges_are_read(tmp_path):
    comps = [_comparison(2.0, 1.0, 0.02, 0.01, 0.1)]
    d = _summary(
        tmp_path, "v", 400, comps, data={"labeller": "vader"},
        judges={"main": "minilm", "per_judge": {j: {"comparisons": comps} for j in ("minilm", "ngram", "vader")}},  # noqa: E501
    )  # fmt: skip
    src = rr.load_source(d)
    assert src.labeller == "vader"
    assert sorted(c.judge for c in src.comparisons) == ["minilm", "ngram", "vader"]
    assert "| vader | ngram | 2 |" in rr.render([src], 1.0)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["nowhere"], "RUN: no summary.json at 'nowhere'"),
        (["--budget", "0", "docs/results/beyond-frontier"], "--budget must be > 0 (got 0)"),
        (["--budget", "3.5", "docs/results/beyond-frontier"], "--budget 3.5: no run read compares"),
        (["docs/results/beyond-planted-sweep"], "is not a beyond-frontier summary.json"),
        (["--write", "no-such.md", "docs/results/beyond-frontier"], "--write: no file 'no-such.md'"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(args, needle, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert rr.main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_write_replaces_only_the_block_and_keeps_the_rest(tmp_path):
    run = _summary(tmp_path, "r", 400, [_comparison(8.0, 1.0, 0.02, 0.01, 0.1)])
    doc = tmp_path / "doc.md"
    doc.write_text(
        "before\n<!-- route-reading: x -->\nstale\n<!-- /route-reading -->\nafter\n", encoding="utf-8"
    )
    assert rr.main(["--budget", "1", str(run), "--write", str(doc)]) == 0
    text = doc.read_text(encoding="utf-8")
    assert text.startswith(f"before\n<!-- route-reading: --budget 1 {run} -->\nRuns read: n = 400")
    assert text.endswith("<!-- /route-reading -->\nafter\n") and "stale" not in text
    plain = tmp_path / "plain.md"
    plain.write_text("no block\n", encoding="utf-8")
    assert rr.main([str(run), "--write", str(plain)]) == 2
    assert plain.read_text(encoding="utf-8") == "no block\n"


def test_the_committed_docs_block_is_what_the_committed_summaries_give(monkeypatch):
    monkeypatch.chdir(ROOT)
    text = DOC.read_text(encoding="utf-8")
    args = rr.block_args(text)
    assert args, "docs/choosing-a-route.md lost its route-reading block"
    assert rr.update_block(text, args) == text, (
        "docs/choosing-a-route.md is stale: run python -m privalign.experiments.route_reading "
        + " ".join(args)
        + " --write docs/choosing-a-route.md"
    )
