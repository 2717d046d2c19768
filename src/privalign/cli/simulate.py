"""``privalign simulate``: the authors' evaluation protocol on a scored pool → results.json + PNG figures
(PDF too with ``--pdf``)."""

from __future__ import annotations

from privalign.cli._args import emit_json, nonneg_int

__all__ = ["register"]


# Size limits: the engine holds one (replicates × candidates) permutation per prompt and the synthetic pool
# two (prompts × candidates) float arrays; beyond these it failed with a MemoryError instead of a message.
MAX_SYNTHETIC_SCORES = 2**26  # PROMPTS × CANDIDATES of --synthetic (67,108,864 scores, 0.5 GiB per array)
MAX_REPLICATE_DRAWS = 2**25  # --replicates × the widest prompt's candidates (33,554,432; 256 MiB per prompt)

#: The options (default ``None`` until filled in by :func:`_check_unused`) each method reads, and their
#: defaults. PrivITP reads --epsilon only when its σ is calibrated to it (no --sigma-x).
_DEFAULTS = {"beta": "0.05", "epsilon": "4", "L": 3.0, "delta": 1e-6}
_USES = {
    "bon": (),
    "itp": ("beta",),
    "privbon": ("epsilon", "sigma_gumbel"),
    "privitp": ("beta", "sigma_x", "sigma_z", "L", "delta"),
}


def _methods(args) -> list[str]:
    from privalign.errors import PrivacyParameterError

    methods = [x.strip() for x in args.methods.split(",") if x.strip()]
    for m in methods:
        if m not in _USES:
            raise PrivacyParameterError(
                f"The '--methods' option must list bon, itp, privbon, privitp. Got {m!r} instead."
            )
    if not methods:  # the engine would call it 'specs'
        raise PrivacyParameterError(
            f"The '--methods' option must list at least one of bon, itp, privbon, privitp. Got "
            f"{args.methods!r} instead."
        )
    return methods


def _check_unused(args) -> None:
    """An option that no listed method reads is refused, not ignored (as ``select`` does): e.g. ``--methods
    bon --epsilon 2`` would otherwise draw a non-private curve though ε = 2 was asked for. Then the defaults
    of the options left out are filled in."""
    from privalign.errors import PrivacyParameterError

    methods = _methods(args)
    used = {name for m in methods for name in _USES[m]}
    if "privitp" in methods and args.sigma_x is None:
        used.add("epsilon")  # PrivITP's σ is calibrated to the worst-case ε = --epsilon
    if args.sigma_z is not None and args.sigma_x is None and "privitp" in methods:
        raise PrivacyParameterError(
            "argument --sigma-z: needs --sigma-x (without them PrivITP's σ_X = σ_Z is calibrated so that its "
            "worst-case ε equals --epsilon); give --sigma-x too or drop --sigma-z"
        )
    if args.sigma_gumbel is not None and args.epsilon is not None and "privitp" not in methods:
        raise PrivacyParameterError(
            "argument --epsilon: not used with --sigma-gumbel (PrivBoN is then given by its Gumbel scale); "
            "drop one of them"
        )
    for name in ("beta", "epsilon", "sigma_gumbel", "sigma_x", "sigma_z", "L", "delta"):
        if name not in used and getattr(args, name) is not None:
            flag = "--" + name.replace("_", "-")
            readers = ", ".join(sorted(m for m, uses in _USES.items() if name in uses))
            if name == "epsilon":
                readers += "; privitp without --sigma-x"
            raise PrivacyParameterError(
                f"argument {flag}: not used by --methods {args.methods} (it is read by {readers}); "
                f"drop {flag} or add a method that reads it"
            )
    for name, value in _DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def _check_sizes(args, pool=None) -> None:
    """Refuse sizes the engine cannot hold in memory, naming the option (it failed with a MemoryError)."""
    from privalign.errors import PrivacyParameterError

    if pool is None:
        p, c = _synthetic(args.synthetic)
        if p * c > MAX_SYNTHETIC_SCORES:
            raise PrivacyParameterError(
                f"argument --synthetic: {args.synthetic} is {p * c:,} scores; at most "
                f"{MAX_SYNTHETIC_SCORES:,} (PROMPTS × CANDIDATES) fit in memory"
            )
        return
    widest = int(pool.counts.max()) if pool.counts.size else 0
    if args.replicates * widest > MAX_REPLICATE_DRAWS:
        raise PrivacyParameterError(
            f"argument --replicates: {args.replicates:,} replicates × {widest:,} candidates per prompt is "
            f"{args.replicates * widest:,} draws; at most {MAX_REPLICATE_DRAWS:,} fit in memory (at most "
            f"{max(1, MAX_REPLICATE_DRAWS // max(1, widest)):,} replicates for this pool)"
        )


