"""Beyond the papers: one gold-reward-vs-KL frontier for every private alignment route
(``beyond-frontier``, issue 29 item 4).

The setting of the DPO paper's controlled-sentiment experiment (Rafailov et al. 2023, §6.1) and of paper 2's
P2-6, on CPU: SmolLM2-135M-Instruct completes IMDb review openings; a gold sentiment model scores them.

* **Prompts** (public IMDb openings, :func:`privalign.rlhf.prompts.imdb_rl_prompts`), three disjoint slices
  of the fixed held-out order: ``[0, eval_prompts)`` for evaluation, the next ``grpo_prompts`` for GRPO, the
  next ``n_pairs`` for the private pairs. Disjointness is checked in code (:func:`check_frontier_disjoint`),
  and again per reward model by :func:`privalign.rlhf.prompts.check_prompts_disjoint`.
* **One private dataset for every route** (:func:`_pairs`): per pair prompt, two completions sampled from the
  base policy (HF fp32, the sampler of :func:`privalign.rlhf.evaluate.sample_with_logprobs`, so the pairs,
  the reference samples and the KL all come from one base policy), labelled by the MiniLM gold
  (``label_rule``: ``"bt"`` draws the label from Bradley–Terry on the gold logits, ``"argmax"`` takes the
  higher gold). Cached under ``RUN/data/pairs.jsonl`` (a rerun does not regenerate). Privacy unit
  everywhere: one preference pair (for the label-DP routes: its label, the texts public).
* **Routes** (``routes``: ``FAMILY:METHOD[@EPS]``), each a curve of gold against KL(π ‖ π_ref), one per seed.
  The families come from the route registry (:mod:`privalign.experiments.routes`): each route class declares
  its methods and their privacy kinds, its seeds key and record keys, and fits (a
  :class:`~privalign.experiments.routes.base.PolicyRoute` hands each checkpoint to :func:`_evaluate`; a
  :class:`~privalign.experiments.routes.base.SelectorRoute` hands a selection law over the reference samples);
  this module evaluates, records and decides. Built in:

  - ``dpo:none`` / ``dpo:label@ε`` / ``dpo:sample@ε``: :func:`privalign.rlhf.dpo.train_dpo`, evaluated at
    checkpoints on the eval prompts (gold mean; KL from the samples' log-probabilities).
  - ``bon:RM@ε``: a private reward model (linear ``RRIHT``, ``DenseRR``, ``SampleDPIHT``, ``DPSGDLinear``
    via ``estimation.tuning.make_experiment_estimator``; MiniLM ``TRM-sample`` (DP-SGD) / ``TRM-label``
    (RR) :class:`~privalign.estimation.transformer.DPTransformerRM`), then best-of-n from the eval prompts'
    reference samples at exact tie-aware KL (:func:`privalign.experiments.rlhf_bon.bon_expected_gold`,
    :func:`~privalign.experiments.rlhf_bon.bon_kl_ties`).
  - ``grpo:RM@ε``: GRPO (:func:`privalign.rlhf.train.align_policy`, TRL + LoRA) on the same reward model
    (the same fit as ``bon:RM@ε`` of the same seed), evaluated at checkpoints like DPO.
  - ``props:dpo@ε``: PROPS (Teku et al. 2025), label-DP DPO in ``props_stages`` stages
    (:mod:`privalign.experiments.routes.props`).
  - ``dpprefsyn:dpo@ε``: DPPrefSyn (Gao & Yang 2026), (ε, δ)-DP (unit one pair): a DP-PCA → DP k-means →
    per-cluster DP-SGD linear Bradley–Terry model labels the base policy's completions of the public GRPO
    prompts, then non-private DPO on those synthetic pairs (:mod:`privalign.experiments.routes.dpprefsyn`).
  - ``privbon:RM@ε``: PrivBoN at inference (:class:`privalign.alignment.priv_bon.PrivBoN`) on a
    NON-private reward model fitted on the same pairs, scores clipped to ``[−B, B]`` (``privbon_bound``), so
    Δ_r = 2B for any change of one pair: ε-DP **per answer**; k answers cost kε (the trained routes pay ε
    once). Exact expected gold and KL of its selection law over the reference samples (n-subsets
    enumerated).
* **Resumable**: every (route, seed, checkpoint) evaluation is a JSON record under
  ``RUN/records/ROUTE/seed-K/`` with an identity hash (route, seed, the configuration keys that change it,
  the pairs file's identity); records with a matching identity are reused, also from ``prior_results``
  (e.g. the committed ``docs/results/beyond-frontier/records``). A trained route's privacy statement (its
  privacy event; GRPO's reward-model prompt check) is a record too (``privacy.json``), so a fully recorded
  route trains and fits nothing.
* **Verdict** (:func:`frontier_verdict`, claim B-3): at each ε and KL budget, each route's best gold at KL ≤
  budget along its path (mixtures with the reference and between checkpoints are achievable, so the path is
  interpolated linearly), the winner vs the runner-up (one-sided bootstrap p-value over prompts × seeds,
  Holm across the comparisons, α = 0.05).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from privalign.experiments import routes
from privalign.experiments.base import Experiment, ExperimentError, RunContext
from privalign.experiments.config import Field
from privalign.experiments.record_store import RecordStore, identity, repo_path
from privalign.experiments.routes import (
    KIND_UNITS,
    RM_KEYS,
    PolicyRoute,
    Route,
    SelectorRoute,
)
from privalign.experiments.routes.base import Selection
from privalign.experiments.routes.labellers import LABELLERS, independent, labeller_logits
from privalign.experiments.runner import read_results
from privalign.stats import (
    best_on_path,
    bootstrap_diff,
    bootstrap_means,
    bootstrap_p_value,
    holm,
    interval,
    stream,
    within,
)

__all__ = [
    "EXPERIMENTS",
    "parse_route",
    "route_label",
    "route_seed",
    "check_frontier_disjoint",
    "frontier_curves",
    "frontier_comparisons",
    "dpo_privacy_cost",
    "frontier_verdict",
]

NAME = "beyond-frontier"
#: The built-in route families (the registry, :mod:`privalign.experiments.routes`, may hold more).
FAMILIES = ("dpo", "bon", "grpo", "privbon", "props", "dpprefsyn")
DPO_METHODS = ("none", "label", "sample")
RECORD_KIND = "frontier"
#: rows per batched generation call (prompts × samples) [our choice]: a CPU reads the weights once per token
#: step for all rows (privalign.rlhf.evaluate.sample_with_logprobs's ``batch_rows``)
ROWS = 32
#: Equivalence margin of the "does not hold" branch (a tie shown) [our choice]: 0.02 gold (P(positive)).
ALPHA = 0.05


# ---------------------------------------------------------------------------------------------------------
# routes
# ---------------------------------------------------------------------------------------------------------


def _err(msg: str) -> ExperimentError:
    return ExperimentError(f"{NAME}: {msg}")


def _route_class(family: str) -> type[Route]:
    return routes.route_class(family)


def parse_route(spec: str) -> dict[str, Any]:
    """``"dpo:label@8"`` → ``{"family": "dpo", "method": "label", "epsilon": 8.0}``; the family is looked up
    in the route registry (:mod:`privalign.experiments.routes`).

    Raises:
      ExperimentError: naming the config key ``routes`` (unknown family/method, a missing or extra ε, ε ≤ 0,
        PrivBoN on a private reward model).
    """
    s = str(spec)
    fam, sep, rest = s.partition(":")
    if not sep or fam not in routes.families():
        raise _err(
            f"config key 'routes': {s!r}: expected FAMILY:METHOD[@EPS] with FAMILY in {routes.families()}."
        )
    method, _, eps = rest.partition("@")
    kinds = _route_class(fam).methods
    if method not in kinds:
        raise _err(f"config key 'routes': {s!r}: method must be one of {tuple(kinds)} for {fam!r}.")
    if kinds[method] == "non-private":
        if eps:
            raise _err(f"config key 'routes': {s!r}: a non-private route takes no '@EPS'.")
        return {"route": s, "family": fam, "method": method, "epsilon": None}
    try:
        e = float(eps)
    except ValueError:
        raise _err(
            f"config key 'routes': {s!r}: a private route needs '@EPSILON' (e.g. {fam}:{method}@8)."
        ) from None
    if not (e > 0 and math.isfinite(e)):
        raise _err(f"config key 'routes': {s!r}: ε must be a finite number > 0.")
    return {"route": s, "family": fam, "method": method, "epsilon": e}


def route_kind(r: dict) -> str:
    """``"non-private"``, ``"label-DP"``, ``"sample-DP"`` or ``"per-answer"`` (the route class says)."""
    return str(_route_class(r["family"]).kind(r["method"]))


def route_unit(r: dict) -> str:
    """The route's guarantee and unit in words (the record, the legend and the reading say it)."""
    return KIND_UNITS[route_kind(r)]


def route_label(spec: str) -> str:
    """A short name for a person: ``"label-DP DPO"``, ``"RRIHT RM → best-of-n"``, ``"PrivBoN per answer
    (MLE RM)"``."""
    r = parse_route(spec)
    return _route_class(r["family"]).label(r["method"])


def route_seed(root_seed: int, key: str, k: int) -> np.random.SeedSequence:
    """The seed of ``key`` (a route or a reward model) and seed index ``k``, from the root seed and the
    *name* (not a position): a subset of the routes, in any order, reproduces the same fits and records."""
    h = int.from_bytes(hashlib.sha256(str(key).encode()).digest()[:4], "big")
    return np.random.SeedSequence(root_seed, spawn_key=(2**27, h, int(k)))


def _seeds(cfg: dict, fam: str) -> int:
    return int(cfg[_route_class(fam).seeds_key])


# ---------------------------------------------------------------------------------------------------------
# schema, preflight, data
# ---------------------------------------------------------------------------------------------------------


#: second golds of another family than the MiniLM gold (a robustness check of the best-of-n/PrivBoN routes)
ALT_GOLDS = ("", "vader")


