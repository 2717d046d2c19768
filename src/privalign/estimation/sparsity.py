"""Sparsity check on real preference features: do the sparse estimators have a sparse signal to find?

Is the preference signal of a real data set *sparse* in a given public feature map? Two measurements:

* :func:`sparsity_curve`: held-out accuracy of non-private IHT as a function of the kept sparsity s, next
  to the dense ridge MLE. A sparse signal shows accuracy saturating at small s; a dense one keeps rising
  up to s ≈ d.
* :func:`sparse_vs_dense`: at one ε, each sparse private estimator against its dense counterpart of the
  same privacy unit (RR-IHT vs dense RR, label-DP; Sample-DP IHT vs DP-SGD, sample-DP), every one tuned by
  the accounted protocol of :mod:`privalign.estimation.tuning` on the training pairs only (the total
  search costs ε), compared on the *same* held-out pairs with an exact two-sided McNemar test
  (:func:`mcnemar_exact`, α = 0.05).

``python -m privalign.estimation.sparsity --out DIR`` runs both on HH-RLHF harmless-base (hashed n-grams
and the harm lexicon :func:`~privalign.estimation.features.harm_lexicon`) and IMDb (hashed n-grams), and
writes ``DIR/sparsity.json`` (records in the p2-accuracy record style: ``kind`` = ``"sparsity"`` or
``"sparse_vs_dense"``) and ``DIR/sparsity.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from privalign._validation import check_int, check_real
from privalign.errors import PrivacyParameterError

__all__ = ["mcnemar_exact", "sparsity_curve", "sparse_vs_dense", "run_sparsity_check", "ALPHA"]

#: Significance level of the paired test.
ALPHA = 0.05


def _per_pair_correct(est: Any, X: Any, y: np.ndarray) -> np.ndarray:
    """1 / 0 per held-out pair, ½ for a tie (reward difference exactly 0), as ``score`` counts them."""
    r = est.predict_reward(X)
    return np.where(r > 0, (y == 1).astype(float), np.where(r < 0, (y == 0).astype(float), 0.5))


def mcnemar_exact(correct_a: Any, correct_b: Any) -> dict[str, Any]:
    """Exact two-sided McNemar test of equal accuracy of two classifiers on the same pairs.

    Discordant pairs are those where the per-pair scores differ (a tie, scored ½, against a 1 or 0 counts
    as discordant in the direction of the difference). Under H0 the number ``b`` of discordant pairs won
    by A is Binomial(b + c, ½); the p-value is ``min(1, 2·P(X ≤ min(b, c)))`` computed exactly
    (``scipy.stats.binom.cdf``).

    Returns:
      ``{"a_better": b, "b_better": c, "p_value": p, "alpha": ALPHA, "significant": p < α,
      "diff": mean(a) − mean(b)}``.

    Raises:
      PrivacyParameterError: different lengths or empty input.
    """
    from scipy import stats

    a = np.asarray(correct_a, dtype=float)
    b_ = np.asarray(correct_b, dtype=float)
    if a.shape != b_.shape or a.ndim != 1 or a.size == 0:
        raise PrivacyParameterError(
            f"The 'correct_a' and 'correct_b' parameters must be non-empty 1-D arrays of equal length. "
            f"Got shapes {a.shape} and {b_.shape}."
        )
    b = int(np.sum(a > b_))
    c = int(np.sum(a < b_))
    p = 1.0 if b + c == 0 else float(min(1.0, 2.0 * stats.binom.cdf(min(b, c), b + c, 0.5)))
    return {
        "a_better": b,
        "b_better": c,
        "p_value": p,
        "alpha": ALPHA,
        "significant": bool(p < ALPHA),
        "diff": float(a.mean() - b_.mean()),
    }


def sparsity_curve(
    train: Any,
    test: Any,
    s_grid: list[int],
    *,
    step_size: float = 4.0,
    radius: float = 5.0,
    alpha: float | None = 1e-3,
) -> list[dict[str, Any]]:
    """Held-out accuracy of non-private IHT (full variant, T = 100) for each s ≤ d, and of the dense MLE.

    Returns one dict per s: ``{"method": "IHT" | "MLE", "s": s (d for MLE), "accuracy", "se"}`` with the
    binomial standard error ``sqrt(acc(1 − acc)/n_test)``.
    """
    from privalign.estimation.baselines import MLE
    from privalign.estimation.iht import IHT

    d = int(train.X.shape[1])
    n_test = int(test.y.shape[0])
    out = []
    for s in s_grid:
        s = check_int(s, "s_grid", low=1)
        if s > d:
            continue
        acc = (
            IHT(sparsity=s, step_size=step_size, radius=radius, clip=True)
            .fit(train.X, train.y)
            .score(test.X, test.y)
        )
        out.append({"method": "IHT", "s": s, "accuracy": acc, "se": math.sqrt(acc * (1 - acc) / n_test)})
    acc = MLE(alpha=alpha, clip=True, feature_bound=1.0).fit(train.X, train.y).score(test.X, test.y)
    out.append({"method": "MLE", "s": d, "accuracy": acc, "se": math.sqrt(acc * (1 - acc) / n_test)})
    return out


def _grids(d: int, n: int) -> dict[str, tuple[Any, dict[str, list[Any]]]]:
    from privalign.estimation.baselines import DenseRR, DPSGDLinear
    from privalign.estimation.iht import RRIHT, SampleDPIHT

    s_list = sorted({min(d, s) for s in (4, 16, 64, 256)})
    return {
        "RRIHT": (RRIHT(clip=True), {"sparsity": s_list}),
        "DenseRR": (DenseRR(clip=True, feature_bound=1.0), {"alpha": [1e-3, 1e-2, 1e-1, 1.0]}),
        # small s only, as experiment_param_grid: Peeling cannot select at larger s with a few thousand pairs
        "SampleDPIHT": (SampleDPIHT(clip=True), {"sparsity": sorted({min(d, 4), min(d, 16)})}),
        "DPSGDLinear": (
            DPSGDLinear(clip=True, feature_bound=1.0, batch_size=min(256, n // 2), epochs=10.0),
            {"clip_norm": [1.0, 4.0], "learning_rate": [0.5, 2.0]},
        ),
    }


def sparse_vs_dense(
    train: Any,
    test: Any,
    *,
    epsilon: float,
    delta: float = 1e-5,
    seed: int = 0,
    validation_fraction: float = 0.2,
) -> list[dict[str, Any]]:
    """Tuned sparse vs tuned dense private estimators at one ε with the exact McNemar test.

    Each estimator is tuned with :class:`~privalign.estimation.tuning.PrivateGridSearch` on ``train`` only
    (groups = prompt ids; total cost (ε, δ), selection included), then scored on ``test``.
    """
    from privalign.estimation.tuning import PrivateGridSearch, validation_groups

    epsilon = check_real(epsilon, "epsilon", low=0.0, closed="neither")
    grids = _grids(int(train.X.shape[1]), int(train.y.shape[0]))
    ss = np.random.SeedSequence(seed)
    fitted: dict[str, Any] = {}
    for (name, (est, grid)), s in zip(grids.items(), ss.spawn(len(grids))):
        g = PrivateGridSearch(
            est,
            grid,
            epsilon=epsilon,
            delta=delta,
            validation_fraction=validation_fraction,
            random_state=np.random.default_rng(s),
        )
        fitted[name] = g.fit(train.X, train.y, groups=validation_groups(est, train.prompt_ids))
    out = []
    for sparse, dense, unit in (
        ("RRIHT", "DenseRR", "label-DP ε"),
        ("SampleDPIHT", "DPSGDLinear", "sample-DP (ε, δ)"),
    ):
        ca = _per_pair_correct(fitted[sparse], test.X, test.y)
        cb = _per_pair_correct(fitted[dense], test.X, test.y)
        t = mcnemar_exact(ca, cb)
        out.append(
            {
                "kind": "sparse_vs_dense",
                "epsilon": epsilon,
                "unit": unit,
                "sparse": sparse,
                "dense": dense,
                "sparse_accuracy": float(ca.mean()),
                "dense_accuracy": float(cb.mean()),
                "sparse_params": fitted[sparse].best_params_,
                "dense_params": fitted[dense].best_params_,
                "sparse_budget": fitted[sparse].privacy_budget_["epsilon"],
                "dense_budget": fitted[dense].privacy_budget_["epsilon"],
                "n_test": int(test.y.shape[0]),
                "test": "exact two-sided McNemar",
                **t,
                "verdict": (
                    "sparse better"
                    if t["significant"] and t["diff"] > 0
                    else "dense better"
                    if t["significant"] and t["diff"] < 0
                    else "no significant difference"
                ),
            }
        )
    return out


def _datasets(names: list[str], n_pairs: int, seed: int, n_features: int, n_profane: int):
    from privalign.data.preferences_io import load_hh_rlhf_pairs, load_imdb_pairs
    from privalign.estimation.features import HashedNgramFeatures, LexiconFeatures, harm_lexicon
    from privalign.estimation.preferences import PreferenceData, train_test_split_by_prompt

    for k, ds in enumerate(names):
        ss = np.random.SeedSequence(seed, spawn_key=(k,))
        s_load, s_orient, s_split = ss.spawn(3)
        if ds == "hh-rlhf":
            pairs = load_hh_rlhf_pairs(limit=n_pairs)
            fmaps = {
                "hashed-ngram": HashedNgramFeatures(n_features=n_features, ngram_range=(1, 2)),
                "harm-lexicon": LexiconFeatures(harm_lexicon(n_profane), name="harm"),
            }
        elif ds == "imdb":
            pairs = load_imdb_pairs(n_pairs, random_state=np.random.default_rng(s_load), max_chars=2000)
            fmaps = {"hashed-ngram": HashedNgramFeatures(n_features=n_features, ngram_range=(1, 2))}
        else:
            raise PrivacyParameterError(
                f"The 'datasets' parameter must list 'hh-rlhf' or 'imdb'. Got {ds!r}."
            )
        for fname, fmap in fmaps.items():
            data = PreferenceData.from_text_pairs(
                pairs.prompts,
                pairs.chosen,
                pairs.rejected,
                fmap,
                prompt_ids=pairs.prompt_ids,
                random_state=np.random.default_rng(s_orient),
            )
            train, test = train_test_split_by_prompt(
                data, test_size=0.2, random_state=np.random.default_rng(s_split)
            )
            yield ds, fname, train, test


def run_sparsity_check(
    out_dir: str | Path,
    *,
    datasets: tuple[str, ...] = ("hh-rlhf", "imdb"),
    n_pairs: int = 2312,
    n_features: int = 2**14,
    n_profane: int = 256,
    epsilon: float = 8.0,
    s_grid: tuple[int, ...] = (1, 4, 16, 64, 256, 1024, 4096),
    seed: int = 42,
) -> list[dict]:
    """Run :func:`sparsity_curve` and :func:`sparse_vs_dense` on each data set and feature map; write
    ``sparsity.json`` and ``sparsity.md`` into ``out_dir``; return the records."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    for ds, fname, train, test in _datasets(list(datasets), n_pairs, seed, n_features, n_profane):
        t0 = time.perf_counter()
        for r in sparsity_curve(train, test, list(s_grid)):
            records.append(
                {
                    "kind": "sparsity",
                    "dataset": ds,
                    "features": fname,
                    "d": int(train.X.shape[1]),
                    "n_train": int(train.y.shape[0]),
                    "n_test": int(test.y.shape[0]),
                    **r,
                }
            )
        for r in sparse_vs_dense(train, test, epsilon=epsilon, seed=seed):
            records.append({"dataset": ds, "features": fname, "d": int(train.X.shape[1]), **r})
        print(f"{ds}/{fname}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    (out / "sparsity.json").write_text(
        json.dumps(
            {"records": records, "alpha": ALPHA, "seed": seed, "epsilon": epsilon}, indent=1, default=str
        )
    )
    (out / "sparsity.md").write_text(_markdown(records))
    return records