def _privitp_specs(args, k: int, r_max: float) -> list:
    """PrivITP's curves: at the given --sigma-x/--sigma-z, or (the default) with σ_X = σ_Z calibrated so that
    its worst-case ε_max(N) at --delta, at the largest N = 2^k, equals each --epsilon: the privacy of the
    PrivBoN curve beside it (at smaller N it is lower). Equal σ is not equal privacy (docs/alignment.md)."""
    from privalign.alignment.simulation import MethodSpec
    from privalign.cli.select import parse_floats
    from privalign.experiments.matching import calibrate_worst

    specs = []
    for b in parse_floats(args.beta, "beta"):
        if args.sigma_x is None:
            for e in _epsilons(args.epsilon):
                m = calibrate_worst(
                    e, args.delta, 2**k, beta=b, r_max=r_max, sensitivity=r_max, L=args.L, rtol=1e-6
                )
                label = f"PrivITP β={b:g} ε_max={e:g} (σ={m['sigma_x']:.3g})"
                specs.append(
                    MethodSpec(
                        "privitp", beta=b, sigma_x=m["sigma_x"], L=args.L, delta=args.delta, label=label
                    )
                )
            continue
        for sx in parse_floats(args.sigma_x, "sigma_x"):
            for sz in parse_floats(args.sigma_x if args.sigma_z is None else args.sigma_z, "sigma_z"):
                specs.append(
                    MethodSpec("privitp", beta=b, sigma_x=sx, sigma_z=sz, L=args.L, delta=args.delta)
                )
    return specs


def _specs(args, k: int, r_max: float):
    from privalign.alignment.simulation import MethodSpec
    from privalign.cli.select import parse_floats

    specs = []
    for m in _methods(args):
        if m == "bon":
            specs.append(MethodSpec("bon"))
        elif m == "itp":
            specs += [MethodSpec("itp", beta=b) for b in parse_floats(args.beta, "beta")]
        elif m == "privbon":
            if args.sigma_gumbel:
                specs += [
                    MethodSpec("privbon", sigma=s)
                    for s in _finite_sweep(args.sigma_gumbel, "sigma_gumbel", "a finite σ ≥ 0")
                ]
            else:
                specs += [MethodSpec("privbon", epsilon=e) for e in _epsilons(args.epsilon)]
        else:
            specs += _privitp_specs(args, k, r_max)
    return specs


def _finite_sweep(text: str, name: str, what: str, if_infinite: str = "") -> list[float]:
    """A comma-separated sweep of finite numbers: ``inf``, ``nan`` and overflowing literals (``1e400``) are
    refused naming the option and the value as typed (the range is the selector's check)."""
    import math

    from privalign.cli.select import parse_floats
    from privalign.errors import PrivacyParameterError

    vals = parse_floats(text, name)
    tokens = [x.strip() for x in text.split(",") if x.strip()]
    for tok, v in zip(tokens, vals, strict=True):
        if not math.isfinite(v):
            flag = "--" + name.replace("_", "-")
            over = (
                ""
                if tok.lstrip("+-").lower() in ("inf", "infinity") or math.isnan(v)
                else f" (overflows to {v})"
            )
            raise PrivacyParameterError(
                f"argument {flag}: every value must be {what}, got {tok!r}{over} in {text!r}"
                + (f"; {if_infinite}" if v > 0 and if_infinite else "")
            )
    return vals