def _schema() -> dict[str, Field]:
    from privalign.experiments.config import estimator_fields

    s = {k: v for k, v in estimator_fields().items() if k not in ("methods", "tune")}
    s.update(
        {
            "sparsity": Field("int", 32, "s for the IHT methods", low=1),
            "n_features": Field("int", 4096, "hashed n-gram dimension d", low=2),
            "ngram_max": Field("int", 1, "largest word n-gram", low=1),
            "routes": Field("list[str]", ["dpo:none", "dpo:label@8", "bon:RRIHT@8"], "FAMILY:METHOD[@EPS]"),
            "epsilons": Field("list[float]", [8.0, 2.0], "the ε panels of the figure and verdict", low=1e-12),
            "eval_prompts": Field("int", 64, "held-out evaluation prompts (slice [0, E))", low=2),
            "grpo_prompts": Field("int", 64, "GRPO prompts (the next slice)", low=1),
            "n_pairs": Field(
                "int", 512, "private preference pairs (one per prompt of the next slice)", low=8
            ),
            "label_rule": Field("str", "bt", "pair label from the gold", choices=("bt", "argmax")),
            "max_new_tokens": Field("int", 16, "completion length (pairs, reference, evaluation)", low=1),
            "reference_samples": Field("int", 16, "base-policy samples per eval prompt (BoN pool)", low=2),
            "eval_samples": Field("int", 4, "policy samples per eval prompt at a checkpoint", low=1),
            "bon_ns": Field("list[int]", [1, 2, 4, 8, 16], "best-of-n sizes (≤ reference_samples)", low=1),
            "dpo_seeds": Field("int", 2, "seeds per DPO route", low=1),
            "bon_seeds": Field("int", 5, "fit seeds per best-of-n route", low=1),
            "grpo_seeds": Field("int", 2, "seeds per GRPO route", low=1),
            "privbon_seeds": Field("int", 1, "fit seeds per PrivBoN route", low=1),
            "dpo_beta": Field("float", 0.1, "DPO β", low=1e-12),
            "dpo_lr": Field("float", 5e-4, "DPO LoRA learning rate", low=1e-12),
            "dpo_batch": Field("int", 16, "DPO (expected) batch size", low=1),
            "dpo_epochs": Field("int", 2, "DPO epochs", low=1),
            "dpo_max_length": Field("int", 64, "DPO tokens per sequence", low=4),
            "dpo_lora_rank": Field("int", 8, "DPO LoRA rank", low=1),
            "dpo_clip": Field("float", 1.0, "sample-DP DPO clipping norm C", low=1e-12),
            "dpo_eval_every": Field("int", 25, "evaluate DPO every this many steps (and the last)", low=1),
            "trm_epochs": Field("float", 2.0, "transformer RM epochs", low=1e-6),
            "trm_batch": Field("int", 64, "transformer RM (expected) batch", low=1),
            "trm_lr": Field("float", 1e-3, "transformer RM learning rate", low=1e-12),
            "trm_clip": Field("float", 1.0, "transformer RM DP-SGD clip norm", low=1e-12),
            "grpo_steps": Field("int", 150, "GRPO steps", low=1),
            "grpo_eval_every": Field("int", 50, "evaluate GRPO every this many steps (and the last)", low=1),
            "grpo_beta": Field("float", 0.05, "GRPO KL coefficient", low=1e-12),
            "grpo_lr": Field("float", 1e-4, "GRPO LoRA learning rate", low=1e-12),
            "num_generations": Field("int", 4, "GRPO group size", low=2),
            "grpo_lora_rank": Field("int", 16, "GRPO LoRA rank", low=1),
            "privbon_bound": Field("float", 2.0, "PrivBoN public score clip B: Δ_r = 2B", low=1e-12),
            "kl_budgets": Field(
                "list[float]", [0.5, 1.0, 2.0], "KL budgets of the verdict [nats]", low=1e-12
            ),
            "equivalence_margin": Field("float", 0.02, "a tie is shown within ± this gold", low=1e-12),
            "gold": Field("str", "pools/imdb-gold-minilm-logreg.json", "gold reward (LinearRewardScorer)"),
            "alt_gold": Field(
                "str",
                "",
                "a second gold of another family for the best-of-n and PrivBoN routes ('vader': VADER "
                "(c + 1)/2; '' none)",
                choices=ALT_GOLDS,
            ),
            "labeller": Field(
                "str",
                "minilm",
                "who draws the private pairs' Bradley–Terry labels (routes/labellers.py)",
                choices=tuple(LABELLERS),
            ),
            "labeller_scale": Field(
                "float", 1.0, "the labeller's temperature s: P(a ≻ b) = σ(s·(ℓ(a) − ℓ(b)))", low=1e-12
            ),
            "judges": Field(
                "str",
                "",
                "comma-separated judges of every route, on the same selected texts ('' none)",
            ),
            "leads": Field(
                "str",
                "",
                "comma-separated claims 'FAMILY:X>FAMILY:Y' (X leads Y at each ε), for leads_verdict",
            ),
            "labeller_runs": Field(
                "str",
                "",
                "comma-separated records of other labellers' runs, 'LABELLER=DIR' (leads_verdict)",
            ),
            "prior_results": Field("str", "", "directory of records from an earlier session (RUN/records)"),
            "records_only": Field(
                "bool",
                False,
                "summarise the records that exist (here or under prior_results) and fit or train nothing: "
                "a (route, seed) without all its records is listed as pending and left out of the curves",
            ),
            "n_bootstrap": Field("int", 2000, "bootstrap resamples", low=100),
            "num_threads": Field("int", 1, "torch CPU threads", low=1),
        }
    )
    s.update(routes.fields())  # the keys the built-in routes add (their own seeds and settings)
    return s


def _preflight(cfg: dict, ctx: RunContext) -> None:
    from privalign.experiments.manifest import file_sha256
    from privalign.models._resources import require

    routes_ = [parse_route(r) for r in cfg["routes"]]
    if not routes_:
        raise _err("config key 'routes' is empty.")
    if len(set(cfg["routes"])) != len(cfg["routes"]):
        raise _err("config key 'routes' has duplicates.")
    if cfg["eval_prompts"] + cfg["grpo_prompts"] >= HELDOUT_OPENINGS:
        raise _err(
            f"config keys 'eval_prompts' + 'grpo_prompts' = {cfg['eval_prompts'] + cfg['grpo_prompts']} "
            f"must be below {HELDOUT_OPENINGS} (the held-out IMDb openings)."
        )
    if cfg["n_pairs"] > 20_000:
        raise _err(f"config key 'n_pairs': {cfg['n_pairs']} > 20000 (the IMDb openings available for pairs).")
    for r in routes_:
        problem = _route_class(r["family"]).check(r, cfg)
        if problem:
            raise _err(problem)
    if max(cfg["bon_ns"]) > cfg["reference_samples"]:
        raise _err(f"config key 'bon_ns': max {max(cfg['bon_ns'])} > reference_samples.")
    if cfg["dpo_batch"] > cfg["n_pairs"] or cfg["trm_batch"] > cfg["n_pairs"]:
        raise _err("config key 'dpo_batch'/'trm_batch' must be at most n_pairs.")
    if any(route_kind(r) == "sample-DP" for r in routes_) and cfg["delta"] >= 1 / cfg["n_pairs"]:
        raise _err(f"config key 'delta': {cfg['delta']} must be below 1/n_pairs.")
    _check_labellers(cfg)
    g = repo_path(cfg["gold"])
    if not g.is_file():
        raise _err(f"config key 'gold': {g} does not exist.")
    for mod in ("torch", "transformers", "peft"):
        require(mod, purpose=f"{NAME} (pip install 'privalign[rlhf]')")
    if any(r["family"] == "grpo" for r in routes_):
        require("trl", purpose=f"{NAME} (pip install 'privalign[rlhf]')")
    ctx.inputs["gold"] = {"path": str(g), "sha256": file_sha256(g), "what": "MiniLM gold, P(positive)"}
    E, G = cfg["eval_prompts"], cfg["grpo_prompts"]
    ctx.inputs["prompts"] = {
        "source": "IMDb openings (privalign.data.datasets.imdb_prompts)",
        "eval": [0, E],
        "grpo": [E, E + G],
        "pairs": [E + G, min(E + G + cfg["n_pairs"], HELDOUT_OPENINGS)],
        "pairs_beyond_heldout": max(0, E + G + cfg["n_pairs"] - HELDOUT_OPENINGS),
    }
    if E + G + cfg["n_pairs"] > HELDOUT_OPENINGS:
        ctx.inputs["prompts"]["pairs_beyond_source"] = (
            "openings of fit-part IMDb reviews (privalign.data.datasets.imdb_fit_part_openings), never eval "
            "or GRPO prompts; the MiniLM gold scores completions without their prompt"
        )
    ctx.inputs["private_pairs"] = {
        "file": "RUN/data/pairs.jsonl (never committed)",
        "rule": cfg["label_rule"],
    }
    if cfg.get("records_only") and _store(cfg, ctx).find("reference.json", _reference_identity(cfg)) is None:
        # every curve is drawn against the reference: without it there is nothing to summarise, and the
        # data cell would first generate the pairs (minutes) for nothing
        raise _no_reference(cfg, ctx)


def _check_labellers(cfg: dict) -> None:
    """The keys of issue 37 item 2: ``judges`` and ``labeller_runs`` name known, distinct labellers (a run of
    another labeller than this one's), ``leads`` parse.

    Raises:
      ExperimentError: naming the key.
    """
    for key in ("judges", "labeller_runs"):
        names = [j.partition("=")[0] for j in csv(cfg, key)]
        bad = [j for j in names if j not in LABELLERS]
        if key == "labeller_runs":
            bad += [j for j in names if j == cfg.get("labeller", "minilm")]
        if bad or len(set(names)) != len(names):
            raise _err(
                f"config key '{key}': {cfg[key]!r}: names must be distinct, among {tuple(LABELLERS)}"
                + (" and not this run's labeller." if key == "labeller_runs" else ".")
            )
    for lead in csv(cfg, "leads"):
        parse_lead(lead)


def _prompts(cfg: dict) -> dict[str, Any]:
    """The three public prompt slices and their provenance."""
    from privalign.rlhf.prompts import imdb_rl_prompts

    E, G = cfg["eval_prompts"], cfg["grpo_prompts"]
    ev, ev_info = imdb_rl_prompts(E, offset=0)
    gr, gr_info = imdb_rl_prompts(G, offset=E)
    held = min(cfg["n_pairs"], HELDOUT_OPENINGS - E - G)
    tr, tr_info = imdb_rl_prompts(held, offset=E + G)
    if cfg["n_pairs"] > held:
        tr, tr_info = _more_pair_prompts(cfg["n_pairs"] - held, tr, tr_info, ev + gr)
    return {
        "eval": ev,
        "eval_info": ev_info,
        "grpo": gr,
        "grpo_info": gr_info,
        "pairs": tr,
        "pairs_info": tr_info,
    }


#: The held-out IMDb openings (the prompt part of :func:`privalign.data.datasets.imdb_split`): evaluation and
#: GRPO prompts come only from these; private pairs take the rest of them first.
HELDOUT_OPENINGS = 1000


def _more_pair_prompts(
    k: int, held: list[str], held_info: dict[str, Any], public: list[str]
) -> tuple[list[str], dict[str, Any]]:
    """``held`` followed by ``k`` openings of fit-part reviews (:func:`privalign.data.datasets.
    imdb_fit_part_openings`, fixed order), skipping any whose text equals an evaluation/GRPO prompt or an
    earlier pair prompt (public texts only: which openings are skipped depends on no private data)."""
    from privalign.data.datasets import imdb_fit_part_openings

    def _norm(text: str) -> str:
        return " ".join(str(text).split())

    seen = {_norm(p) for p in public} | {_norm(p) for p in held}
    extra: list[str] = []
    idx: list[int] = []
    pos = 0
    while len(extra) < k:
        want = min(24_000 - pos, 2 * (k - len(extra)) + 16)
        if want <= 0:
            raise _err(
                f"config key 'n_pairs': only {len(held) + len(extra)} distinct IMDb openings available."
            )
        for ex in imdb_fit_part_openings(want, offset=pos):
            if len(extra) < k and _norm(ex.prompt) not in seen:
                seen.add(_norm(ex.prompt))
                extra.append(ex.prompt)
                idx.append(int(ex.extra["review_index"]))
        pos += want
    info = {
        **held_info,
        "fit_part": {
            "selection": "privalign.data.datasets.imdb_fit_part_openings (fit part of imdb_split, fixed "
            "order; openings equal to an eval/GRPO prompt or an earlier pair prompt skipped)",
            "count": len(extra),
            "review_indices": idx,
        },
    }
    return held + extra, info