def _markdown(records: list[dict]) -> str:
    from privalign.estimation.registry import is_estimator

    lines = ["| data set | features | d | IHT accuracy by s (± SE) | dense MLE |", "|---|---|---:|---|---:|"]
    keys = sorted({(r["dataset"], r["features"]) for r in records if r["kind"] == "sparsity"})
    for ds, f in keys:
        rows = [r for r in records if r["kind"] == "sparsity" and r["dataset"] == ds and r["features"] == f]
        iht = ", ".join(
            f"s={r['s']}: {r['accuracy']:.3f}±{r['se']:.3f}" for r in rows if is_estimator(r["method"], "IHT")
        )
        mle = next(r for r in rows if is_estimator(r["method"], "MLE"))
        lines.append(f"| {ds} | {f} | {rows[0]['d']} | {iht} | {mle['accuracy']:.3f}±{mle['se']:.3f} |")
    lines += [
        "",
        "| data set | features | ε | sparse (tuned) | dense (tuned) | discordant (sparse/dense) | "
        "McNemar p (α = 0.05) | verdict |",
        "|---|---|---:|---|---|---|---:|---|",
    ]
    for r in records:
        if r["kind"] == "sparse_vs_dense":
            lines.append(
                f"| {r['dataset']} | {r['features']} | {r['epsilon']:g} | {r['sparse']} "
                f"{r['sparse_accuracy']:.3f} {r['sparse_params']} | {r['dense']} {r['dense_accuracy']:.3f} "
                f"{r['dense_params']} | {r['a_better']}/{r['b_better']} | {r['p_value']:.3g} | "
                f"{r['verdict']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m privalign.estimation.sparsity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="Output directory.")
    p.add_argument("--datasets", default="hh-rlhf,imdb", help="Comma-separated: hh-rlhf, imdb.")
    p.add_argument("--n-pairs", type=int, default=2312, help="Pairs per data set (default 2312).")
    p.add_argument(
        "--epsilon", type=float, default=8.0, help="ε of the sparse-vs-dense comparison (default 8)."
    )
    p.add_argument("--seed", type=int, default=42, help="Root seed (default 42).")
    args = p.parse_args(argv)
    try:
        run_sparsity_check(
            args.out,
            datasets=tuple(s.strip() for s in args.datasets.split(",") if s.strip()),
            n_pairs=args.n_pairs,
            epsilon=args.epsilon,
            seed=args.seed,
        )
    except PrivacyParameterError as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    print((Path(args.out) / "sparsity.md").read_text())
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
