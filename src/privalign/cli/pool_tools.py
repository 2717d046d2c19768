"""Pool tools: ``privalign rescore-pool`` (new rewards for an existing pool), ``privalign bon-curve`` (does
best-of-N on the proxy over-optimise the gold reward?) and ``privalign fit-imdb-reward`` (the IMDb gold and
proxy reward models used by the shipped pools)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from privalign.cli._args import emit_json


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "rescore-pool",
        help="re-score an existing pool with other proxy/true rewards (no generation)",
        description="Recompute proxy_reward and/or true_reward of every candidate of POOL with the named "
        "scorers (same names as build-pool) and write a new pool plus a manifest naming the source pool "
        "(SHA-256). The source is never modified.",
    )
    p.add_argument("--pool", required=True, help="source pool (.jsonl or .jsonl.gz)")
    p.add_argument(
        "--proxy-reward",
        default=None,
        help="vader | vader-compound | profanity | clean | linear:PATH | hf:DIR | gsm8k | mmlu | math",
    )
    p.add_argument("--true-reward", default=None, help="same choices as --proxy-reward")
    p.add_argument("--out", required=True, help="destination pool (must differ from --pool)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(func=_rescore)

    ph = subparsers.add_parser(
        "plant-hack",
        help="a planted reward-hacking control on real text: proxy + BONUS on a rare textual feature",
        description="Write a copy of POOL whose proxy reward is proxy + BONUS on every candidate with "
        "FEATURE (a rare real textual feature the gold reward does not reward); texts and gold rewards are "
        "unchanged. The manifest says pool_kind planted-real, and every bon-curve or paper-1 verdict on the "
        "pool says 'planted real text': it shows that the pipeline and the rules detect hacking, not that "
        "best-of-N over-optimises a natural proxy.",
    )
    ph.add_argument("--pool", required=True, help="source pool (.jsonl or .jsonl.gz)")
    ph.add_argument(
        "--feature",
        required=True,
        choices=["repeated-word", "allcaps-word", "semicolon", "hashtag"],
        help="the planted feature (privalign.pipeline.planted.PLANTED_FEATURES)",
    )
    ph.add_argument(
        "--bonus",
        type=float,
        required=True,
        help="added to the proxy of every candidate with the feature (public; larger than the proxy's "
        "spread makes every such candidate top its prompt)",
    )
    ph.add_argument("--out", required=True, help="destination pool (must differ from --pool)")
    ph.set_defaults(func=_plant)

    b = subparsers.add_parser(
        "bon-curve",
        help="exact BoN curves of proxy and gold reward; paired test of over-optimisation",
        description="For each pool: the exact expected proxy and gold reward of best-of-N on the proxy, N = "
        "1, 2, 4, ... up to the candidates per prompt, and a one-sided paired max-t test over all N jointly "
        "(sign flips of whole prompts, family-wise level --alpha) of whether the largest N picks texts with "
        "lower gold reward than some smaller N (per-N Wilcoxon signed-rank and exact sign tests, Bonferroni, "
        "beside it). Verdict on 'the gold falls at large N': holds (the max-t test rejects), does not hold "
        "(at every smaller "
        "N, the one-sided t lower bound of gold(N_max) - gold(N) is above -MARGIN x the BoN gold lift), or "
        "inconclusive; printed with the tests' power, the pool kind (natural real text, or planted real text "
        "for a plant-hack control) and the pool's capacity diagnostic (gold by proxy-rank band, tail vs bulk "
        "slope, BoN's gold vs the linear prediction, and whether the pool can show over-optimisation at the "
        "N it holds). Writes OUT.json and OUT.png.",
    )
    b.add_argument(
        "--pool", action="append", required=True, help="pool file (repeat to compare several in one figure)"
    )
    b.add_argument(
        "--label",
        action="append",
        default=None,
        help="series label per --pool (default: proxy / gold from the manifest)",
    )
    b.add_argument(
        "--alpha",
        type=float,
        default=0.05,
        help="family-wise false-positive rate of the over-optimisation test (default 0.05)",
    )
    b.add_argument(
        "--margin",
        type=float,
        default=0.1,
        help="'does not hold' tolerates a fall smaller than this share of |gold(N_max) - gold(1)| "
        "(default 0.1)",
    )
    b.add_argument(
        "--out",
        required=True,
        help="output prefix: writes OUT.json and OUT.png (a trailing .json or .png is dropped: --out X.json "
        "writes X.json and X.png)",
    )
    b.set_defaults(func=_bon)

    f = subparsers.add_parser(
        "fit-imdb-reward",
        help="fit an IMDb gold or proxy reward model (a reward-model file, privalign.reward_model v2)",
        description="gold-ngram: logistic regression on hashed 1-2-grams of the 24,000 fit-part reviews; "
        "gold-minilm: logistic regression on MiniLM embeddings of word windows of gold-part reviews; "
        "proxy-ngram: the n-gram model on only the few proxy-part reviews (disjoint from gold-minilm's). "
        "Held-out accuracies go into the file's metadata.",
    )
    f.add_argument(
        "--kind",
        required=True,
        choices=["gold-ngram", "gold-minilm", "proxy-ngram"],
        help="which model to fit (see above)",
    )
    f.add_argument("--n-reviews", type=int, default=12_000, help="gold-minilm: gold-part reviews to fit on")
    f.add_argument(
        "--n-proxy-reviews",
        type=int,
        default=200,
        help="size of the proxy part (proxy-ngram fits on it, gold-minilm excludes it)",
    )
    f.add_argument("--window-words", type=int, default=24, help="gold-minilm: words per training window")
    f.add_argument("--out", required=True, help="destination .json")
    f.set_defaults(func=_fit)

    h = subparsers.add_parser(
        "fit-hh-reward",
        help="fit the HH-RLHF gold (MiniLM Bradley-Terry) or a proxy (n-gram Bradley-Terry on "
        "gold-relabelled pairs)",
        description="gold: Bradley-Terry on MiniLM embeddings of the final responses of all harmless-base "
        "pairs (5-fold CV pair accuracy in the metadata). proxy: Bradley-Terry on hashed word 1-2-grams fit "
        "on --n-pairs pairs relabelled by --gold, drawn only from dialogues with index >= --eval-prompts "
        "(never the pool's prompts).",
    )
    h.add_argument(
        "--kind",
        required=True,
        choices=["gold", "proxy"],
        help="gold: MiniLM Bradley-Terry on all human pairs; proxy: n-gram model on gold-relabelled pairs",
    )
    h.add_argument("--gold", default=None, help="proxy: the gold reward file that relabels the pairs")
    h.add_argument(
        "--n-pairs",
        default="200",
        help="proxy: gold-relabelled pairs to fit on; a comma list (e.g. 50,200,1000) needs '{n}' in --out",
    )
    h.add_argument(
        "--eval-prompts", type=int, default=64, help="proxy: dialogues 0..K-1 are reserved for pool prompts"
    )
    h.add_argument(
        "--seed",
        type=int,
        default=0,
        help="proxy: seed of the pair sample; gold: seed of the CV folds (default 0)",
    )
    h.add_argument("--out", required=True, help="destination .json")
    h.set_defaults(func=_fit_hh)


def _rescore(args: argparse.Namespace) -> int:
    from privalign.pipeline.rescore import rescore_pool

    man = rescore_pool(
        args.pool,
        args.out,
        proxy_reward=args.proxy_reward,
        true_reward=args.true_reward,
        progress=not args.no_progress,
    )
    print(
        f"wrote {args.out}: {man['num_prompts']} prompts, {man['num_candidates']} candidates; re-scored "
        f"{', '.join(man['rescored'])}",
        file=sys.stderr,
    )
    return 0


def _plant(args: argparse.Namespace) -> int:
    from privalign.pipeline.planted import plant_hack

    man = plant_hack(args.pool, args.out, feature=args.feature, bonus=args.bonus)
    pl = man["planted"]
    print(
        f"wrote {args.out} (planted real text): {pl['candidates_with_feature']} of {man['num_candidates']} "
        f"candidates have {pl['description']} (1 in {1 / pl['rate']:.0f}); their proxy + {pl['bonus']:g}",
        file=sys.stderr,
    )
    return 0


def _bon(args: argparse.Namespace) -> int:
    from privalign._validation import check_real
    from privalign.pipeline.analysis import bon_report_lines, write_bon_report

    alpha = check_real(args.alpha, "alpha", low=0.0, high=1.0, closed="neither")
    if args.label is not None and len(args.label) != len(args.pool):
        print(
            f"privalign bon-curve: error: give one --label per --pool ({len(args.pool)}); got "
            f"{len(args.label)}",
            file=sys.stderr,
        )
        return 2
    margin = check_real(args.margin, "margin", low=0.0, high=1.0)
    for suffix in (".json", ".png"):  # a prefix given as a file name: OUT.json, not OUT.json.json
        if args.out.endswith(suffix) and len(args.out) > len(suffix):
            args.out = args.out[: -len(suffix)]
    doc = write_bon_report(args.pool, args.out, labels=args.label, alpha=alpha, margin_fraction=margin)
    for res in doc.get("series", [doc]):
        for line in bon_report_lines(res, alpha):
            print(line)
    print(f"wrote {args.out}.json and {args.out}.png", file=sys.stderr)
    return 0


def _fit_hh(args: argparse.Namespace) -> int:
    from privalign.pipeline.hh import fit_hh_gold, fit_hh_proxy

    if args.seed < 0:
        print(f"privalign fit-hh-reward: error: --seed must be >= 0; got {args.seed}", file=sys.stderr)
        return 2
    if args.kind == "gold":
        meta: dict[str, Any] | list[dict[str, Any]] = fit_hh_gold(args.out, random_state=args.seed)
    else:
        if not args.gold:
            print("privalign fit-hh-reward: error: --gold is required with --kind proxy", file=sys.stderr)
            return 2
        try:
            sizes = [int(x) for x in str(args.n_pairs).split(",") if x.strip()]
        except ValueError:
            print(
                "privalign fit-hh-reward: error: --n-pairs must be integers separated by commas; got "
                f"{args.n_pairs!r}",
                file=sys.stderr,
            )
            return 2
        meta = fit_hh_proxy(
            args.out,
            args.gold,
            n_pairs=sizes[0] if len(sizes) == 1 else sizes,
            eval_prompts=args.eval_prompts,
            seed=args.seed,
        )
    emit_json(meta, indent=1)
    return 0


def _fit(args: argparse.Namespace) -> int:
    from privalign.pipeline.gold import fit_imdb_reward

    kw: dict = {}
    if args.kind == "gold-minilm":
        kw = {
            "n_reviews": args.n_reviews,
            "window_words": args.window_words,
            "n_proxy_reviews": args.n_proxy_reviews,
        }
    elif args.kind == "proxy-ngram":
        kw = {"n_proxy_reviews": args.n_proxy_reviews}
    meta = fit_imdb_reward(args.kind, args.out, **kw)
    emit_json(meta, indent=1)
    return 0