def check_frontier_disjoint(pairs: Any, eval_prompts: list[str], rl_prompts: list[str]) -> dict[str, Any]:
    """Refuse evaluation or RL prompts that are private data (equal to a pair's prompt, or a word-prefix of
    one of its texts: :func:`privalign.rlhf.prompts.find_overlap`), and eval prompts that are RL prompts.

    Raises:
      ExperimentError: naming how many prompts overlap.
    """
    from privalign.rlhf.prompts import _norm, find_overlap

    bad_eval = find_overlap(eval_prompts, pairs)
    bad_rl = find_overlap(rl_prompts, pairs)
    both = {_norm(p) for p in eval_prompts} & {_norm(p) for p in rl_prompts}
    if bad_eval or bad_rl or both:
        raise _err(
            f"prompts overlap: {len(bad_eval)} eval and {len(bad_rl)} GRPO prompts occur in the private "
            "pairs, "
            f"{len(both)} eval prompts are GRPO prompts; every evaluation/RL prompt must be held out."
        )
    return {"checked": True, "eval_prompts": len(eval_prompts), "rl_prompts": len(rl_prompts), "overlap": 0}


def _gold(cfg: dict, ctx: RunContext) -> Any:
    if "gold" not in ctx.cache:
        from privalign.models.scorers import LinearRewardScorer

        ctx.cache["gold"] = LinearRewardScorer.load(repo_path(cfg["gold"]))
    return ctx.cache["gold"]


def _base(cfg: dict, ctx: RunContext) -> tuple[Any, Any, str]:
    """The base policy, loaded once per run (:func:`privalign.rlhf.train.load_base_model_once`: the same
    model, threads and cache key as p2-rlhf)."""
    from privalign.rlhf.train import load_base_model_once

    return load_base_model_once(ctx.cache, num_threads=cfg["num_threads"])


_DATA_KEYS = ("seed", "eval_prompts", "grpo_prompts", "n_pairs", "label_rule", "max_new_tokens", "gold")


def data_identity(cfg: dict) -> str:
    """The identity of the private pairs' generating configuration (public): ``_DATA_KEYS``, plus the
    labeller and its scale where they differ from the MiniLM gold at s = 1 (so the records of the first runs
    keep their identities)."""
    ident = {k: cfg.get(k) for k in _DATA_KEYS}
    if cfg.get("labeller", "minilm") != "minilm" or float(cfg.get("labeller_scale", 1.0)) != 1.0:
        ident |= {"labeller": cfg["labeller"], "labeller_scale": float(cfg["labeller_scale"])}
    return identity(ident)


def _pairs(cfg: dict, ctx: RunContext) -> dict[str, Any]:
    """The private pairs (generated once, cached under ``RUN/data``) and the prompt slices."""
    if "pairs" in ctx.cache:
        return ctx.cache["pairs"]
    from privalign.data.preferences_io import load_jsonl_pairs

    pr = _prompts(cfg)
    ident = data_identity(cfg)
    path = ctx.run_dir / "data" / "pairs.jsonl"
    store = ctx.records("data")
    meta = store.get("pairs.meta.json", ident) if path.is_file() else None
    if meta is None:
        meta = store.put("pairs.meta.json", _generate_pairs(cfg, ctx, pr["pairs"], path), ident)
    pairs = load_jsonl_pairs(path)
    disjoint = check_frontier_disjoint(pairs, pr["eval"], pr["grpo"])
    ctx.cache["pairs"] = {
        **pr,
        "path": path,
        "pairs": pairs,
        "meta": meta,
        "disjoint": disjoint,
        # the identity of the data every record depends on (hashed again into each record's identity): the
        # public configuration that generates the pairs, never a hash of the private pairs themselves (the
        # records are committed; a hash of the data would let anyone confirm a guess of the whole dataset)
        "data_identity": ident,
    }
    return ctx.cache["pairs"]


