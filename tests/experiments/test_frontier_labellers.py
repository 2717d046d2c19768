"""Labellers and judges that are not the same model (issue 37 item 2).

* The labeller draws the private pairs' Bradley–Terry labels (VADER's compound at a temperature, or a gold's
  logit); its scale is matched on public pairs.
* Every route is judged by every judge on the *same* selection: one law, several scorings; a judge added
  later refits the selection and refuses one that is not the recorded one.
* Routes declare their backbone; a lead claim is decided only under labellers whose backbone it does not
  share (:func:`privalign.experiments.frontier.leads_verdict`), three-valued, Holm over every test.
* Resume: the judges' records are reused without refitting.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from privalign.experiments import frontier as fr
from privalign.experiments.base import ExperimentError, RunContext
from privalign.experiments.config import validate_config
from privalign.experiments.record_store import identity
from privalign.experiments.routes import labellers as lb
from privalign.experiments.routes import route_class


def _cfg(**kw):
    schema = fr.EXPERIMENTS["beyond-frontier"].schema
    return validate_config({k: f.default for k, f in schema.items()} | kw, schema, source="test")


# ---------------------------------------------------------------------------------------------------------
# labellers: logits, the scale match, public pairs
# ---------------------------------------------------------------------------------------------------------


def test_labeller_logits_are_vader_compound_and_gold_logits():
    u = np.array([0.0, 0.5, 1.0])
    np.testing.assert_allclose(lb.labeller_logits("vader", u), [-1.0, 0.0, 1.0])
    np.testing.assert_allclose(lb.labeller_logits("minilm", np.array([0.5, 0.75])), [0.0, np.log(3.0)])


def test_match_scale_finds_the_temperature_of_equal_label_noise():
    rng = np.random.default_rng(0)
    ref = rng.normal(0, 2.0, 2000)  # a gold's logit differences
    raw = rng.uniform(-1, 1, 2000)  # VADER's compound differences
    target = lb.label_noise(ref, 1.0)
    s = lb.match_scale(raw, target)
    assert lb.label_noise(raw, s) == pytest.approx(target, abs=1e-5)
    # monotone: a larger scale is a less noisy labeller
    assert lb.label_noise(raw, s / 2) < target < lb.label_noise(raw, 2 * s)
    with pytest.raises(ValueError, match="labeller_scale"):
        lb.match_scale(np.zeros(5), 0.2)
    with pytest.raises(ValueError, match="labeller_scale"):
        lb.match_scale(raw, 0.6)


def test_public_pairs_skip_the_excluded_prompts(tmp_path):
    import gzip

    pool = tmp_path / "pool.jsonl.gz"
    rows = [
        {"prompt": "eval  prompt", "responses": [{"text": t} for t in ("a", "b", "c", "d")]},
        {"prompt": "public prompt", "responses": [{"text": t} for t in ("e", "f", "g", "g", " ", "h")]},
    ]
    with gzip.open(pool, "wt", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows))
    # whitespace-normalised exclusion; equal or blank texts are no pair
    assert lb.public_pairs(pool, ["eval prompt"]) == [("e", "f")]
    assert lb.public_pairs(pool, [], per_prompt=1) == [("a", "b"), ("e", "f")]


def test_data_identity_keeps_the_minilm_runs_and_separates_the_labellers():
    cfg = _cfg()
    assert fr.data_identity(cfg) == identity({k: cfg.get(k) for k in fr._DATA_KEYS})
    vader = fr.data_identity({**cfg, "labeller": "vader", "labeller_scale": 3.26})
    assert vader != fr.data_identity(cfg)
    assert vader != fr.data_identity({**cfg, "labeller": "vader", "labeller_scale": 1.0})


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("judges", "minilm, gpt", "judges"),
        ("judges", "vader, vader", "judges"),
        ("labeller_runs", "minilm=x, minilm=y", "labeller_runs"),
        ("labeller_runs", "minilm=x", "labeller_runs"),  # this run's own labeller
        ("leads", "bon:TRM-label", "leads"),
        ("leads", "bon:TRM-label>bon:Nope", "leads"),
    ],
)
def test_bad_labeller_keys_name_the_key(key, value, match):
    with pytest.raises(ExperimentError, match=match):
        fr._check_labellers(_cfg(**{key: value}))


def test_labeller_key_refuses_unknown_names():
    from privalign.experiments.config import ConfigError

    with pytest.raises(ConfigError, match="labeller"):
        _cfg(labeller="gpt")


# ---------------------------------------------------------------------------------------------------------
# backbones and the lead rule
# ---------------------------------------------------------------------------------------------------------


def test_routes_and_labellers_declare_their_backbones():
    bon, grpo, privbon, dpo = (route_class(f) for f in ("bon", "grpo", "privbon", "dpo"))
    for cls in (bon, grpo):
        assert cls.backbone("TRM-label") == cls.backbone("TRM-sample") == lb.MINILM
        assert cls.backbone("RRIHT") == lb.NGRAM
    assert privbon.backbone("TRM-none") == lb.MINILM and privbon.backbone("MLE") == lb.NGRAM
    assert dpo.backbone("label") not in (lb.MINILM, lb.NGRAM, None)
    assert lb.LABELLERS["minilm"].backbone == lb.MINILM and lb.LABELLERS["vader"].backbone is None
    assert not lb.independent(lb.MINILM, "minilm")
    assert lb.independent(lb.MINILM, "vader") and lb.independent(lb.MINILM, "ngram")
    assert not lb.independent(lb.NGRAM, "ngram") and lb.independent(None, "minilm")


def _curve(route, gold, seed, judges=None, P=120, noise=0.1, seeds=5):
    """Curve records of a selector route: per seed, a point at KL 0 (gold 0.5) and one at KL 0.5 (``gold``);
    ``judges`` maps a judge to its gold at KL 0.5 (same noise)."""
    r = fr.parse_route(route)
    base = np.random.default_rng(99).normal(0, noise, size=P)
    rng = np.random.default_rng(seed)
    out = []
    for k in range(seeds):

        def pp(g):
            return (g + base + rng.normal(0, noise, P)).tolist()

        pts = [
            {"x": 1, "kl": 0.0, "kl_se": 0.0, "per_prompt_gold": pp(0.5)},
            {"x": 4, "kl": 0.5, "kl_se": 0.0, "per_prompt_gold": pp(gold)},
        ]
        if judges is not None:
            for i, p in enumerate(pts):
                p["judges"] = {j: (p["per_prompt_gold"] if i == 0 else pp(g)) for j, g in judges.items()}
        out.append(
            {
                "kind": "frontier",
                **r,
                "seed_index": k,
                "label": fr.route_label(route),
                "guarantee": {"unit": fr.route_unit(r)},
                "points": pts,
            }
        )
    return out


JUDGES = ["minilm", "vader", "ngram"]
LEAD = "bon:TRM-label>bon:SampleDPIHT"


def _run(x_gold, y_gold, x_judges=None, y_judges=None):
    return _curve("bon:TRM-label@8", x_gold, 1, x_judges) + _curve("bon:SampleDPIHT@8", y_gold, 2, y_judges)


def _verdict(runs, leads=(LEAD,)):
    return fr.leads_verdict(
        runs, list(leads), epsilons=[8.0], budgets=[1.0], judges=JUDGES, n_bootstrap=1000, root_seed=3
    )


def test_leads_verdict_holds_when_x_leads_under_every_independent_labeller_and_judge():
    ahead = {j: 0.7 for j in JUDGES}
    same = {j: 0.5 for j in JUDGES}
    res = _verdict({"vader": _run(0.7, 0.5, ahead, same), "minilm": _run(0.7, 0.5, ahead, same)})
    assert res[0] == "holds"
    claim = res.facts["claims"][0]
    assert claim["independent_labellers"] == ["vader"]  # TRM-* shares the MiniLM labeller's backbone
    assert sorted(h[:2] for h in claim["holds_under"]) == sorted(
        [lab, j] for lab in ("vader", "minilm") for j in JUDGES
    )
    assert res.facts["holm_k"] == 6  # every (labeller, judge, ε, budget) test, both labellers


def test_leads_verdict_is_decided_only_by_labellers_the_route_does_not_share():
    """Ahead only under its own backbone's labeller, behind under VADER: the lead does not hold (it is not
    'holds' because of the MiniLM labeller)."""
    ahead = {j: 0.7 for j in JUDGES}
    same = {j: 0.5 for j in JUDGES}
    behind = {j: 0.55 for j in JUDGES}
    res = _verdict({"minilm": _run(0.7, 0.5, ahead, same), "vader": _run(0.5, 0.55, same, behind)})
    assert res[0] == "does not hold"
    holds = res.facts["claims"][0]["holds_under"]
    assert holds and all(h[0] == "minilm" for h in holds)  # named, but not deciding
    # with no independent labeller at all: inconclusive, whatever the MiniLM run says
    only = _verdict({"minilm": _run(0.7, 0.5, ahead, same)})
    assert only[0] == "inconclusive" and only.facts["claims"][0]["independent_labellers"] == []


def test_leads_verdict_inconclusive_when_underpowered_or_a_judge_is_missing():
    noisy = {j: 0.51 for j in JUDGES}
    base = {j: 0.5 for j in JUDGES}
    weak = fr.leads_verdict(
        {"vader": _curve("bon:TRM-label@8", 0.51, 1, noisy, P=10, noise=0.3, seeds=2)
         + _curve("bon:SampleDPIHT@8", 0.5, 2, base, P=10, noise=0.3, seeds=2)},
        [LEAD], epsilons=[8.0], budgets=[1.0], judges=JUDGES, n_bootstrap=500,
    )  # fmt: skip
    assert weak[0] == "inconclusive"
    # ahead under two judges, the third judge has no records: not "holds"
    ahead = {"minilm": 0.7, "vader": 0.7}
    res = _verdict({"vader": _run(0.7, 0.5, ahead, {"minilm": 0.5, "vader": 0.5})})
    tests = res.facts["tests"]
    assert res[0] == "inconclusive"
    assert [t["verdict"] for t in tests if t["judge"] == "ngram"] == ["inconclusive"]
    assert all(t["verdict"] == "holds" for t in tests if t["judge"] != "ngram")


def test_judge_records_read_judges_and_older_second_golds():
    recs = _curve("bon:RRIHT@8", 0.6, 1, {"vader": 0.9}, seeds=1)
    got = fr.judge_records(recs, "vader")
    assert got[0]["points"][1]["per_prompt_gold"] == recs[0]["points"][1]["judges"]["vader"]
    assert fr.judge_records(recs, "ngram") == [] and fr.judge_records(recs, "minilm") == recs
    old = [
        {
            **recs[0],
            "points": [{**p, "alt_per_prompt_gold": [0.3], "alt_gold": 0.3} for p in recs[0]["points"]],
        }
    ]
    for p in old[0]["points"]:
        p.pop("judges")
    (alt,) = fr.judge_records(old, "vader")
    assert alt["selection_verified"] is False and alt["points"][0]["per_prompt_gold"] == [0.3]


# ---------------------------------------------------------------------------------------------------------
# end to end on a tiny model: the labeller's draws, one selection judged thrice, the fingerprint, resume
# ---------------------------------------------------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("vaderSentiment")

from _util import tiny_char_llama  # noqa: E402

WORDS = ["good", "bad", "great", "awful", "fine", "terrible", "lovely", "boring"]


class _FakeGold:
    """P(positive) from the share of vowels: deterministic, in (0, 1)."""

    def score(self, texts):
        return np.array([(sum(c in "aeiou" for c in t) + 1) / (len(t) + 2) for t in texts])


def _prompts_stub(cfg):
    E, G, n = cfg["eval_prompts"], cfg["grpo_prompts"], cfg["n_pairs"]
    words = [f"{WORDS[k % 8]} prompt {k} " for k in range(E + G + n)]
    return {
        "eval": words[:E],
        "eval_info": {"offset": 0},
        "grpo": words[E : E + G],
        "grpo_info": {"offset": E},
        "pairs": words[E + G :],
        "pairs_info": {"offset": E + G},
    }


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(fr, "_prompts", _prompts_stub)
    model, tok = tiny_char_llama(layers=1, seed=0)
    model.eval()

    def ctx(run_dir):
        c = RunContext(run_dir=run_dir)
        c.cache["base"] = (model, tok, "tiny-llama")
        c.cache["gold"] = _FakeGold()
        return c

    cfg = _cfg(
        routes=["bon:RRIHT@8", "privbon:MLE@8"],
        eval_prompts=3,
        grpo_prompts=1,
        n_pairs=16,
        max_new_tokens=4,
        reference_samples=4,
        bon_ns=[1, 2, 4],
        n_features=256,
        sparsity=8,
        n_bootstrap=100,
        bon_seeds=2,
        labeller="vader",
        labeller_scale=3.26,
    )
    return cfg, ctx


def _run_all(cfg, ctx):
    exp = fr.EXPERIMENTS["beyond-frontier"]
    recs = []
    for i, cell in enumerate(exp.cells(cfg, ctx)):
        if cell["route"] == "data":  # the data record's scale match scores a public pool with MiniLM
            fr._pairs(cfg, ctx)
            fr._reference(cfg, ctx)
            continue
        recs += exp.run_cell(cell, cfg, ctx, np.random.SeedSequence(0, spawn_key=(i,)))
    return recs


def test_the_labeller_draws_the_pair_labels(tiny, tmp_path):
    """At a huge scale the Bradley–Terry draw is the labeller's arg-max: every pair whose VADER scores
    differ has the higher one chosen; the texts are the same as under the MiniLM labeller."""
    from privalign.data.preferences_io import load_jsonl_pairs
    from privalign.models.scorers import VaderScorer

    cfg, make_ctx = tiny
    sharp = {**cfg, "labeller_scale": 1e6}
    fr._pairs(sharp, make_ctx(tmp_path / "v"))
    p = load_jsonl_pairs(tmp_path / "v" / "data" / "pairs.jsonl")
    v = VaderScorer()
    c, r = v.score(p.chosen), v.score(p.rejected)
    assert np.all(c[c != r] > r[c != r])
    fr._pairs({**cfg, "labeller": "minilm", "labeller_scale": 1.0}, make_ctx(tmp_path / "m"))
    m = load_jsonl_pairs(tmp_path / "m" / "data" / "pairs.jsonl")
    assert sorted(zip(p.chosen, p.rejected)) != [] and {frozenset(t) for t in zip(p.chosen, p.rejected)} == {
        frozenset(t) for t in zip(m.chosen, m.rejected)
    }
    meta = json.loads((tmp_path / "v" / "data" / "pairs.meta.json").read_text())
    assert meta["labeller"] == "vader" and meta["labeller_scale"] == 1e6


def test_every_judge_scores_the_same_selection_and_is_reused(tiny, tmp_path, monkeypatch):
    from privalign.models.scorers import VaderScorer

    cfg, make_ctx = tiny
    one = {**cfg, "judges": "minilm, vader"}
    recs = [r for r in _run_all(one, make_ctx(tmp_path / "run")) if r["kind"] == "frontier"]
    ref = json.loads((tmp_path / "run" / "records" / "reference.json").read_text())
    vader = [float(np.mean(VaderScorer().score(row))) for row in ref["texts"]]
    for r in recs:
        d = fr._records_dir(r, make_ctx(tmp_path / "run"))
        curve = json.loads((d / "curve.json").read_text())
        judged = json.loads((d / "curve-judges.json").read_text())
        assert judged["selection"] == curve["selection"]  # one selection, several scorings
        for p in r["points"]:
            assert p["judges"]["minilm"] == pytest.approx(p["per_prompt_gold"])  # the main gold is a judge
        assert r["points"][0]["judges"]["vader"] == pytest.approx(vader)  # n = 1: the uniform law
    # a judge added later: the selection is refitted, checked against the recorded one, and judged
    three = {**cfg, "judges": "minilm, vader, ngram"}
    more = [r for r in _run_all(three, make_ctx(tmp_path / "run")) if r["kind"] == "frontier"]
    for r, r0 in zip(more, recs):
        assert all(p["judges"]["vader"] == p0["judges"]["vader"] for p, p0 in zip(r["points"], r0["points"]))
        assert all(len(p["judges"]["ngram"]) == 3 for p in r["points"])
    # resume: nothing refitted, the same records
    from privalign.experiments.routes import _reward

    def boom(*a, **k):
        raise AssertionError("refitted a reward model that has records")

    monkeypatch.setattr(_reward, "fit_rm", boom)
    again = [r for r in _run_all(three, make_ctx(tmp_path / "run")) if r["kind"] == "frontier"]
    assert json.dumps(again, sort_keys=True) == json.dumps(more, sort_keys=True)
    s = fr._summarize(again, {**three, "leads": "bon:RRIHT>privbon:MLE"})
    run = tmp_path / "run"
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in again))
    (run / "figures").mkdir(exist_ok=True)
    assert (
        fr._plot(run) == ["frontier_gold_vs_kl", "frontier_judges"]
        and (run / "figures" / "frontier_judges.png").is_file()
    )
    assert s["labeller"] == {"name": "vader", "scale": 3.26, "backbone": None}
    assert set(s["judges"]["per_judge"]) == {"minilm", "vader", "ngram"}
    for j in ("minilm", "vader", "ngram"):
        comps = s["judges"]["per_judge"][j]["comparisons"]
        assert comps and {r["route"] for r in comps[0]["ranking"]} == {"bon:RRIHT@8", "privbon:MLE@8"}
    assert s["leads"]["verdict"] in ("holds", "does not hold", "inconclusive")
    assert s["leads"]["holm_k"] == 3 * len(three["kl_budgets"])


def test_a_refitted_selection_that_differs_from_the_records_is_refused(tiny, tmp_path):
    cfg, make_ctx = tiny
    cfg = {**cfg, "routes": ["bon:RRIHT@8"], "bon_seeds": 1}
    _run_all(cfg, make_ctx(tmp_path / "run"))  # main records only (no judges, no fingerprint)
    d = tmp_path / "run" / "records" / "bon_RRIHT_eps8" / "seed-0"
    curve = json.loads((d / "curve.json").read_text())
    curve["points"][-1]["per_prompt_gold"][0] += 0.01  # as if the recorded selection were another fit's
    (d / "curve.json").write_text(json.dumps(curve))
    with pytest.raises(ExperimentError, match=r"1 of 9 prompt × x cells differ"):
        _run_all({**cfg, "judges": "vader"}, make_ctx(tmp_path / "run"))
    # with a fingerprint (records written with judges): a different one is refused too
    _run_all({**cfg, "judges": "vader"}, make_ctx(tmp_path / "run2"))
    d2 = tmp_path / "run2" / "records" / "bon_RRIHT_eps8" / "seed-0"
    curve = json.loads((d2 / "curve.json").read_text())
    curve["selection"] = "0" * 64
    (d2 / "curve.json").write_text(json.dumps(curve))
    with pytest.raises(ExperimentError, match="fingerprints differ"):
        _run_all({**cfg, "judges": "vader, ngram"}, make_ctx(tmp_path / "run2"))


def test_records_only_leaves_an_unjudged_selection_pending(tiny, tmp_path):
    cfg, make_ctx = tiny
    cfg = {**cfg, "routes": ["bon:RRIHT@8"], "bon_seeds": 1}
    _run_all(cfg, make_ctx(tmp_path / "run"))
    part = _run_all({**cfg, "judges": "vader", "records_only": True}, make_ctx(tmp_path / "run"))
    assert [r["kind"] for r in part] == ["pending"] and "judges" in part[0]["why"]


@pytest.mark.parametrize("name", ["beyond_frontier_vader", "beyond_frontier_vader_quick"])
def test_the_vader_configs_load_and_name_existing_runs(name):
    from privalign.experiments.config import load_config, packaged_config_path
    from privalign.experiments.record_store import repo_path

    cfg = load_config(packaged_config_path(name), fr.EXPERIMENTS["beyond-frontier"].schema)
    fr._check_labellers(cfg)
    assert cfg["labeller"] == "vader" and fr.csv(cfg, "judges") == ["minilm", "vader", "ngram"]
    assert all(fr.parse_route(r)["family"] in ("bon", "privbon") for r in cfg["routes"])  # no DPO/GRPO refit
    for entry in fr.csv(cfg, "labeller_runs"):
        assert repo_path(entry.partition("=")[2]).is_dir()
    assert fr.data_identity(cfg) != fr.data_identity({**cfg, "labeller": "minilm", "labeller_scale": 1.0})