def _epsilons(text: str) -> list[float]:
    """The --epsilon sweep: finite values only (ε = ∞ is no privacy; the non-private curve is asked for by
    name, --methods bon or --sigma-gumbel 0)."""
    from privalign.cli._args import INFINITE_EPSILON

    return _finite_sweep(
        text,
        "epsilon",
        "a finite ε > 0",
        f"{INFINITE_EPSILON}: the non-private reference curve is --methods bon (or --sigma-gumbel 0)",
    )


def _check_max_n(args, pool, specs, k: int) -> None:
    """With --max-log2-n given: every prompt has the candidates N = 2^k needs, or --skip-short (the engine's
    message would name its parameters 'n_grid' and 'skip_short')."""
    from privalign.alignment.selectors import pool_size
    from privalign.errors import PrivacyParameterError

    need = max(pool_size(s.kind, 2**k, fallback_candidate=False) for s in specs)
    short = int((pool.counts < need).sum())
    if short and not args.skip_short:
        raise PrivacyParameterError(
            f"argument --max-log2-n: N = 2^{k} needs {need} candidates per prompt"
            f"{' (two pools for itp/privitp)' if need != 2**k else ''}; {short} prompt(s) have fewer "
            f"(smallest: {int(pool.counts.min())}). Lower --max-log2-n, or pass --skip-short to skip those "
            "prompts."
        )


def _synthetic(text: str) -> tuple[int, int]:
    from privalign.errors import PrivacyParameterError

    parts = [x.strip() for x in text.split(",")]
    try:
        p, c = (int(x) for x in parts)
        if p < 1 or c < 1:
            raise ValueError
    except ValueError:
        raise PrivacyParameterError(
            "argument --synthetic: must be PROMPTS,CANDIDATES (two positive integers, e.g. 20,512), "
            f"got {text!r}"
        ) from None
    return p, c


def _max_log2_n(args, pool) -> int:
    """The largest k with 2^k (2·2^k for the two-pool ITP and PrivITP) candidates in every prompt, at most 12
    (the authors' N grid)."""
    import math

    from privalign.alignment.selectors import TWO_POOL_METHODS
    from privalign.errors import PrivacyParameterError

    if args.max_log2_n is not None:
        return args.max_log2_n
    two = any(m.strip() in TWO_POOL_METHODS for m in args.methods.split(","))  # ITP too, not only PrivITP
    smallest = int(pool.counts.min())
    usable = smallest // 2 if two else smallest
    if usable < 1:
        raise PrivacyParameterError(
            f"The pool's smallest prompt has {smallest} candidate(s): too few for --methods {args.methods}."
        )
    return min(12, int(math.floor(math.log2(usable))))


