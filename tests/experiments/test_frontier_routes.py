"""The frontier is a recipe over the route registry (issue 37 item 1).

* The committed records of the full run (docs/results/beyond-frontier/records) are reused, with the same
  identities, by the registry's routes: every (route, seed) of the full configuration comes back from them
  (records_only: nothing is fitted or trained) and the curves recompute the committed summary's.
* A route is one module: a toy route registered here (one class) runs through the frontier's cells,
  records, resume and summary on a toy setting, with nothing else changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest

import privalign.experiments.frontier as fr
from privalign.experiments import routes
from privalign.experiments.base import RunContext
from privalign.experiments.config import load_config, packaged_config_path
from privalign.experiments.record_store import identity
from privalign.experiments.routes.base import Bench, SelectorRoute

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "results" / "beyond-frontier"


def _full_cfg(**kw: Any) -> dict:
    cfg = load_config(packaged_config_path("beyond_frontier"), fr.EXPERIMENTS["beyond-frontier"].schema)
    return {**cfg, "prior_results": str(COMMITTED / "records"), **kw}


def _stub_pairs(cfg: dict, n: int) -> dict:
    """The public facts the record identities depend on: the data identity (the public configuration that
    generates the pairs) and n; no private pair is needed to find a committed record."""
    return {
        "data_identity": identity({k: cfg.get(k) for k in fr._DATA_KEYS}),
        "pairs": SimpleNamespace(prompts=[""] * n),
    }


def test_committed_records_are_reused_by_the_registry_routes(tmp_path, monkeypatch):
    cfg = _full_cfg(records_only=True)
    stub = _stub_pairs(cfg, cfg["n_pairs"])
    monkeypatch.setattr(fr, "_pairs", lambda cfg, ctx: stub)
    ctx = RunContext(run_dir=tmp_path)
    exp = fr.EXPERIMENTS["beyond-frontier"]
    recs = []
    for i, cell in enumerate(exp.cells(cfg, ctx)):
        if cell["route"] == "data":
            continue
        recs += exp.run_cell(cell, cfg, ctx, np.random.SeedSequence(0, spawn_key=(i,)))
    summary = json.loads((COMMITTED / "summary.json").read_text(encoding="utf-8"))
    pending = [f"{r['route']} seed={r['seed_index']}" for r in recs if r["kind"] == "pending"]
    # every (route, seed) the committed run recorded found its records by identity (the committed summary's
    # pending cells, sample-DP DPO seeds 3-4, have none): nothing fitted or trained
    assert sorted(pending) == sorted(summary["pending"]) and len(pending) < len(recs) // 10
    assert not (tmp_path / "reward_models").exists() and not (tmp_path / "policies").exists()
    committed = {c["route"]: c for c in summary["curves"]}
    curves = {c["route"]: c for c in fr.frontier_curves(recs)}
    assert set(curves) == set(committed) == set(cfg["routes"])
    for route, c in curves.items():
        want = committed[route]
        assert c["seeds"] == want["seeds"] and c["unit"] == want["unit"] and c["label"] == want["label"]
        assert [p["x"] for p in c["points"]] == [p["x"] for p in want["points"]]
        np.testing.assert_allclose([p["gold"] for p in c["points"]], [p["gold"] for p in want["points"]])
        np.testing.assert_allclose([p["kl"] for p in c["points"]], [p["kl"] for p in want["points"]])
    # every record the run read carries the identity the registry's route computes for it
    copied = list((tmp_path / "records").rglob("*.json"))
    assert len(copied) > 100
    for path in copied:
        rel = path.relative_to(tmp_path / "records")
        assert (
            json.loads(path.read_text())["identity"]
            == json.loads((COMMITTED / "records" / rel).read_text())["identity"]
        )


# ---------------------------------------------------------------------------------------------------------
# a toy route: one class, registered here
# ---------------------------------------------------------------------------------------------------------


class _Shortest:
    """Best-of-n by a public score (minus the text's length): a selection law over the reference samples."""

    def __init__(self, scores: np.ndarray) -> None:
        self.scores = scores

    def expected(self, values: np.ndarray, x: int) -> np.ndarray:
        from privalign.experiments.rlhf_bon import bon_expected_gold

        return bon_expected_gold(self.scores, values, x)

    def kl(self, x: int) -> float:
        from privalign.experiments.rlhf_bon import bon_kl_ties

        return float(bon_kl_ties(self.scores, x).mean())


class ToyShortestRoute(SelectorRoute):
    """``toy:short``: best-of-n preferring the shortest reference sample. Reads no private data:
    non-private in name only (it is a test of the registry, not a mechanism)."""

    family = "toy"
    methods: ClassVar[dict[str, str]] = {"short": "non-private"}
    seeds_key = "privbon_seeds"
    keys = ("eval_prompts", "reference_samples", "max_new_tokens", "bon_ns", "gold")
    fitted: ClassVar[list[int]] = []

    @classmethod
    def label(cls, method: str) -> str:
        return "shortest-of-n (toy)"

    def selection(self, bench: Bench) -> _Shortest:
        bench.pending("toy route would be fitted")
        self.fitted.append(bench.cell["seed_index"])
        texts = bench.reference()["texts"]
        return _Shortest(-np.array([[len(t) for t in row] for row in texts], float))

    def guarantee(self, bench: Bench) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        return None, {"note": "reads no private data"}


TOY_TEXTS = [["a", "bbbb", "cc", "aaaaaa"], ["xyz", "e", "oo", "pqrs"], ["aa", "b", "cccc", "ee"]]


@pytest.fixture
def toy_route():
    routes.register(ToyShortestRoute)
    ToyShortestRoute.fitted.clear()
    yield ToyShortestRoute
    routes.unregister("toy")


def _toy_run(cfg: dict, run_dir: Path, monkeypatch) -> list[dict]:
    """Every route cell of ``cfg`` on a toy reference (3 prompts × 4 texts, gold = share of vowels)."""
    texts = TOY_TEXTS
    gold = [[(sum(c in "aeiou" for c in t) + 1) / (len(t) + 2) for t in row] for row in texts]
    ctx = RunContext(run_dir=run_dir)
    ctx.cache["reference"] = {"texts": texts, "gold": gold}
    ctx.cache["pairs"] = _stub_pairs(cfg, cfg["n_pairs"])
    exp = fr.EXPERIMENTS["beyond-frontier"]
    out = []
    for i, cell in enumerate(exp.cells(cfg, ctx)):
        if cell["route"] != "data":
            out += exp.run_cell(cell, cfg, ctx, np.random.SeedSequence(0, spawn_key=(i,)))
    return out


def test_a_route_registered_in_one_module_runs_through_the_frontier(toy_route, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="taken"):
        routes.register(ToyShortestRoute)  # the family is taken
    cfg = _full_cfg(
        routes=["toy:short"],
        prior_results="",
        alt_gold="",
        bon_ns=[1, 2, 4],
        reference_samples=4,
        privbon_seeds=2,
    )
    assert fr.parse_route("toy:short") == {
        "route": "toy:short",
        "family": "toy",
        "method": "short",
        "epsilon": None,
    }
    with pytest.raises(fr.ExperimentError, match="routes"):
        fr.parse_route("toy:short@8")  # non-private: no ε
    recs = _toy_run(cfg, tmp_path, monkeypatch)
    assert [r["route"] for r in recs] == ["toy:short", "toy:short"] and toy_route.fitted == [0, 1]
    r = recs[0]
    assert r["label"] == "shortest-of-n (toy)" and r["guarantee"]["unit"] == "non-private"
    assert r["guarantee"]["note"] == "reads no private data"
    assert [p["x"] for p in r["points"]] == [1, 2, 4] and r["points"][0]["kl"] == pytest.approx(0.0)
    # the frontier evaluates the route's law: the gold and KL of best-of-n on the toy scores
    from privalign.experiments.rlhf_bon import bon_expected_gold, bon_kl_ties

    texts = TOY_TEXTS
    scores = -np.array([[len(t) for t in row] for row in texts], float)
    gold = np.array([[(sum(c in "aeiou" for c in t) + 1) / (len(t) + 2) for t in row] for row in texts])
    for p, n in zip(r["points"], [1, 2, 4]):
        assert p["per_prompt_gold"] == pytest.approx(bon_expected_gold(scores, gold, n))
        assert p["kl"] == pytest.approx(bon_kl_ties(scores, n).mean())
    assert 0 < r["points"][1]["kl"] < r["points"][2]["kl"] <= np.log(4)
    # resume: the records are reused by identity, nothing is selected again; records_only too
    again = _toy_run({**cfg, "records_only": True}, tmp_path, monkeypatch)
    assert toy_route.fitted == [0, 1] and json.dumps(again, sort_keys=True) == json.dumps(
        recs, sort_keys=True
    )
    s = fr._summarize(recs, cfg)
    assert [c["route"] for c in s["curves"]] == ["toy:short"] and s["curves"][0]["seeds"] == 2
