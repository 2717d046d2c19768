"""beyond-frontier: route parsing and config errors, the prompt-disjointness check, PrivBoN's exact selection
law, the verdict on constructed records (each outcome), and the per-record reuse (identity, resume,
prior_results) on a tiny random Llama with a fake gold — no real language model."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from privalign.experiments import frontier as fr
from privalign.experiments.base import ExperimentError, RunContext
from privalign.experiments.config import ConfigError, validate_config

# ---------------------------------------------------------------------------------------------------------
# routes and configuration
# ---------------------------------------------------------------------------------------------------------


def test_parse_route_accepts_every_family():
    assert fr.parse_route("dpo:none") == {
        "route": "dpo:none",
        "family": "dpo",
        "method": "none",
        "epsilon": None,
    }
    assert fr.parse_route("dpo:sample@2")["epsilon"] == 2.0
    assert fr.parse_route("bon:TRM-sample@8")["method"] == "TRM-sample"
    assert fr.parse_route("privbon:MLE@8")["family"] == "privbon"
    assert fr.parse_route("bon:MLE")["epsilon"] is None


@pytest.mark.parametrize(
    "spec",
    [
        "dpo",
        "ppo:RRIHT@8",
        "dpo:label",
        "dpo:none@8",
        "bon:RRIHT@0",
        "bon:RRIHT@inf",
        "privbon:RRIHT@8",
        "bon:X@8",
    ],
)
def test_parse_route_refuses_bad_specs_naming_the_key(spec):
    with pytest.raises(ExperimentError, match="config key 'routes'") as ei:
        fr.parse_route(spec)
    assert "\n" not in str(ei.value)


def test_route_units_say_per_answer_for_privbon():
    assert "PER ANSWER" in fr.route_unit(fr.parse_route("privbon:MLE@8"))
    assert fr.route_unit(fr.parse_route("bon:RRIHT@8")).startswith("ε-label-DP")
    assert fr.route_unit(fr.parse_route("dpo:sample@8")).startswith("(ε, δ)-DP")


def _cfg(**kw):
    schema = fr.EXPERIMENTS["beyond-frontier"].schema
    return validate_config({k: f.default for k, f in schema.items()} | kw, schema, source="test")


@pytest.mark.parametrize(
    "key,value",
    [("label_rule", "softmax"), ("n_pairs", 2), ("epsilons", [-1.0]), ("dpo_seeds", 0), ("alt_gold", "gpt")],
)
def test_bad_config_values_name_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        _cfg(**{key: value})


@pytest.mark.parametrize(
    "kw,key",
    [
        ({"n_pairs": 20_001}, "n_pairs"),
        ({"eval_prompts": 900, "grpo_prompts": 100}, "eval_prompts"),
        ({"bon_ns": [1, 32]}, "bon_ns"),
        ({"routes": ["dpo:none", "dpo:none"]}, "routes"),
        ({"routes": ["dpo:sample@8"], "delta": 0.5}, "delta"),
    ],
)
def test_preflight_refuses_inconsistent_configs(tmp_path, kw, key):
    with pytest.raises(ExperimentError, match=key) as ei:
        fr._preflight(_cfg(**kw), RunContext(run_dir=tmp_path))
    assert "\n" not in str(ei.value)


# ---------------------------------------------------------------------------------------------------------
# prompts disjoint from the private pairs
# ---------------------------------------------------------------------------------------------------------


class _Pairs:
    def __init__(self, prompts, chosen, rejected):
        self.prompts, self.chosen, self.rejected = list(prompts), list(chosen), list(rejected)


def test_disjointness_check_passes_on_disjoint_prompts():
    pairs = _Pairs(["a b c", "d e f"], ["x y", "z w"], ["q r", "s t"])
    assert fr.check_frontier_disjoint(pairs, ["g h i"], ["j k l"])["overlap"] == 0


@pytest.mark.parametrize(
    "eval_prompts,rl_prompts",
    [(["a  b c"], ["j k"]), (["g h"], ["d e f"]), (["x y"], ["j k"]), (["g h"], ["g  h"])],
)
def test_disjointness_check_fails_on_overlap(eval_prompts, rl_prompts):
    pairs = _Pairs(["a b c", "d e f"], ["x y", "z w"], ["q r", "s t"])
    with pytest.raises(ExperimentError, match="overlap"):
        fr.check_frontier_disjoint(pairs, eval_prompts, rl_prompts)


# ---------------------------------------------------------------------------------------------------------
# PrivBoN's exact selection law
# ---------------------------------------------------------------------------------------------------------


def test_privbon_law_limits_and_normalisation():
    from privalign.experiments.rlhf_bon import bon_expected_gold
    from privalign.experiments.routes.privbon import privbon_law

    rng = np.random.default_rng(0)
    s, g = rng.normal(size=(5, 8)), rng.random((5, 8))
    for n in (1, 3, 8):
        q0 = privbon_law(s, n, 0.0)  # σ = 0: plain best-of-n over a random n-subset
        np.testing.assert_allclose(q0.sum(axis=1), 1.0)
        np.testing.assert_allclose((q0 * g).sum(axis=1), bon_expected_gold(s, g, n), atol=1e-12)
        np.testing.assert_allclose(privbon_law(s, n, 1e9), 1 / 8, atol=1e-6)  # σ → ∞: uniform
    q = privbon_law(s, 8, 1.0)  # n = m: the softmax itself
    np.testing.assert_allclose(q, np.exp(s) / np.exp(s).sum(axis=1, keepdims=True), atol=1e-12)


# ---------------------------------------------------------------------------------------------------------
# the verdict on constructed records
# ---------------------------------------------------------------------------------------------------------


def _curve(route, golds, kls, seed, P=200, noise=0.1, seeds=3):
    """Records of a route: per seed, points at ``kls`` whose per-prompt gold scatters around ``golds``."""
    r = fr.parse_route(route)
    base = np.random.default_rng(99).normal(0, noise, size=P)  # a prompt effect shared by routes and seeds
    rng = np.random.default_rng(seed)
    out = []
    for k in range(seeds):
        pts = [
            {"x": i, "kl": kl, "kl_se": 0.0, "per_prompt_gold": (g + base + rng.normal(0, noise, P)).tolist()}
            for i, (g, kl) in enumerate(zip(golds, kls))
        ]
        out.append(
            {
                "kind": "frontier",
                **r,
                "seed_index": k,
                "label": fr.route_label(route),
                "guarantee": {"unit": fr.route_unit(r)},
                "points": pts,
                "root_seed": 1,
                "n_bootstrap": 400,
                "kl_budgets": [1.0],
                "equivalence_margin": 0.02,
            }
        )
    return out


def test_verdict_holds_when_the_winner_is_clearly_ahead():
    recs = _curve("dpo:label@8", [0.5, 0.7, 0.8], [0, 0.5, 3.0], 1) + _curve(
        "bon:RRIHT@8", [0.5, 0.55], [0, 1.5], 2
    )
    v, m = fr.frontier_verdict(recs, budgets=[1.0])
    assert v == "holds", m
    # at KL ≤ 1 the DPO path is interpolated between (0.5, 0.7) and (3.0, 0.8): gold ≈ 0.7 + 0.02
    c = fr.frontier_comparisons(recs, budgets=[1.0])[0]
    assert c["winner"] == "dpo:label@8" and abs(c["ranking"][0]["gold"] - 0.72) < 0.02
    assert "label-DP DPO" in m


def test_verdict_does_not_hold_when_two_routes_are_shown_equal():
    recs = _curve("bon:RRIHT@8", [0.5, 0.6], [0, 1.0], 3, P=2000, noise=0.02) + _curve(
        "bon:DenseRR@8", [0.5, 0.6], [0, 1.0], 4, P=2000, noise=0.02
    )
    v, m = fr.frontier_verdict(recs, budgets=[1.0])
    assert v == "does not hold", m


def test_verdict_inconclusive_when_underpowered_or_alone():
    recs = _curve("bon:RRIHT@8", [0.5, 0.6], [0, 1.0], 5, P=8, noise=0.3, seeds=2) + _curve(
        "bon:DenseRR@8", [0.5, 0.6], [0, 1.0], 6, P=8, noise=0.3, seeds=2
    )
    v, m = fr.frontier_verdict(recs, budgets=[1.0])
    assert v == "inconclusive" and "power" in m
    v2, _ = fr.frontier_verdict(_curve("bon:RRIHT@8", [0.5, 0.6], [0, 1.0], 5), budgets=[1.0])
    assert v2 == "inconclusive"


def test_dpo_privacy_cost_rule_returns_each_outcome():
    """Non-private minus private DPO at equal KL, Bonferroni (α = 0.05) over the pairs: a clear cost holds,
    a gap shown inside the margin does not hold, a noisy small sample is inconclusive."""
    base = _curve("dpo:none", [0.5, 0.7], [0, 1.0], 11, P=2000, noise=0.02)
    costly = _curve("dpo:label@8", [0.5, 0.6], [0, 1.0], 12, P=2000, noise=0.02)
    free = _curve("dpo:label@2", [0.5, 0.7], [0, 1.0], 13, P=2000, noise=0.02)
    got = {c["route"]: c for c in fr.dpo_privacy_cost(base + costly + free, budgets=[1.0])}
    assert got["dpo:label@8"]["verdict"] == "holds" and abs(got["dpo:label@8"]["cost"] - 0.1) < 0.01
    assert got["dpo:label@2"]["verdict"] == "does not hold", got["dpo:label@2"]
    # at KL ≤ 0.5 both paths are mixtures halfway to their first checkpoint: half the cost
    half = fr.dpo_privacy_cost(base + costly, budgets=[0.5])[0]
    assert abs(half["cost"] - 0.05) < 0.01 and half["where"]["private"]["kl"] == 0.5
    noisy = _curve("dpo:none", [0.5, 0.6], [0, 1.0], 14, P=8, noise=0.3, seeds=2)
    noisy += _curve("dpo:sample@8", [0.5, 0.58], [0, 1.0], 15, P=8, noise=0.3, seeds=2)
    assert [c["verdict"] for c in fr.dpo_privacy_cost(noisy, budgets=[1.0])] == ["inconclusive"]
    # nothing to compare without non-private DPO
    assert fr.dpo_privacy_cost(costly + free, budgets=[1.0]) == []


def test_plain_reading_names_winner_and_significance():
    from privalign.experiments.plain import READERS

    recs = _curve("dpo:label@8", [0.5, 0.7], [0, 0.5], 1) + _curve("bon:RRIHT@8", [0.5, 0.55], [0, 1.5], 2)
    res = fr.frontier_verdict(recs, budgets=[1.0])
    line = READERS["B-3"](res[0], res.facts)
    assert "ε = 8" in line and "label-DP DPO" in line and "significant" in line and "\n" not in line
    # a label-DP winner over a label-DP runner-up: no brackets, but the reading says what label-DP protects
    assert "[label-DP]" not in line and "label only" in line
    mixed = _curve("bon:TRM-label@8", [0.5, 0.7], [0, 0.5], 1)
    mixed += _curve("bon:TRM-sample@8", [0.5, 0.6], [0, 0.5], 2)
    res = fr.frontier_verdict(mixed, budgets=[1.0])
    line = READERS["B-3"](res[0], res.facts)
    assert "TRM-label RM → best-of-n [label-DP]" in line and "TRM-sample RM → best-of-n [sample-DP]" in line
    sample_wins = _curve("dpo:sample@8", [0.5, 0.7], [0, 0.5], 1)
    sample_wins += _curve("dpo:label@8", [0.5, 0.6], [0, 0.5], 2)
    res = fr.frontier_verdict(sample_wins, budgets=[1.0])
    assert "label only" not in READERS["B-3"](res[0], res.facts)
    with_privbon = recs + _curve("privbon:MLE@8", [0.5, 0.52], [0, 0.3], 7)
    res = fr.frontier_verdict(with_privbon, budgets=[1.0])
    assert "per answer" in READERS["B-3"](res[0], res.facts)


# ---------------------------------------------------------------------------------------------------------
# end to end on a tiny model: records, identity, resume, prior_results
# ---------------------------------------------------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("opacus")

from _util import tiny_char_llama  # noqa: E402


def _tiny_base():
    """A randomly initialised one-layer Llama and a character tokenizer (tests/_util.py), in eval mode."""
    model, tok = tiny_char_llama(layers=1, seed=0)
    model.eval()
    return model, tok, "tiny-llama"


class _FakeGold:
    """P(positive) from the share of vowels: deterministic, in (0, 1)."""

    def score(self, texts):
        return np.array([(sum(c in "aeiou" for c in t) + 1) / (len(t) + 2) for t in texts])


def _prompts_stub(cfg):
    E, G, n = cfg["eval_prompts"], cfg["grpo_prompts"], cfg["n_pairs"]
    words = [f"prompt {k} " for k in range(E + G + n)]
    info = lambda off: {"offset": off}  # noqa: E731
    return {
        "eval": words[:E],
        "eval_info": info(0),
        "grpo": words[E : E + G],
        "grpo_info": info(E),
        "pairs": words[E + G :],
        "pairs_info": info(E + G),
    }


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(fr, "_prompts", _prompts_stub)
    base = _tiny_base()

    def ctx(run_dir):
        c = RunContext(run_dir=run_dir)
        c.cache["base"] = base
        c.cache["gold"] = _FakeGold()
        return c

    cfg = _cfg(
        routes=["dpo:label@8", "bon:RRIHT@8", "privbon:MLE@8"],
        eval_prompts=3,
        grpo_prompts=1,
        n_pairs=16,
        max_new_tokens=4,
        reference_samples=4,
        eval_samples=2,
        bon_ns=[1, 2, 4],
        dpo_batch=4,
        dpo_epochs=1,
        dpo_max_length=16,
        dpo_lora_rank=2,
        dpo_eval_every=2,
        n_features=256,
        sparsity=8,
        n_bootstrap=100,
        bon_seeds=2,
        dpo_seeds=1,
    )
    return cfg, ctx


def _run_all(cfg, ctx):
    exp = fr.EXPERIMENTS["beyond-frontier"]
    recs = []
    for i, cell in enumerate(exp.cells(cfg, ctx)):
        recs += exp.run_cell(cell, cfg, ctx, np.random.SeedSequence(0, spawn_key=(i,)))
    return recs


def test_tiny_end_to_end_records_and_reuse(tiny, tmp_path, monkeypatch):
    cfg, make_ctx = tiny
    ctx = make_ctx(tmp_path / "run1")
    recs = _run_all(cfg, ctx)
    curves = [r for r in recs if r["kind"] == "frontier"]
    assert {r["route"] for r in curves} == {"dpo:label@8", "bon:RRIHT@8", "privbon:MLE@8"}
    dpo = next(r for r in curves if r["route"] == "dpo:label@8")
    assert [p["x"] for p in dpo["points"]] == [0, 2, 4] and dpo["points"][0]["kl"] == 0.0
    assert dpo["guarantee"]["unit"].startswith("ε-label-DP") and dpo["guarantee"]["epsilon"] == 8.0
    pb = next(r for r in curves if r["route"] == "privbon:MLE@8")
    assert pb["guarantee"]["per_answer"] and "k·ε" in pb["guarantee"]["composition"]
    assert pb["points"][0]["kl"] == pytest.approx(0.0, abs=1e-12)  # n = 1: the reference itself
    # the private pairs: cached, never regenerated; the reference samples too
    pairs_file = tmp_path / "run1" / "data" / "pairs.jsonl"
    assert len(pairs_file.read_text().splitlines()) == 16
    before = pairs_file.stat().st_mtime_ns
    # resume in the same directory: nothing is trained or sampled again, the same records come back
    import privalign.rlhf.dpo as dpo_mod
    import privalign.rlhf.evaluate as ev

    def boom(*a, **k):
        raise AssertionError("re-ran work that has a record")

    monkeypatch.setattr(dpo_mod, "train_dpo", boom)
    monkeypatch.setattr(ev, "sample_with_logprobs", boom)
    again = _run_all(cfg, make_ctx(tmp_path / "run1"))
    assert json.dumps(again, sort_keys=True) == json.dumps(recs, sort_keys=True)
    assert pairs_file.stat().st_mtime_ns == before
    # a changed DPO setting changes the identity: the DPO records are not reused
    with pytest.raises(AssertionError, match="re-ran"):
        _run_all({**cfg, "dpo_beta": 0.2}, make_ctx(tmp_path / "run1"))
    monkeypatch.undo()
    monkeypatch.setattr(fr, "_prompts", _prompts_stub)
    # prior_results: a fresh run directory reuses run1's records (pairs regenerate identically)
    monkeypatch.setattr(dpo_mod, "train_dpo", boom)
    cfg2 = {**cfg, "prior_results": str(tmp_path / "run1" / "records")}
    fresh = _run_all(cfg2, make_ctx(tmp_path / "run2"))
    assert [r.get("points") for r in fresh] == [r.get("points") for r in recs]
    # …and their privacy statements (DPO's privacy event is a record of its own, reused with the steps)
    assert [r.get("guarantee") for r in fresh] == [r.get("guarantee") for r in recs]
    assert next(r for r in fresh if r["route"] == "dpo:label@8")["guarantee"]["privacy_event"] is not None
    assert (tmp_path / "run2" / "records").is_dir()
    # records_only: more seeds than recorded fit and train nothing; the missing (route, seed) cells are
    # pending, left out of the curves and named in the summary
    import privalign.estimation.tuning as tuning

    monkeypatch.setattr(tuning, "make_experiment_estimator", boom)  # a linear reward-model fit
    cfg3 = {**cfg2, "records_only": True, "dpo_seeds": 2, "bon_seeds": 3}
    part = _run_all(cfg3, make_ctx(tmp_path / "run3"))
    pending = sorted((r["route"], r["seed_index"]) for r in part if r["kind"] == "pending")
    assert pending == [("bon:RRIHT@8", 2), ("dpo:label@8", 1)]
    assert [r.get("points") for r in part if r["kind"] != "pending"] == [r.get("points") for r in recs]
    s = fr._summarize(part, cfg3)
    assert s["pending"] == ["bon:RRIHT@8 seed=2", "dpo:label@8 seed=1"] and "pending" in s["measured"]
    assert {c["route"]: c["seeds"] for c in s["curves"]}["bon:RRIHT@8"] == 2
    # …and without a reference record it refuses, naming the key
    with pytest.raises(ExperimentError, match="records_only"):
        _run_all({**cfg3, "prior_results": ""}, make_ctx(tmp_path / "run4"))


def test_tiny_summary_and_figure(tiny, tmp_path):
    from privalign.experiments.runner import check_finite_records

    cfg, make_ctx = tiny
    ctx = make_ctx(tmp_path / "run")
    recs = _run_all(cfg, ctx)
    check_finite_records(recs, "test")
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "run" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    s = fr._summarize(recs, cfg)
    assert s["verdict"] in ("holds", "does not hold", "inconclusive")
    assert {c["route"] for c in s["curves"]} == {"dpo:label@8", "bon:RRIHT@8", "privbon:MLE@8"}
    for c in s["comparisons"]:
        assert "winner" in c and math.isfinite(c["diff"])
    (tmp_path / "run" / "figures").mkdir()
    assert fr._plot(tmp_path / "run") == ["frontier_gold_vs_kl"]
    assert Path(tmp_path / "run" / "figures" / "frontier_gold_vs_kl.png").is_file()


def test_batched_sampling_gives_the_same_samples_and_logprobs():
    """``batch_rows`` (left padding, positions from the mask) changes the speed, not the samples."""
    import copy

    from privalign.rlhf.evaluate import sample_with_logprobs

    model, tok, _ = _tiny_base()
    ref = copy.deepcopy(model)
    prompts = ["a", "hello there", "abc def ghi jk", "x"]
    one = sample_with_logprobs(model, tok, prompts, 3, max_new_tokens=6, seed=5, reference=ref, batch_rows=1)
    many = sample_with_logprobs(model, tok, prompts, 3, max_new_tokens=6, seed=5, reference=ref, batch_rows=9)
    assert one["texts"] == many["texts"]
    np.testing.assert_array_equal(one["num_tokens"], many["num_tokens"])
    np.testing.assert_allclose(one["logp"], many["logp"], atol=1e-4)
    np.testing.assert_allclose(one["logp_ref"], many["logp_ref"], atol=1e-4)


def test_record_identities_do_not_depend_on_the_private_pairs(tiny, tmp_path):
    """The records are committed (docs/results): on neighbouring pair files (one pair's label flipped) every
    record identity is the same, so no record carries a hash of the private data."""
    import shutil

    cfg, make_ctx = tiny
    cfg = {**cfg, "routes": ["bon:RRIHT@8"]}
    recs = _run_all(cfg, make_ctx(tmp_path / "run1"))
    shutil.copytree(tmp_path / "run1" / "data", tmp_path / "run2" / "data")
    f2 = tmp_path / "run2" / "data" / "pairs.jsonl"
    lines = f2.read_text().splitlines()
    first = json.loads(lines[0])
    first["chosen"], first["rejected"] = (
        first["rejected"],
        first["chosen"],
    )  # the neighbour: one label flipped
    f2.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    assert f2.read_bytes() != (tmp_path / "run1" / "data" / "pairs.jsonl").read_bytes()
    ids = [fr._pairs(cfg, make_ctx(tmp_path / r))["data_identity"] for r in ("run1", "run2")]
    assert ids[0] == ids[1]
    cell = next(
        c
        for c in fr.EXPERIMENTS["beyond-frontier"].cells(cfg, make_ctx(tmp_path / "run1"))
        if "seed_index" in c
    )
    assert fr._cell_ident(cell, cfg, make_ctx(tmp_path / "run1"), ()) == fr._cell_ident(
        cell, cfg, make_ctx(tmp_path / "run2"), ()
    )
    digest = hashlib.sha256((tmp_path / "run1" / "data" / "pairs.jsonl").read_bytes()).hexdigest()
    for path in (tmp_path / "run1" / "records").rglob("*.json"):
        assert digest not in path.read_text()
    assert recs


def test_alt_gold_judges_the_same_selections_and_is_reused(tiny, tmp_path, monkeypatch):
    """``alt_gold = "vader"`` adds a second gold to the best-of-n and PrivBoN points (the same fits and
    selection laws): the main records are untouched, n = 1 gives each prompt's mean VADER score of its
    reference samples, a rerun reuses ``curve-alt.json`` without refitting, and the summary ranks the routes
    under the second gold."""
    from privalign.models.scorers import VaderScorer

    cfg, make_ctx = tiny
    cfg = {**cfg, "routes": ["bon:RRIHT@8", "privbon:MLE@8"]}
    plain = [r for r in _run_all(cfg, make_ctx(tmp_path / "run")) if r["kind"] == "frontier"]
    assert not fr.alt_gold_records(plain)
    alt_cfg = {**cfg, "alt_gold": "vader"}
    recs = _run_all(alt_cfg, make_ctx(tmp_path / "run"))
    curves = [r for r in recs if r["kind"] == "frontier"]
    ref = json.loads((tmp_path / "run" / "records" / "reference.json").read_text())
    vader = VaderScorer()
    per_prompt = [float(np.mean(vader.score(row))) for row in ref["texts"]]
    for r, r0 in zip(curves, plain):
        assert r["route"] == r0["route"]
        for p, p0 in zip(r["points"], r0["points"]):
            assert {k: p[k] for k in p0} == p0  # the main gold, KL and x are unchanged
            assert len(p["alt_per_prompt_gold"]) == 3 and p["alt_gold"] == pytest.approx(
                np.mean(p["alt_per_prompt_gold"])
            )
        assert r["points"][0]["alt_per_prompt_gold"] == pytest.approx(per_prompt)  # n = 1: uniform
        assert (fr._records_dir(r, make_ctx(tmp_path / "run")) / "curve-alt.json").is_file()

    def boom(*a, **k):
        raise AssertionError("refitted a reward model that has records")

    from privalign.experiments.routes import _reward

    monkeypatch.setattr(_reward, "fit_rm", boom)
    again = [r for r in _run_all(alt_cfg, make_ctx(tmp_path / "run")) if r["kind"] == "frontier"]
    assert json.dumps(again, sort_keys=True) == json.dumps(curves, sort_keys=True)
    summ = fr._summarize(recs, alt_cfg)
    assert summ["alt_gold"]["gold"] == "vader"
    assert summ["alt_gold"]["routes"] == ["bon:RRIHT@8", "privbon:MLE@8"]
    comps = summ["alt_gold"]["comparisons"]
    assert comps and all(c["nonprivate_dpo_gold"] is None for c in comps)
    for c in comps:
        assert {r["route"] for r in c["ranking"]} == {"bon:RRIHT@8", "privbon:MLE@8"}
    assert "alt_gold" not in fr._summarize(plain, cfg)