def _run(args) -> int:
    import sys

    import numpy as np
    from threadpoolctl import threadpool_limits

    from privalign.alignment.figures import needs_matplotlib, plot_results, preload_matplotlib
    from privalign.alignment.simulation import prepare_scores, run_protocol, write_results
    from privalign.cli._args import check_out_dir
    from privalign.cli.select import parse_floats
    from privalign.data.pool_cache import read_scored_pool
    from privalign.data.pools import ReadStats, ScoredPool
    from privalign.errors import PrivacyParameterError

    check_out_dir(args.out)
    _check_unused(args)
    if args.pdf and args.figure_backend == "pillow":
        raise PrivacyParameterError(
            "argument --figure-backend: 'pillow' draws PNG only; with --pdf use 'auto' or 'matplotlib'"
        )
    stats = ReadStats()
    if args.pool:
        pool = (
            ScoredPool.read(args.pool, stats=stats)
            if args.no_pool_cache
            else read_scored_pool(args.pool, stats=stats)
        )
        if stats.describe():
            print(f"privalign simulate: note: reading {args.pool}: {stats.describe()}", file=sys.stderr)
    else:
        from privalign.alignment.synthetic import make_synthetic_pool

        _check_sizes(args)
        p, c = _synthetic(args.synthetic)
        pool = make_synthetic_pool(p, c, random_state=args.seed)
    _check_sizes(args, pool)
    rng_ = parse_floats(args.score_range, "score_range")
    if len(rng_) != 2 or not rng_[0] < rng_[1]:
        raise PrivacyParameterError(
            f"argument --score-range: must be LOW,HIGH with LOW < HIGH, got {args.score_range!r}"
        )
    lo, hi = rng_
    k = _max_log2_n(args, pool)
    z, _, _ = prepare_scores(pool, transform=args.transform, score_range=(lo, hi))
    finite = np.isfinite(z)
    n_clip = int(np.sum(finite & ((z < lo) | (z > hi))))
    clipped_fraction = n_clip / max(1, int(finite.sum()))
    if n_clip:
        print(
            f"privalign simulate: note: {n_clip} of {int(finite.sum())} scores "
            f"({100 * clipped_fraction:.2f}%) lie outside "
            f"--score-range {lo:g},{hi:g} (after --transform {args.transform}) "
            "and are clipped for the bounded-score methods",
            file=sys.stderr,
        )
    specs = _specs(args, k, hi - lo)
    _check_max_n(args, pool, specs, k)
    formats = ("png", "pdf") if args.pdf else ("png",)
    # matplotlib (PDF, or --figure-backend matplotlib) is imported in a thread while the engine runs
    preloading = preload_matplotlib() if needs_matplotlib(formats, args.figure_backend) else None
    try:
        # BLAS on one thread while the engine runs: its matrix products are small (one prompt's nodes ×
        # replicates × one block), so more BLAS threads only spin-wait between them and burn CPU. The results
        # do not depend on the thread count (tests/alignment/test_alignment_pinned.py).
        with threadpool_limits(limits=1, user_api="blas"):
            res = run_protocol(
                pool,
                specs,
                n_grid=[2**i for i in range(k + 1)],
                replicates=args.replicates,
                random_state=args.seed,
                transform=args.transform,
                score_range=(lo, hi),
                skip_short=args.skip_short,
                progress=not args.no_progress,
            )
    finally:
        if preloading is not None:
            preloading.join()  # never leave an import running in a thread (also on errors)
    path = write_results(res, args.out)
    figs = plot_results(res, args.out, formats=formats, backend=args.figure_backend)
    summary = {
        "results": str(path),
        "figures": [str(f) for f in figs],
        "n_prompts": res["n_prompts"],
        "skipped_prompts": res["skipped_prompts"],
        "seconds": res["seconds"],
        "max_n": 2**k,
        "transform": args.transform,
        "score_range": [lo, hi],
        "clipped_fraction": clipped_fraction,
        "pool_read": stats.to_dict() if args.pool else None,
        "methods": [
            {"name": m["name"], "true_lift_at_max_n": m["true_lift"][-1], "privacy": m["privacy"]}
            for m in res["methods"]
        ],
    }
    if args.json:
        emit_json(summary)
    else:
        print(
            f"true-reward lift at N={2**k} (mean true reward of the selection minus the base policy's, "
            "in the pool's true-reward units) and privacy per query:"
        )
        for m in summary["methods"]:
            print(f"  {m['name']:<44s} {m['true_lift_at_max_n']:+.4f}   {_privacy_words(m['privacy'])}")
        print(f"wrote {path} and {len(figs)} figure files")
    return 0