def _generate_pairs(cfg: dict, ctx: RunContext, prompts: list[str], path: Path) -> dict[str, Any]:
    """Two base-policy completions per prompt (a degenerate pair — equal or blank texts — is redrawn with
    further candidates of the same prompt, so n stays public), labelled by the gold."""
    from privalign.rlhf.evaluate import sample_with_logprobs

    model, tok, mid = _base(cfg, ctx)
    gold = _gold(cfg, ctx)
    ss = np.random.SeedSequence(cfg["seed"], spawn_key=(2**28,))
    s_gen, s_lab = ss.spawn(2)
    seed = int(s_gen.generate_state(1)[0] >> 1)
    t0 = time.perf_counter()
    out = []
    B = 32
    for b in range(0, len(prompts), B):
        chunk = prompts[b : b + B]
        s = sample_with_logprobs(
            model, tok, chunk, 2, max_new_tokens=cfg["max_new_tokens"], seed=seed + b, batch_rows=ROWS
        )
        for i, (p, row) in enumerate(zip(chunk, s["texts"])):
            a, c = row
            extra = 0
            while (not a.strip() or not c.strip() or a.strip() == c.strip()) and extra < 4:
                extra += 1
                r2 = sample_with_logprobs(
                    model, tok, [p], 4, max_new_tokens=cfg["max_new_tokens"], seed=seed + 7919 * extra + b + i
                )["texts"][0]
                cand = [t for t in [a, c, *r2] if t.strip()]
                uniq = list(dict.fromkeys(t.strip() for t in cand))
                if len(uniq) >= 2:
                    a, c = uniq[0], uniq[1]
            if not a.strip() or not c.strip() or a.strip() == c.strip():
                raise _err(f"could not draw two distinct completions for pair prompt {b + i}.")
            out.append((p, a, c))
        print(
            f"{NAME}: pairs {min(b + B, len(prompts))}/{len(prompts)} generated "
            f"({time.perf_counter() - t0:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    name = cfg.get("labeller", "minilm")
    score = gold.score if name == "minilm" else LABELLERS[name].load()
    g = np.asarray(score([t for _, a, c in out for t in (a, c)]), float).reshape(-1, 2)
    rng = np.random.default_rng(s_lab)
    if cfg["label_rule"] == "bt":
        lg = float(cfg.get("labeller_scale", 1.0)) * labeller_logits(name, g)
        first = rng.random(len(out)) < 1.0 / (1.0 + np.exp(-(lg[:, 0] - lg[:, 1])))
    else:
        first = (g[:, 0] > g[:, 1]) | ((g[:, 0] == g[:, 1]) & (rng.random(len(out)) < 0.5))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for k, ((p, a, c), f) in enumerate(zip(out, first)):
            ch, rj = (a, c) if f else (c, a)
            fh.write(json.dumps({"prompt": p, "chosen": ch, "rejected": rj, "prompt_id": k}) + "\n")
    tmp.replace(path)
    return {
        "n_pairs": len(out),
        "base_model": mid,
        "sampler": "privalign.rlhf.evaluate.sample_with_logprobs (HF fp32, temperature 1, no truncation)",
        "label_rule": cfg["label_rule"],
        "labeller": name,
        "labeller_scale": float(cfg.get("labeller_scale", 1.0)),
        "generation_seconds": time.perf_counter() - t0,
    }


def _store(cfg: dict, ctx: RunContext) -> RecordStore:
    """The run's records (``RUN/records``), backed by ``prior_results``."""
    return ctx.records("records", prior=cfg.get("prior_results"))


def _reference_identity(cfg: dict) -> str:
    return identity(
        {k: cfg.get(k) for k in ("seed", "eval_prompts", "reference_samples", "max_new_tokens", "gold")}
    )


def _no_reference(cfg: dict, ctx: RunContext) -> Exception:
    return _err(
        "records_only = true but there is no reference record with this configuration's identity in "
        f"{ctx.run_dir / 'records'} or prior_results = {cfg.get('prior_results')!r}: nothing to summarise; "
        "run without records_only, or point prior_results at the records of an earlier run."
    )


def _reference(cfg: dict, ctx: RunContext) -> dict[str, Any]:
    """The base policy's ``reference_samples`` samples per eval prompt and their gold (public: a public
    model on public prompts); kept with the records as ``RUN/records/reference.json`` and reused from there or
    from ``prior_results/reference.json``."""
    if "reference" in ctx.cache:
        return ctx.cache["reference"]
    ident = _reference_identity(cfg)
    rec = _store(cfg, ctx).get("reference.json", ident)
    if rec is None and cfg.get("records_only"):
        raise _no_reference(cfg, ctx)
    if rec is None:
        from privalign.rlhf.evaluate import sample_with_logprobs

        pr = _prompts(cfg)
        model, tok, mid = _base(cfg, ctx)
        t0 = time.perf_counter()
        s = sample_with_logprobs(
            model,
            tok,
            pr["eval"],
            cfg["reference_samples"],
            max_new_tokens=cfg["max_new_tokens"],
            seed=_ref_seed(cfg),
            batch_rows=ROWS,
        )
        P = len(pr["eval"])
        gold = np.asarray(_gold(cfg, ctx).score([t for row in s["texts"] for t in row]), float).reshape(P, -1)
        rec = _store(cfg, ctx).put(
            "reference.json",
            {
                "base_model": mid,
                "texts": s["texts"],
                "gold": gold.tolist(),
                "seconds": time.perf_counter() - t0,
            },
            ident,
        )
    ctx.cache["reference"] = rec
    return rec


def _ref_seed(cfg: dict) -> int:
    return int(np.random.SeedSequence(cfg["seed"], spawn_key=(2**28, 1)).generate_state(1)[0] >> 1)


def _eval_seed(cfg: dict) -> int:
    """One evaluation seed for every route and checkpoint (common random numbers) [our choice]."""
    return int(np.random.SeedSequence(cfg["seed"], spawn_key=(2**28, 2)).generate_state(1)[0] >> 1)


# ---------------------------------------------------------------------------------------------------------
# cells
# ---------------------------------------------------------------------------------------------------------


def _cells(cfg: dict, ctx: RunContext) -> list[dict]:
    """``data`` first, then every (route, seed): the cheap families first (best-of-n, PrivBoN), then DPO,
    then GRPO, so an interrupted full run has its cheap curves."""
    cells: list[dict[str, Any]] = [{"cell": "data", "route": "data"}]
    specs = sorted((parse_route(r) for r in cfg["routes"]), key=lambda r: _route_class(r["family"]).order)
    for r in specs:
        for k in range(_seeds(cfg, r["family"])):
            cells.append({"cell": f"{r['route']} seed={k}", **r, "seed_index": k})
    return cells


class _Pending(Exception):
    """Raised under ``records_only`` where a cell would fit a reward model, train or sample a policy."""


def _no_work(cfg: dict, what: str) -> None:
    if cfg.get("records_only"):
        raise _Pending(what)


def _run_cell(cell: dict, cfg: dict, ctx: RunContext, ss: np.random.SeedSequence) -> list[dict]:
    if cell["route"] == "data":
        return [_data_record(cfg, ctx)]
    fam = cell["family"]
    t0 = time.perf_counter()
    try:
        points = _points(_route_class(fam)(), cell, cfg, ctx)
    except _Pending as why:
        print(f"{NAME}: {cell['cell']} pending (records_only: {why})", file=sys.stderr, flush=True)
        pend = {"kind": "pending", "route": cell["route"], "seed_index": cell["seed_index"], "why": str(why)}
        return [pend]
    rec = _curve_record(cell, cfg, ctx, points)
    _drop_unneeded_rms(cfg, ctx)
    print(
        f"{NAME}: {cell['cell']} done in {time.perf_counter() - t0:.0f} s "
        f"({len(points)} points, last KL {points[-1]['kl']:.3f}, gold {points[-1]['gold']:.3f})",
        file=sys.stderr,
        flush=True,
    )
    return [rec]


def _drop_unneeded_rms(cfg: dict, ctx: RunContext) -> None:
    """Forget the fitted reward models no later GRPO route uses (a MiniLM one holds its backbone)."""
    import gc

    keep = {
        key
        for r in map(parse_route, cfg["routes"])
        for k in range(_seeds(cfg, r["family"]))
        for key in [_route_class(r["family"]).reuses_rm({**r, "seed_index": k})]
        if key
    }
    for key in [k for k in ctx.cache if str(k).startswith("rm:") and k not in keep]:
        del ctx.cache[key]
    gc.collect()


def _data_record(cfg: dict, ctx: RunContext) -> dict:
    d = _pairs(cfg, ctx)
    ref = _reference(cfg, ctx)
    g = np.asarray(ref["gold"], float)
    return {
        "kind": "data",
        "route": "data",
        "n_pairs": d["meta"]["n_pairs"],
        "label_rule": d["meta"]["label_rule"],
        "labeller": d["meta"].get("labeller", "minilm"),
        "labeller_scale": d["meta"].get("labeller_scale", 1.0),
        "sampler": d["meta"]["sampler"],
        "base_model": d["meta"]["base_model"],
        "prompt_slices": {k: d[f"{k}_info"]["offset"] for k in ("eval", "grpo", "pairs")},
        "disjoint": d["disjoint"],
        **({"labeller_match": labeller_match(cfg, ctx)} if cfg.get("labeller", "minilm") != "minilm" else {}),
        "eval_prompts": int(g.shape[0]),
        "reference_samples": int(g.shape[1]),
        "reference_gold": float(g.mean()),
        "per_prompt_reference_gold": g.mean(axis=1).tolist(),
        "privacy_unit": "one preference pair (prompt, two completions, label)",
    }


def _guarantee(cell: dict, cfg: dict, event: dict | None, extra: dict | None = None) -> dict:
    """The record's privacy statement (the same words as the legend)."""
    e = cell["epsilon"]
    delta = cfg["delta"] if route_kind(cell) == "sample-DP" else 0.0
    return {
        "epsilon": e,
        "delta": delta if e is not None else None,
        "unit": route_unit(cell),
        "per_answer": route_kind(cell) == "per-answer",
        "relation": "replace-one",
        "privacy_event": event,
        **(extra or {}),
    }


def _curve_record(cell: dict, cfg: dict, ctx: RunContext, points: list[dict]) -> dict:
    return {
        "kind": RECORD_KIND,
        "route": cell["route"],
        "family": cell["family"],
        "method": cell["method"],
        "epsilon": cell["epsilon"],
        "seed_index": cell["seed_index"],
        "label": route_label(cell["route"]),
        "guarantee": points[0].get("guarantee") or _guarantee(cell, cfg, None),
        "points": [{k: v for k, v in p.items() if k not in ("identity", "guarantee")} for p in points],
        "root_seed": cfg["seed"],
        "n_bootstrap": cfg["n_bootstrap"],
        "kl_budgets": list(cfg["kl_budgets"]),
        "equivalence_margin": cfg["equivalence_margin"],
    }


def _cell_ident(cell: dict, cfg: dict, ctx: RunContext, keys: tuple[str, ...], step: Any = None) -> str:
    return identity(
        {
            "route": cell["route"],
            "seed_index": cell["seed_index"],
            "step": step,
            "data": _pairs(cfg, ctx)["data_identity"],
            "config": {k: cfg.get(k) for k in (*RM_KEYS, *keys)},
        }
    )


def _cell_dir(cell: dict) -> str:
    """The cell's folder, relative to ``RUN/records`` (and ``RUN/policies``): ``bon_RRIHT_eps8/seed-0``."""
    return f"{cell['route'].replace(':', '_').replace('@', '_eps')}/seed-{cell['seed_index']}"


def _records_dir(cell: dict, ctx: RunContext) -> Path:
    return ctx.run_dir / "records" / _cell_dir(cell)


def _key(cell: dict, name: str) -> str:
    """The store key of the cell's record ``name`` (``curve.json``, ``step-000050.json``, ...)."""
    return f"{_cell_dir(cell)}/{name}"


def _alt_gold(cfg: dict, ctx: RunContext) -> np.ndarray | None:
    """The second gold (``alt_gold``) of the reference samples, ``(P, m)``; ``None`` when not asked for."""
    name = cfg.get("alt_gold") or ""
    if not name:
        return None
    key = f"alt_gold:{name}"
    if key not in ctx.cache:
        from privalign.models.scorers import VaderScorer

        texts = _reference(cfg, ctx)["texts"]
        flat = [t for row in texts for t in row]
        ctx.cache[key] = np.asarray(VaderScorer().score(flat), float).reshape(len(texts), -1)
    return ctx.cache[key]


def _with_alt(
    cell: dict,
    cfg: dict,
    ctx: RunContext,
    pts: list[dict],
    keys: tuple[str, ...],
    alt_points: Callable[[np.ndarray], list[np.ndarray]],
) -> list[dict]:
    """``pts`` with the second gold added to each point (``alt_gold``, ``alt_per_prompt_gold``), from the
    record ``curve-alt.json`` (reused by identity, here or under ``prior_results``) or computed by
    ``alt_points(alt)`` (per point, the per-prompt expected second gold of the same selection law)."""
    alt = _alt_gold(cfg, ctx)
    if alt is None:
        return pts
    ident = _cell_ident(cell, cfg, ctx, (*keys, "alt_gold"))
    rec = _store(cfg, ctx).get(_key(cell, "curve-alt.json"), ident)
    if rec is None:
        per = [[float(v) for v in pg] for pg in alt_points(alt)]
        rec = {"alt_gold": cfg["alt_gold"], "per_prompt": per}
        rec = _store(cfg, ctx).put(_key(cell, "curve-alt.json"), rec, ident)
    return [
        {**p, "alt_gold": float(np.mean(pg)), "alt_per_prompt_gold": list(pg)}
        for p, pg in zip(pts, rec["per_prompt"])
    ]


def alt_gold_records(records: list[dict]) -> list[dict]:
    """The curve records that carry a second gold, with it in place of the gold (for
    :func:`frontier_comparisons`): the best-of-n and PrivBoN routes of a run with ``alt_gold``."""
    out = []
    for r in records:
        if r.get("kind") != RECORD_KIND or not r["points"]:
            continue
        if not all("alt_per_prompt_gold" in p for p in r["points"]):
            continue
        pts = [{**p, "gold": p["alt_gold"], "per_prompt_gold": p["alt_per_prompt_gold"]} for p in r["points"]]
        out.append({**r, "points": pts})
    return out


# ---- trained policies ----------------------------------------------------------------------------------


def _evaluate(policy: Any, cfg: dict, ctx: RunContext) -> dict:
    """Gold and KL(π ‖ π_ref) of a policy on the eval prompts (``eval_samples`` samples each, their
    log-probabilities under the policy and the base model)."""
    from privalign.rlhf.evaluate import kl_estimate, sample_with_logprobs

    d = _pairs(cfg, ctx)
    model, tok, _ = _base(cfg, ctx)
    t0 = time.perf_counter()
    s = sample_with_logprobs(
        policy,
        tok,
        d["eval"],
        cfg["eval_samples"],
        max_new_tokens=cfg["max_new_tokens"],
        seed=_eval_seed(cfg),
        reference=model,
        batch_rows=ROWS,
    )
    P = len(d["eval"])
    flat = [t for row in s["texts"] for t in row]
    gold = np.asarray(_gold(cfg, ctx).score(flat), float).reshape(P, -1)
    kl, kl_se = kl_estimate(s["logp"], s["logp_ref"])
    judges = {j: _judge(cfg, ctx, j)(flat).reshape(P, -1).mean(axis=1).tolist() for j in _judge_names(cfg)}
    return {
        **({"judges": judges} if judges else {}),
        "kl": float(kl),
        "kl_se": float(kl_se),
        "gold": float(gold.mean()),
        "per_prompt_gold": gold.mean(axis=1).tolist(),
        "example": s["texts"][0][0],
        "eval_seconds": time.perf_counter() - t0,
    }


def _ref_point(cfg: dict, ctx: RunContext) -> dict:
    g = np.asarray(_reference(cfg, ctx)["gold"], float).mean(axis=1)
    return {
        "x": 0,
        "x_kind": "step",
        "kl": 0.0,
        "kl_se": 0.0,
        "gold": float(g.mean()),
        "per_prompt_gold": g.tolist(),
    }


class _Eta:
    """Progress lines with an ETA (seconds per step measured so far, evaluations included)."""

    def __init__(self, cell: dict, total: int) -> None:
        self.cell, self.total, self.t0 = cell, total, time.perf_counter()
        self.first: int | None = None

    def __call__(self, step: int) -> None:
        if self.first is None:  # the clock starts at the first step (not the setup before it)
            self.first, self.t0 = step, time.perf_counter()
            return
        done = step - self.first
        if done <= 0 or (step % 10 and step != self.total):
            return
        per = (time.perf_counter() - self.t0) / done
        print(
            f"{NAME} {self.cell['cell']}: step {step}/{self.total}, {per:.1f} s/step, ETA route "
            f"{per * (self.total - step) / 60:.0f} min",
            file=sys.stderr,
            flush=True,
        )


# ---- the routes' fits, evaluated here --------------------------------------------------------------------


class _Bench:
    """What the frontier lends a route for one cell (:class:`privalign.experiments.routes.base.Bench`)."""

    def __init__(self, cell: dict, cfg: dict, ctx: RunContext) -> None:
        self.cell, self.cfg, self.ctx = cell, cfg, ctx
        self.cache = ctx.cache
        self.run_dir = ctx.run_dir

    def pairs(self) -> dict[str, Any]:
        return _pairs(self.cfg, self.ctx)

    def reference(self) -> dict[str, Any]:
        return _reference(self.cfg, self.ctx)

    def base(self) -> tuple[Any, Any, str]:
        return _base(self.cfg, self.ctx)

    def seed(self, key: str, k: int | None = None) -> np.random.SeedSequence:
        return route_seed(self.cfg["seed"], key, self.cell["seed_index"] if k is None else k)

    def pending(self, what: str) -> None:
        _no_work(self.cfg, what)

    def records_dir(self) -> Path:
        return _records_dir(self.cell, self.ctx)

    def progress(self, total: int) -> Callable[[int], None]:
        return _Eta(self.cell, total)


def _points(route: Route, cell: dict, cfg: dict, ctx: RunContext) -> list[dict]:
    """The cell's curve: a selector route's law evaluated over the reference samples, or a policy route's
    checkpoints evaluated on the eval prompts (each a record, reused by identity)."""
    bench = _Bench(cell, cfg, ctx)
    if isinstance(route, SelectorRoute):
        return _selector_points(route, bench)
    if isinstance(route, PolicyRoute):
        return _policy_points(route, bench)
    raise _err(
        f"route family {cell['family']!r}: a route is a SelectorRoute or a PolicyRoute."
    )  # pragma: no cover


def _selector_points(route: SelectorRoute, bench: _Bench) -> list[dict]:
    """Expected gold and exact KL of the route's selection law at each x (``curve.json``); the second gold of
    the same law (``curve-alt.json``, :func:`_with_alt`)."""
    cell, cfg, ctx = bench.cell, bench.cfg, bench.ctx
    keys = route.keys
    xs = route.xs(bench)

    def alt_points(alt: np.ndarray) -> list[np.ndarray]:
        sel = route.selection(bench)
        return [sel.expected(alt, x) for x in xs]

    ident = _cell_ident(cell, cfg, ctx, keys)
    rec = _store(cfg, ctx).get(_key(cell, "curve.json"), ident)
    if rec is not None:
        pts = _with_alt(cell, cfg, ctx, rec["points"], keys, alt_points)
        return _with_judges(route, bench, pts, rec, None)
    sel = route.selection(bench)
    gold = np.asarray(_reference(cfg, ctx)["gold"], float)
    event, extra = route.guarantee(bench)
    g = _guarantee(cell, cfg, event, extra)
    pts = [
        {
            "x": int(x),
            "x_kind": "n",
            "kl": sel.kl(x),
            "kl_se": 0.0,
            "gold": float(pg.mean()),
            "per_prompt_gold": [float(v) for v in pg],
            "guarantee": g,
        }
        for x in xs
        for pg in [sel.expected(gold, x)]
    ]
    laws = selection_laws(sel, xs, gold.shape) if _judge_names(cfg) else None
    curve = {"points": pts} | ({"selection": selection_fingerprint(laws)} if laws is not None else {})
    curve = _store(cfg, ctx).put(_key(cell, "curve.json"), curve, ident)
    return _with_judges(route, bench, _with_alt(cell, cfg, ctx, pts, keys, alt_points), curve, laws)


def csv(cfg: dict, key: str) -> list[str]:
    """A comma-separated configuration key as its items (blank: none)."""
    return [t.strip() for t in str(cfg.get(key) or "").split(",") if t.strip()]


def _judge_names(cfg: dict) -> list[str]:
    return csv(cfg, "judges")


def _judge(cfg: dict, ctx: RunContext, name: str) -> Callable[[list[str]], np.ndarray]:
    """Judge ``name`` as ``texts → scores`` (the run's gold where it is the same file), loaded once."""
    key = f"judge:{name}"
    if key not in ctx.cache:
        j = LABELLERS[name]
        if j.path and repo_path(j.path).resolve() == repo_path(cfg["gold"]).resolve():
            gold = _gold(cfg, ctx)
            ctx.cache[key] = lambda texts: np.asarray(gold.score(list(texts)), float)
        else:
            ctx.cache[key] = j.load()
    return ctx.cache[key]


def _judge_ref(cfg: dict, ctx: RunContext, name: str) -> np.ndarray:
    """Judge ``name``'s scores of the reference samples, ``(P, m)`` (the recorded gold where the judge is the
    run's gold)."""
    key = f"judge-ref:{name}"
    if key not in ctx.cache:
        j, ref = LABELLERS[name], _reference(cfg, ctx)
        if j.path and repo_path(j.path).resolve() == repo_path(cfg["gold"]).resolve():
            ctx.cache[key] = np.asarray(ref["gold"], float)
        else:
            flat = [t for row in ref["texts"] for t in row]
            ctx.cache[key] = _judge(cfg, ctx, name)(flat).reshape(len(ref["texts"]), -1)
    return ctx.cache[key]


def selection_laws(sel: Selection, xs: list[int], shape: tuple[int, ...]) -> list[np.ndarray]:
    """Per x, the selection law ``(P, m)`` over the reference samples (each column's probability: the law's
    expected value of the column's indicator)."""
    P, m = shape
    laws = []
    for x in xs:
        q = np.zeros((P, m))
        for j in range(m):
            e = np.zeros((P, m))
            e[:, j] = 1.0
            q[:, j] = sel.expected(e, x)
        laws.append(q)
    return laws


def selection_fingerprint(laws: list[np.ndarray]) -> str:
    """sha256 of the selection laws rounded to 1e-9 (public: a function of the released model's scores of
    public reference samples)."""
    h = hashlib.sha256()
    for q in laws:
        h.update(np.ascontiguousarray(np.round(q, 9) + 0.0).tobytes())
    return h.hexdigest()


def _same_selection(cell: dict, curve: dict, laws: list[np.ndarray], gold: np.ndarray) -> None:
    """Refuse to judge a refitted selection that is not the recorded one: its fingerprint (records written
    with ``judges``), or else the main gold it gives, prompt by prompt, against the recorded points.

    Raises:
      ExperimentError: naming the cell and how many (prompt, x) cells differ.
    """
    if "selection" in curve:
        if curve["selection"] == selection_fingerprint(laws):
            return
        bad, total = -1, 0
    else:
        got = np.array([(q * gold).sum(axis=1) for q in laws])
        want = np.array([p["per_prompt_gold"] for p in curve["points"]], float)
        diff = np.abs(got - want) > 1e-9 * np.maximum(1.0, np.abs(want))
        bad, total = int(diff.sum()), int(diff.size)
        if bad == 0:
            return
    raise _err(
        f"{cell['cell']}: the refitted selection is not the recorded one "
        + (f"({bad} of {total} prompt × x cells differ)" if bad >= 0 else "(fingerprints differ)")
        + "; the judges would score other texts than the main records. Delete its curve.json to recompute "
        "both, or leave 'judges' out."
    )


def _with_judges(
    route: SelectorRoute, bench: _Bench, pts: list[dict], curve: dict, laws: list[np.ndarray] | None
) -> list[dict]:
    """``pts`` with every judge's per-prompt score of the same selection (``judges``), from the record
    ``curve-judges.json`` (reused by identity) or computed from the selection laws; a judge added after the
    main records refits the selection and checks it is the recorded one (:func:`_same_selection`)."""
    cell, cfg, ctx = bench.cell, bench.cfg, bench.ctx
    names = _judge_names(cfg)
    if not names:
        return pts
    store = _store(cfg, ctx)
    ident = _cell_ident(cell, cfg, ctx, (*route.keys, "judges"))
    have = dict((store.get(_key(cell, "curve-judges.json"), ident) or {}).get("judges") or {})
    missing = [j for j in names if j not in have]
    if missing:
        xs = route.xs(bench)
        gold = np.asarray(_reference(cfg, ctx)["gold"], float)
        if laws is None:
            _no_work(cfg, f"judges {missing} of a recorded selection (refit)")
            laws = selection_laws(route.selection(bench), xs, gold.shape)
            _same_selection(cell, curve, laws, gold)
        for j in missing:
            v = _judge_ref(cfg, ctx, j)
            have[j] = [[float(e) for e in (q * v).sum(axis=1)] for q in laws]
        rec = {"judges": have, "selection": selection_fingerprint(laws)}
        store.put(_key(cell, "curve-judges.json"), rec, ident)
    return [{**p, "judges": {j: have[j][i] for j in names}} for i, p in enumerate(pts)]


def _policy_points(route: PolicyRoute, bench: _Bench) -> list[dict]:
    """Train the route's policy once; each checkpoint's evaluation is a record (reused when its identity
    matches; training is skipped when every checkpoint has one), and so is its privacy statement
    (``privacy.json``)."""
    cell, cfg, ctx = bench.cell, bench.cfg, bench.ctx
    store = _store(cfg, ctx)
    steps = route.steps(bench)
    idents = {s: _cell_ident(cell, cfg, ctx, route.keys, s) for s in steps}
    got = {s: store.get(_key(cell, f"step-{s:06d}.json"), idents[s]) for s in steps}
    missing = [t for t, v in got.items() if v is None]
    priv = store.get(_key(cell, "privacy.json"), idents[steps[-1]])
    if route.privacy_first() and (priv is None or missing):
        # the privacy statement is a record, so a fully recorded route refits nothing
        priv = store.put(
            _key(cell, "privacy.json"), route.privacy_without_training(bench) or {}, idents[steps[-1]]
        )
    if missing:
        _no_work(cfg, f"no record of steps {missing}")
        eta = bench.progress(steps[-1])

        def on_step(t: int, policy: Any) -> None:
            eta(t)
            if t in got and got[t] is None:
                rec = {**_evaluate(policy, cfg, ctx), "x": t, "x_kind": "step"}
                got[t] = store.put(_key(cell, f"step-{t:06d}.json"), rec, idents[t])

        priv = store.put(_key(cell, "privacy.json"), route.train(bench, on_step), idents[steps[-1]])
    elif priv is None:
        payload_or_none = route.privacy_without_training(bench)
        if payload_or_none is not None:
            priv = store.put(_key(cell, "privacy.json"), payload_or_none, idents[steps[-1]])
    event, extra = route.guarantee(
        bench, None if priv is None else {k: v for k, v in priv.items() if k != "identity"}
    )
    g = _guarantee(cell, cfg, event)
    g.update(extra)
    return [{**_ref_point(cfg, ctx), "guarantee": g}] + _checkpoints(cell, got, steps)


def _checkpoints(cell: dict, got: dict[int, dict | None], steps: list[int]) -> list[dict]:
    """The checkpoints' points in step order (every one must have its record)."""
    missing = [s for s in steps if got[s] is None]
    if missing:  # pragma: no cover - the evaluators write every step they are called at
        raise _err(f"{cell['cell']}: no evaluation record for steps {missing}.")
    return [{k: v for k, v in (got[s] or {}).items() if k != "identity"} for s in steps]


# ---------------------------------------------------------------------------------------------------------
# curves, comparisons, verdict
# ---------------------------------------------------------------------------------------------------------


def _groups(records: list[dict]) -> dict[str, list[dict]]:
    g: dict[str, list[dict]] = {}
    for r in records:
        if r.get("kind") == RECORD_KIND:
            g.setdefault(r["route"], []).append(r)
    return {k: sorted(v, key=lambda r: r["seed_index"]) for k, v in g.items()}


def _common_points(group: list[dict]) -> list[int]:
    """Indices of the points every seed has (the same x in the same order)."""
    n = min(len(r["points"]) for r in group)
    return [i for i in range(n) if len({r["points"][i]["x"] for r in group}) == 1]


def _mats(group: list[dict]) -> tuple[np.ndarray, list[np.ndarray], list[Any]]:
    """Seed-averaged KL per point, ``(seeds, P)`` per-prompt gold per point, and the points' x."""
    idx = _common_points(group)
    ks = np.array([np.mean([r["points"][i]["kl"] for r in group]) for i in idx])
    mats = [np.array([r["points"][i]["per_prompt_gold"] for r in group], float) for i in idx]
    return ks, mats, [group[0]["points"][i]["x"] for i in idx]


def _at_budget(group: list[dict], budget: float) -> tuple[np.ndarray, dict]:
    """The route's best gold at KL ≤ ``budget`` along its path (seed-averaged KL; a segment crossing the
    budget is interpolated: :func:`privalign.stats.best_on_path`). Returns the ``(seeds, P)`` per-prompt
    gold there and where."""
    ks, mats, xs = _mats(group)
    best = best_on_path(ks, mats, xs, budget)
    if best is None:  # every path starts at the reference (KL 0): a programming error
        raise _err(f"route {group[0]['route']}: no point at KL ≤ {budget}")
    return best


def frontier_curves(records: list[dict]) -> list[dict]:
    """Per route: the seed-averaged path (KL, gold) with 95% bootstrap intervals of the gold (prompts
    jointly, seeds independently), its ε, unit and label."""
    out = []
    for route, g in _groups(records).items():
        ks, mats, xs = _mats(g)
        rng = stream(int(g[0].get("root_seed", 0)), 2**29)
        B = max(100, int(g[0].get("n_bootstrap", 2000)) // 4)
        pts = []
        for k, W, x in zip(ks, mats, xs):
            lo, hi = interval(bootstrap_means(rng, [W], B)[:, 0])
            kse = [r["points"][i].get("kl_se", 0.0) for r in g for i in [xs.index(x)]]
            pts.append(
                {
                    "x": x,
                    "kl": float(k),
                    "kl_se": float(np.mean(kse)),
                    "gold": float(W.mean()),
                    "ci": [float(lo), float(hi)],
                }
            )
        out.append(
            {
                "route": route,
                "label": g[0]["label"],
                "family": g[0]["family"],
                "epsilon": g[0]["epsilon"],
                "unit": g[0]["guarantee"]["unit"],
                "seeds": len(g),
                "prompts": int(mats[0].shape[1]),
                "points": pts,
            }
        )
    return out


def frontier_comparisons(
    records: list[dict], epsilons: list[float] | None = None, budgets: list[float] | None = None
) -> list[dict]:
    """At each (ε, budget): the private routes at that ε ranked by their best gold at KL ≤ budget; the
    winner − runner-up difference with its 95% bootstrap interval (prompts jointly, seeds independently),
    its one-sided bootstrap p-value (H0: winner ≤ runner-up) and Holm's adjusted decision across all the
    comparisons (α = 0.05); the non-private DPO's gold there for reference."""
    groups = _groups(records)
    if not groups:
        return []
    first = next(iter(groups.values()))[0]
    eps_all = sorted({g[0]["epsilon"] for g in groups.values() if g[0]["epsilon"] is not None}, reverse=True)
    eps_list = [e for e in (epsilons or eps_all) if e in eps_all]
    budgets = budgets or list(first.get("kl_budgets") or [0.5, 1.0, 2.0])
    B = int(first.get("n_bootstrap", 2000))
    margin = float(first.get("equivalence_margin", 0.02))
    out = []
    for e in eps_list:
        for b in budgets:
            rows = []
            for route, g in groups.items():
                if g[0]["epsilon"] != e:
                    continue
                W, where = _at_budget(g, b)
                rows.append(
                    {"route": route, "label": g[0]["label"], "W": W, "where": where, "gold": float(W.mean())}
                )
            rows.sort(key=lambda r: -r["gold"])
            nonpriv = [
                float(_at_budget(g, b)[0].mean())
                for g in groups.values()
                if g[0]["family"] == "dpo" and g[0]["epsilon"] is None
            ]
            c: dict[str, Any] = {
                "epsilon": e,
                "budget": b,
                "ranking": [
                    {"route": r["route"], "label": r["label"], "gold": r["gold"], "where": r["where"]}
                    for r in rows
                ],
                "nonprivate_dpo_gold": nonpriv[0] if nonpriv else None,
                "margin": margin,
            }
            if len(rows) >= 2:
                a, r2 = rows[0], rows[1]
                rng = stream(int(first.get("root_seed", 0)), 2**30, int(e * 1000), int(b * 1000))
                diffs = bootstrap_diff(rng, a["W"], r2["W"], B)
                lo, hi = interval(diffs)
                c.update(
                    winner=a["route"],
                    runner_up=r2["route"],
                    diff=float(a["gold"] - r2["gold"]),
                    ci=[float(lo), float(hi)],
                    se=float(diffs.std(ddof=1)),
                    p_value=bootstrap_p_value(diffs),
                    diffs=diffs,
                    prompts=int(a["W"].shape[1]),
                    seeds=[int(a["W"].shape[0]), int(r2["W"].shape[0])],
                )
            out.append(c)
    _holm(out)
    for c in out:
        c.pop("diffs", None)
    return out


def _holm(comps: list[dict]) -> None:
    """Holm's step-down over the comparisons with a p-value (α = 0.05); sets ``significant``,
    ``holm_alpha`` and ``equivalent`` (the (1 − α/k) interval inside ± margin: a tie shown)."""
    tested = [c for c in comps if "p_value" in c]
    k = len(tested)
    for c, (level, reject) in zip(tested, holm([c["p_value"] for c in tested], ALPHA)):
        c["holm_alpha"], c["significant"] = level, reject
    for c in tested:
        lo, hi = interval(c["diffs"], ALPHA, k)
        c["ci_bonferroni"] = [lo, hi]
        c["equivalent"] = within(lo, hi, c["margin"])
        c["verdict"] = (
            "holds" if c["significant"] else ("does not hold" if c["equivalent"] else "inconclusive")
        )


def frontier_verdict(
    records: list[dict], *, epsilons: list[float] | None = None, budgets: list[float] | None = None
):
    """Claim B-3: at each ε and KL budget one private route gives significantly more gold than every other.

    Per (ε, budget) with ≥ 2 routes: ``holds`` if the winner beats the runner-up (one-sided bootstrap
    p-value, Holm over all comparisons at α = 0.05); ``does not hold`` if the two are shown equivalent (the
    Bonferroni (1 − 0.05/k) interval of the difference inside ± ``equivalence_margin``); else
    ``inconclusive``. Overall: ``holds`` if every comparison holds, ``does not hold`` if any does not,
    else ``inconclusive`` (also with no comparison). States the power (detectable difference at ≈ 0.8).
    """
    from scipy import stats

    from privalign.experiments.verdicts import Outcome, all_of

    comps = [c for c in frontier_comparisons(records, epsilons, budgets) if "verdict" in c]
    if not comps:
        return Outcome(
            "inconclusive", "no ε with two or more routes", {"why": "nothing to compare", "comparisons": []}
        )
    vs = [c["verdict"] for c in comps]
    v = all_of(vs)
    z = float(stats.norm.ppf(1 - ALPHA / 2)) + float(stats.norm.ppf(0.8))
    mdd = max(z * c["se"] for c in comps)
    parts = [
        f"ε = {c['epsilon']:g}, KL ≤ {c['budget']:g}: {route_label(c['winner'])} "
        f"{c['ranking'][0]['gold']:.3f} vs {route_label(c['runner_up'])} {c['ranking'][1]['gold']:.3f}: "
        f"{c['diff']:+.4f} [95% CI {c['ci'][0]:+.4f}, "
        f"{c['ci'][1]:+.4f}], p = {c['p_value']:.3g} (Holm α {c['holm_alpha']:.3g}): {c['verdict']}"
        for c in comps
    ]
    bs = sorted({c["budget"] for c in comps})
    facts = {
        "headline_budget": 1.0 if 1.0 in bs else bs[len(bs) // 2],
        "comparisons": [
            {
                k: c[k]
                for k in (
                    "epsilon",
                    "budget",
                    "winner",
                    "runner_up",
                    "diff",
                    "significant",
                    "verdict",
                    "p_value",
                )
            }
            | {
                "winner_label": route_label(c["winner"]),
                "runner_up_label": route_label(c["runner_up"]),
                "winner_kind": route_kind(parse_route(c["winner"])),
                "runner_up_kind": route_kind(parse_route(c["runner_up"])),
            }
            for c in comps
        ],
        "detectable": mdd,
        "per_answer_routes": sorted(
            {
                r["route"]
                for c in comps
                for r in c["ranking"]
                if route_kind(parse_route(r["route"])) == "per-answer"
            }
        ),
        "margin": float(comps[0]["margin"]),
        "why": "underpowered" if v == "inconclusive" else "",
    }
    return Outcome(
        v,
        f"{comps[0]['prompts']} prompts; a gold gap of {mdd:.4f} is detected with power ≈ 0.8 | "
        + " | ".join(parts),
        facts,
    )


def dpo_privacy_cost(records: list[dict], budgets: list[float] | None = None) -> list[dict]:
    """What privacy costs DPO at equal KL: per private DPO route and KL budget, non-private DPO's best gold at
    KL ≤ budget minus the private route's (both along their paths, :func:`_at_budget`), with its 95% and
    Bonferroni (1 − α/k over the k pairs) bootstrap intervals (prompts jointly, seeds independently).

    Rule per pair (α = 0.05): ``holds`` (privacy costs gold) if the Bonferroni interval is above 0; ``does not
    hold`` if it lies below ``equivalence_margin`` (any cost is shown smaller than the margin, or none);
    else ``inconclusive``. Descriptive: not part of B-3, which ranks the private routes only. Empty without
    non-private DPO or a private DPO route."""
    groups = _groups(records)
    base = next((g for g in groups.values() if g[0]["family"] == "dpo" and g[0]["epsilon"] is None), None)
    private = [g for g in groups.values() if g[0]["family"] == "dpo" and g[0]["epsilon"] is not None]
    if base is None or not private:
        return []
    first = base[0]
    budgets = budgets or list(first.get("kl_budgets") or [0.5, 1.0, 2.0])
    B, margin = int(first.get("n_bootstrap", 2000)), float(first.get("equivalence_margin", 0.02))
    k = len(private) * len(budgets)
    out = []
    for i, g in enumerate(sorted(private, key=lambda g: g[0]["route"])):
        for b in budgets:
            (Wn, at_n), (Wp, at_p) = _at_budget(base, b), _at_budget(g, b)
            diffs = bootstrap_diff(stream(int(first.get("root_seed", 0)), 2**31, i, int(b * 1000)), Wn, Wp, B)
            lo, hi = interval(diffs)
            blo, bhi = interval(diffs, ALPHA, k)
            verdict = "holds" if blo > 0 else ("does not hold" if bhi < margin else "inconclusive")
            out.append(
                {
                    "route": g[0]["route"],
                    "label": g[0]["label"],
                    "epsilon": g[0]["epsilon"],
                    "budget": b,
                    "nonprivate_gold": float(Wn.mean()),
                    "private_gold": float(Wp.mean()),
                    "cost": float(Wn.mean() - Wp.mean()),
                    "ci": [float(lo), float(hi)],
                    "ci_bonferroni": [float(blo), float(bhi)],
                    "margin": margin,
                    "verdict": verdict,
                    "where": {"nonprivate": at_n, "private": at_p},
                    "seeds": [int(Wn.shape[0]), int(Wp.shape[0])],
                }
            )
    return out


# ---- labellers and judges (issue 37 item 2) ----------------------------------------------------------------


def parse_lead(spec: str) -> tuple[dict, dict]:
    """``"bon:TRM-label>bon:SampleDPIHT"`` → the two routes without ε (``family``, ``method``).

    Raises:
      ExperimentError: naming the config key ``leads``.
    """
    x, sep, y = str(spec).partition(">")
    out = []
    for part in (x, y):
        fam, _, method = part.strip().partition(":")
        if not sep or fam not in routes.families() or method not in _route_class(fam).methods:
            raise _err(f"config key 'leads': {spec!r}: expected FAMILY:METHOD>FAMILY:METHOD of known routes.")
        out.append({"family": fam, "method": method})
    return out[0], out[1]


def judge_records(records: list[dict], judge: str, main: str = "minilm") -> list[dict]:
    """The curve records judged by ``judge`` (its per-prompt score of the same selection in place of the
    gold): the records themselves for the run's main gold ``main``; else from each point's ``judges``; else,
    for ``"vader"``, from the second gold of ``alt_gold`` (older records: marked ``selection_verified:
    False``, their selection was refitted without a fingerprint). Records without the judge are left out."""
    out = []
    for r in records:
        if r.get("kind") != RECORD_KIND or not r["points"]:
            continue
        pts = r["points"]
        if judge == main:
            out.append(r)
        elif all(judge in (p.get("judges") or {}) for p in pts):
            new = [
                {**p, "gold": float(np.mean(p["judges"][judge])), "per_prompt_gold": p["judges"][judge]}
                for p in pts
            ]
            out.append({**r, "points": new})
        elif judge == "vader" and all("alt_per_prompt_gold" in p for p in pts):
            alt = alt_gold_records([r])
            out += [{**a, "selection_verified": False} for a in alt]
    return out


def labeller_records(records_dir: str | Path) -> list[dict]:
    """The selector routes' curve records of a run under another labeller, read from its record folder
    (``ROUTE/seed-K/curve.json`` with ``curve-judges.json`` and ``curve-alt.json`` beside it), in the shape of
    :func:`_curve_record`; the run's configuration is the one committed with it (identities not checked
    here: the folder is a committed run's records)."""
    root = repo_path(str(records_dir))
    out = []
    for f in sorted(root.glob("*/seed-*/curve.json")):
        spec = f.parent.parent.name.replace("_eps", "@").replace("_", ":", 1)
        try:
            r = parse_route(spec)
        except ExperimentError:
            continue
        pts = json.loads(f.read_text(encoding="utf-8"))["points"]
        alt = f.parent / "curve-alt.json"
        jud = f.parent / "curve-judges.json"
        if alt.is_file():
            per = json.loads(alt.read_text(encoding="utf-8"))["per_prompt"]
            pts = [{**p, "alt_gold": float(np.mean(a)), "alt_per_prompt_gold": a} for p, a in zip(pts, per)]
        if jud.is_file():
            js = json.loads(jud.read_text(encoding="utf-8"))["judges"]
            pts = [{**p, "judges": {j: v[i] for j, v in js.items()}} for i, p in enumerate(pts)]
        g = pts[0].get("guarantee") or {"unit": route_unit(r)}
        out.append(
            {
                "kind": RECORD_KIND,
                **{k: r[k] for k in ("route", "family", "method", "epsilon")},
                "seed_index": int(f.parent.name.split("-")[1]),
                "label": route_label(spec),
                "guarantee": g,
                "points": [{k: v for k, v in p.items() if k != "guarantee"} for p in pts],
            }
        )
    return out


def _lead_tests(runs: dict[str, list[dict]], leads: list[str], epsilons: list[float], budgets: list[float],
                judges: list[str], main: str, root_seed: int, B: int) -> list[dict]:  # fmt: skip
    """Every (lead, labeller, judge, ε, budget) test: X − Y of the best gold at KL ≤ budget, its one-sided
    bootstrap p-value (prompts jointly, seeds independently) from ``max(B, ⌈10·k/α⌉)`` replicates, k the
    number of tests (so the p-value's floor 1/(B + 1) is below every Holm level α/k); ``missing`` where a
    route or judge has no records."""
    tests = []
    for li, lead in enumerate(leads):
        x, y = parse_lead(lead)
        for lab, recs in runs.items():
            for ji, j in enumerate(judges):
                groups = _groups(judge_records(recs, j, main))
                for e in epsilons:
                    gx, gy = ({k: g for k, g in groups.items() if _is(g[0], r, e)} for r in (x, y))
                    for b in budgets:
                        t: dict = {
                            "lead": lead,
                            "labeller": lab,
                            "judge": j,
                            "epsilon": e,
                            "budget": b,
                        }
                        if not gx or not gy:
                            tests.append(t | {"missing": True})
                            continue
                        (Wx, _), (Wy, _) = (
                            _at_budget(next(iter(gx.values())), b),
                            _at_budget(next(iter(gy.values())), b),
                        )
                        key = (li, ji, int(e * 1000), int(b * 1000), len(tests))
                        tests.append(t | {"W": (Wx, Wy), "key": key})
    B = max(B, math.ceil(10 * sum("W" in t for t in tests) / ALPHA))
    for t in tests:
        if "W" in t:
            Wx, Wy = t.pop("W")
            diffs = bootstrap_diff(stream(root_seed, 2**26, *t.pop("key")), Wx, Wy, B)
            lo, hi = interval(diffs)
            t |= {
                "diff": float(Wx.mean() - Wy.mean()),
                "ci": [lo, hi],
                "p_value": bootstrap_p_value(diffs),
                "n_bootstrap": B,
                "seeds": [int(Wx.shape[0]), int(Wy.shape[0])],
                "prompts": int(Wx.shape[1]),
                "diffs": diffs,
            }
    return tests


def _is(rec: dict, r: dict, e: float) -> bool:
    return bool(rec["family"] == r["family"] and rec["method"] == r["method"] and rec["epsilon"] == e)


def leads_verdict(
    runs: dict[str, list[dict]],
    leads: list[str],
    *,
    epsilons: list[float],
    budgets: list[float],
    judges: list[str],
    main: str = "minilm",
    margin: float = 0.02,
    root_seed: int = 0,
    n_bootstrap: int = 2000,
):
    """The pre-registered lead claims ``"X>Y"`` under every labeller's run (``runs``: labeller → records)
    and every judge.

    Each (lead, labeller, judge, ε, KL budget) is one test of X − Y (best gold at KL ≤ budget along each
    path; one-sided bootstrap p-value over prompts × seeds); Holm over *all* the tests (α = 0.05); a test
    ``holds`` if rejected, ``does not hold`` if its Bonferroni (1 − α/k) interval lies below ``margin`` (X's
    lead shown smaller than the margin, or none), else ``inconclusive`` (also where a route or judge has no
    records). A claim at ε decides over the tests of the labellers whose backbone X does not share
    (:func:`privalign.experiments.routes.labellers.independent`), every judge and budget: ``holds`` if all
    hold, ``does not hold`` if any does not, else ``inconclusive`` (also with no such labeller). Overall: the
    same rule over the claims. The facts name the (labeller, judge, budget) where each claim holds.
    """
    from privalign.experiments.verdicts import Outcome, all_of

    tests = _lead_tests(runs, leads, epsilons, budgets, judges, main, root_seed, n_bootstrap)
    tested = [t for t in tests if "p_value" in t]
    k = max(1, len(tested))
    for t, (level, reject) in zip(tested, holm([t["p_value"] for t in tested], ALPHA)):
        lo, hi = interval(t.pop("diffs"), ALPHA, k)
        t |= {"holm_alpha": level, "significant": reject, "ci_bonferroni": [lo, hi]}
        t["verdict"] = "holds" if reject else ("does not hold" if hi < margin else "inconclusive")
    for t in tests:
        t.setdefault("verdict", "inconclusive")
    claims: list[dict] = []
    for lead in leads:
        x, _ = parse_lead(lead)
        bb = _route_class(x["family"]).backbone(x["method"])
        indep = [lab for lab in runs if independent(bb, lab)]
        for e in epsilons:
            mine = [t for t in tests if t["lead"] == lead and t["epsilon"] == e and t["labeller"] in indep]
            claims.append(
                {
                    "lead": lead,
                    "epsilon": e,
                    "backbone": bb,
                    "independent_labellers": indep,
                    "verdict": all_of([t["verdict"] for t in mine]) if mine else "inconclusive",
                    "holds_under": [
                        [t["labeller"], t["judge"], t["budget"]]
                        for t in tests
                        if t["lead"] == lead and t["epsilon"] == e and t["verdict"] == "holds"
                    ],
                }
            )
    v = all_of([c["verdict"] for c in claims]) if claims else "inconclusive"
    parts = [
        f"{c['lead']} at ε = {c['epsilon']:g}: {c['verdict']} (labellers independent of its backbone: "
        f"{', '.join(c['independent_labellers']) or 'none'}; holds under {len(c['holds_under'])} of {n} "
        "(labeller, judge, budget))"
        for c in claims
        for n in [sum(t["lead"] == c["lead"] and t["epsilon"] == c["epsilon"] for t in tests)]
    ]
    facts = {
        "claims": claims,
        "tests": tests,
        "holm_k": len(tested),
        "labellers": list(runs),
        "judges": judges,
    }
    return Outcome(v, f"Holm over {len(tested)} tests | " + " | ".join(parts), facts)


def _judges_part(records: list[dict], cfg: dict) -> dict:
    """The summary's ``judges`` (per judge, the comparisons of :func:`frontier_comparisons` on the same
    selections) and ``leads`` (:func:`leads_verdict` over this run and ``labeller_runs``)."""
    names, main = _judge_names(cfg), _main_judge(cfg)
    if not names and not csv(cfg, "leads"):
        return {}
    lab = cfg.get("labeller", "minilm")
    out: dict = {
        "labeller": {
            "name": lab,
            "scale": float(cfg.get("labeller_scale", 1.0)),
            "backbone": LABELLERS[lab].backbone,
        },
        "judges": {
            "names": names,
            "main": main,
            "backbones": {j: LABELLERS[j].backbone for j in names},
            "per_judge": {
                j: {
                    "routes": sorted({r["route"] for r in jr}),
                    "selection_unverified": sorted(
                        {r["route"] for r in jr if r.get("selection_verified") is False}
                    ),
                    "comparisons": frontier_comparisons(jr, cfg["epsilons"], cfg["kl_budgets"]),
                }
                for j in names
                for jr in [judge_records(records, j, main)]
            },
        },
    }
    if csv(cfg, "leads"):
        others = [e.partition("=")[::2] for e in csv(cfg, "labeller_runs")]
        runs = {lab: records} | {name: labeller_records(d.strip()) for name, d in others}
        res = leads_verdict(
            runs,
            csv(cfg, "leads"),
            epsilons=list(cfg["epsilons"]),
            budgets=list(cfg["kl_budgets"]),
            judges=names or [main],
            main=main,
            margin=float(cfg["equivalence_margin"]),
            root_seed=int(cfg["seed"]),
            n_bootstrap=int(cfg["n_bootstrap"]),
        )
        out["leads"] = {
            "verdict": res[0],
            "measured": res[1],
            "runs": {lab: "this run"} | {name: d.strip() for name, d in others},
            **res.facts,
        }
    return out


#: the public pool of the labeller-scale match (base-policy completions of public IMDb openings)
SCALE_POOL = "pools/winrate-imdb-400.jsonl.gz"


def labeller_match(cfg: dict, ctx: RunContext) -> dict:
    """The label-noise match of the labeller's scale on public pairs (:func:`privalign.experiments.routes.
    labellers.public_pairs` of :data:`SCALE_POOL`, the evaluation and GRPO prompts skipped): the MiniLM gold's
    mean ``|P − ½|`` at s = 1, the labeller's at ``labeller_scale``, and the scale that matches exactly."""
    from privalign.experiments.routes.labellers import label_noise, match_scale, public_pairs

    name, scale = cfg.get("labeller", "minilm"), float(cfg.get("labeller_scale", 1.0))
    pr = _prompts(cfg)
    pairs = public_pairs(repo_path(SCALE_POOL), [*pr["eval"], *pr["grpo"]])
    flat = [t for ab in pairs for t in ab]

    def diff(who: str) -> np.ndarray:
        lg = labeller_logits(who, _judge(cfg, ctx, who)(flat)).reshape(-1, 2)
        return lg[:, 0] - lg[:, 1]

    ref, mine = diff("minilm"), diff(name)
    target = label_noise(ref, 1.0)
    return {
        "pool": SCALE_POOL,
        "pairs": len(pairs),
        "minilm_mean_abs_p_minus_half": target,
        "labeller_mean_abs_p_minus_half": label_noise(mine, scale),
        "labeller_scale": scale,
        "matched_scale": match_scale(mine, target),
    }


def _main_judge(cfg: dict) -> str:
    """The judge whose file is the run's ``gold`` (``"minilm"`` for the shipped configurations)."""
    g = repo_path(cfg["gold"]).resolve()
    return next((n for n, j in LABELLERS.items() if j.path and repo_path(j.path).resolve() == g), "gold")


def _summarize(records: list[dict], cfg: dict) -> dict:
    v, m = frontier_verdict(records, epsilons=cfg["epsilons"], budgets=cfg["kl_budgets"])
    data = next((r for r in records if r.get("kind") == "data"), {})
    quick_grpo = not any(parse_route(r)["family"] == "grpo" for r in cfg["routes"])
    alt = alt_gold_records(records)
    pending = [f"{r['route']} seed={r['seed_index']}" for r in records if r.get("kind") == "pending"]
    alt_part = (
        {
            "alt_gold": {
                "gold": cfg["alt_gold"],
                "routes": sorted({r["route"] for r in alt}),
                "note": (
                    "the best-of-n and PrivBoN routes (same fits, same selection laws, same exact KL) "
                    "judged by a second gold of another family than the MiniLM gold: does the ranking "
                    "survive a judge that shares no backbone with the MiniLM reward models? Descriptive: "
                    "B-3 is decided on the main gold"
                ),
                "comparisons": frontier_comparisons(alt, cfg["epsilons"], cfg["kl_budgets"]),
            }
        }
        if alt
        else {}
    )
    return {
        **alt_part,
        **_judges_part(records, cfg),
        "verdict": v,
        "measured": m
        + (" | no GRPO route in this configuration" if quick_grpo else "")
        + (f" | pending (records_only, left out): {', '.join(pending)}" if pending else ""),
        **({"pending": pending} if pending else {}),
        "curves": frontier_curves(records),
        "comparisons": frontier_comparisons(records, cfg["epsilons"], cfg["kl_budgets"]),
        "dpo_privacy_cost": dpo_privacy_cost(records, cfg["kl_budgets"]),
        "reference_gold": data.get("reference_gold"),
        "data": {
            k: data.get(k)
            for k in ("n_pairs", "label_rule", "sampler", "base_model", "eval_prompts", "reference_samples")
        }
        | {k: data[k] for k in ("labeller", "labeller_scale", "labeller_match") if k in data},
        "note": (
            "gold = MiniLM gold P(positive) of the completion (never trained on the private pairs); "
            "KL(π ‖ π_ref) "
            "in nats: DPO/GRPO from the samples' log-probabilities (Monte Carlo, ±SE), best-of-n and PrivBoN "
            "exact over the eval prompts' reference samples (atom view: each reference sample has mass 1/m); "
            "95% bootstrap over prompts × seeds; the trained routes pay ε once, PrivBoN pays ε per answer"
        ),
    }


# ---------------------------------------------------------------------------------------------------------
# figure
# ---------------------------------------------------------------------------------------------------------

_COLORS = {
    "dpo:none": "#000000",
    "dpo:label": "#1f77b4",
    "dpo:sample": "#17becf",
    "bon:RRIHT": "#d62728",
    "bon:DenseRR": "#ff9896",
    "bon:SampleDPIHT": "#2ca02c",
    "bon:DPSGDLinear": "#98df8a",
    "bon:TRM-sample": "#9467bd",
    "bon:TRM-label": "#c5b0d5",
    "grpo:RRIHT": "#8c564b",
    "grpo:TRM-sample": "#e377c2",
    "privbon": "#ff7f0e",
}


def _plot(run_dir: Path) -> list[str]:
    from privalign.experiments.plotting import new_figure, save_figure

    recs = read_results(run_dir)
    curves = frontier_curves(recs)
    data = next((r for r in recs if r.get("kind") == "data"), None)
    eps = sorted({c["epsilon"] for c in curves if c["epsilon"] is not None}, reverse=True)
    if not curves or not eps:
        return []
    fig, axes = new_figure(1, len(eps), width=5.6 * len(eps), height=4.8)
    axes = np.atleast_1d(axes)
    for ax, e in zip(axes, eps):
        for c in curves:
            if c["epsilon"] not in (e, None):
                continue
            key = c["route"].split("@")[0]
            color = _COLORS.get(key, _COLORS.get(c["family"], "grey"))
            ls = _route_class(c["family"]).line
            pts = c["points"]
            lab = (
                f"{c['label']}"
                + (f", ε={c['epsilon']:g}" if c["epsilon"] is not None else "")
                + f" [{c['unit'].split(' (')[0]}], {c['seeds']} seed{'s' if c['seeds'] > 1 else ''}"
            )
            ax.errorbar(
                [p["kl"] for p in pts],
                [p["gold"] for p in pts],
                xerr=[2 * p["kl_se"] for p in pts],
                yerr=[[p["gold"] - p["ci"][0] for p in pts], [p["ci"][1] - p["gold"] for p in pts]],
                fmt=ls,
                marker="o" if _route_class(c["family"]).trained else ".",
                markersize=3,
                color=color,
                capsize=2,
                linewidth=1.2 if c["epsilon"] is not None else 0.9,
                alpha=0.9 if c["epsilon"] is not None else 0.6,
                label=lab,
            )
        if data is not None:
            ax.plot([0], [data["reference_gold"]], "k*", markersize=9, label="base policy (reference)")
        P = curves[0]["prompts"]
        ax.set_title(
            f"ε = {e:g} (PrivBoN: ε per answer, composes over answers)\n{P} held-out IMDb prompts", fontsize=8
        )
        ax.set_xlabel("KL(π ‖ π_ref) [nats] (DPO/GRPO: ±2 SE; BoN/PrivBoN: exact)")
        ax.set_ylabel("gold reward, MiniLM P(positive) (95% CI: prompts × seeds)")
        ax.legend(fontsize=5.5, loc="best")
    fig.tight_layout()
    return [save_figure(fig, run_dir, "frontier_gold_vs_kl"), *_plot_judges(recs, eps, run_dir)]


def _plot_judges(recs: list[dict], eps: list[float], run_dir: Path) -> list[str]:
    """Where the records carry ``judges``: one row per judge, one column per ε, each route's curve under that
    judge (the same selections, the same KL)."""
    from privalign.experiments.plotting import new_figure, save_figure

    first = next((r for r in recs if r.get("kind") == RECORD_KIND and r["points"]), None)
    names = list((first["points"][0].get("judges") or {}) if first else {})
    if not names:
        return []
    fig, flat = new_figure(len(eps), len(names), width=5.6, height=4.2)  # one row per judge
    axes = [flat[i * len(eps) : (i + 1) * len(eps)] for i in range(len(names))]
    for i, j in enumerate(names):
        curves = frontier_curves(judge_records(recs, j, main=""))
        for ax, e in zip(axes[i], eps):
            for c in curves:
                if c["epsilon"] not in (e, None):
                    continue
                key = c["route"].split("@")[0]
                pts = c["points"]
                ax.errorbar(
                    [p["kl"] for p in pts],
                    [p["gold"] for p in pts],
                    yerr=[[p["gold"] - p["ci"][0] for p in pts], [p["ci"][1] - p["gold"] for p in pts]],
                    fmt=_route_class(c["family"]).line,
                    marker=".",
                    markersize=3,
                    color=_COLORS.get(key, _COLORS.get(c["family"], "grey")),
                    capsize=2,
                    linewidth=1.0,
                    label=f"{c['label']}, {c['seeds']} seeds",
                )
            ax.set_title(f"judge {j} ({LABELLERS[j].what}), ε = {e:g}", fontsize=8)
            ax.set_xlabel("KL(π ‖ π_ref) [nats]")
            ax.set_ylabel(f"{j} score (95% CI: prompts × seeds)")
    axes[0][0].legend(fontsize=5, loc="upper left")
    fig.tight_layout()
    return [save_figure(fig, run_dir, "frontier_judges")]


EXPERIMENTS: dict[str, Experiment] = {
    NAME: Experiment(
        NAME,
        "One frontier on IMDb: gold reward vs KL for non-private / label-DP / sample-DP DPO, private linear "
        "and "
        "MiniLM reward models → best-of-n and GRPO, and PrivBoN per answer, at ε ∈ {2, 8}",
        "beyond",
        _schema,
        _preflight,
        _cells,
        _run_cell,
        _summarize,
        _plot,
    ),
}