def _privacy_words(privacy: dict) -> str:
    """One method's privacy in words: "not private", "ε = 4 (pure DP)", "ε ≤ 4 (worst case at δ = 1e-06)"."""
    import math

    if privacy.get("guarantee") == "none":
        return "not private"
    if "epsilon_max" in privacy:  # PrivITP: worst case at the largest N (the realized cost is often lower)
        eps = (
            privacy["epsilon_max"][-1] if isinstance(privacy["epsilon_max"], list) else privacy["epsilon_max"]
        )
        return f"ε ≤ {eps:.3g} (worst case, at δ = {privacy['delta']:g})"
    eps = privacy.get("epsilon", math.inf)
    return f"ε = {eps:.3g} (pure DP)"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="evaluation protocol (N = 2^0..2^k) on a scored pool",
        description="Run BoN/ITP/PrivBoN/PrivITP with exact selection laws on a scored pool "
        "and write results.json plus PNG figures (and PDF with --pdf) into --out. "
        "A pool file is parsed once into a columnar cache (<user cache>/pools, "
        "memory-mapped, rebuilt when the file changes). Defaults follow the "
        "authors' protocol (docs/alignment.md): rewards z-normalised over the whole "
        "pool, 50 replicates, N up to the largest power of two the pool supports "
        "(at most 2^12); scores outside --score-range are clipped for the "
        "bounded-score methods and the count is printed. By default PrivBoN (ε = 4) and PrivITP (σ "
        "calibrated to the same worst-case ε) run at equal privacy; an option that no listed method reads is "
        "refused. The printed lift is in the pool's true-reward units.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--pool", help="scored-pool JSONL(.gz) file")
    src.add_argument(
        "--synthetic",
        help="PROMPTS,CANDIDATES (e.g. 20,512; their product at most 2^26): use a synthetic pool instead",
    )
    p.add_argument(
        "--methods",
        default="bon,itp,privbon,privitp",
        help="comma-separated methods (bon, itp, privbon, privitp)",
    )
    p.add_argument(
        "--beta", default=None, help="β values (comma-separated sweep) for itp/privitp (default 0.05)"
    )
    p.add_argument(
        "--epsilon",
        default=None,
        help="PrivBoN ε values (comma-separated sweep), each finite and > 0 (default 4; the non-private "
        "reference is --methods bon); without --sigma-x, also PrivITP's worst-case ε, so that both run at "
        "equal privacy",
    )
    p.add_argument(
        "--sigma-gumbel",
        default=None,
        help="PrivBoN Gumbel scales σ ≥ 0 instead of ε (sweep; σ = 0 is plain BoN, reported as non-private)",
    )
    p.add_argument(
        "--sigma-x",
        default=None,
        help="PrivITP σ_X values (sweep); default: σ_X = σ_Z calibrated so that PrivITP's worst-case ε at "
        "--delta and the largest N equals each --epsilon (equal privacy with PrivBoN)",
    )
    p.add_argument("--sigma-z", default=None, help="PrivITP σ_Z values (default: = σ_X; needs --sigma-x)")
    p.add_argument(
        "--L", type=float, default=None, help="PrivITP envelope widening (units of σ_Z; default 3)"
    )
    p.add_argument("--delta", type=float, default=None, help="PrivITP δ (default 1e-6)")
    p.add_argument(
        "--max-log2-n",
        type=nonneg_int,
        default=None,
        help="largest N is 2^k (default: the largest the pool supports, at most 12)",
    )
    p.add_argument(
        "--replicates",
        type=int,
        default=50,
        help="replicates per (prompt, N) (default 50; replicates × candidates per prompt at most 2^25)",
    )
    p.add_argument(
        "--transform",
        choices=["none", "global_z"],
        default="global_z",
        help="reward normalisation (default global_z: z-scores over all responses, as the authors do)",
    )
    p.add_argument(
        "--score-range",
        default="-4,4",
        help="public clipping range LOW,HIGH after the transform (default -4,4; e.g. --score-range -4,16)",
    )
    p.add_argument("--skip-short", action="store_true", help="skip prompts with too few candidates")
    p.add_argument(
        "--seed", type=int, default=0, help="SeedSequence entropy, a non-negative integer (default 0)"
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--pdf", action="store_true", help="also write each figure as PDF (default: PNG only)")
    p.add_argument(
        "--figure-backend",
        choices=("auto", "pillow", "matplotlib"),
        default="auto",
        help="who draws the figures: auto (default) = Pillow for PNG (no matplotlib import; fast), "
        "matplotlib for PDF; pillow = PNG only; matplotlib = matplotlib's look for PNG too",
    )
    p.add_argument(
        "--no-pool-cache",
        action="store_true",
        help="parse the pool file every time instead of using the columnar cache in the user cache "
        "directory ($PRIVALIGN_CACHE_DIR, else $XDG_CACHE_HOME/privalign, else ~/.cache/privalign)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    p.set_defaults(func=_run)
