"""``privalign simulate``: the authors' evaluation protocol on a scored pool → results.json + PNG figures
(PDF too with ``--pdf``)."""

from __future__ import annotations

from dataclasses import dataclass

from privalign._validation import EPSILON_RULE, parse_floats
from privalign.cli._args import INFINITE_EPSILON, emit_json, nonneg_int
from privalign.cli._methods import (
    FLAGS,
    add_param_option,
    finite_sweep,
    given_options,
    option_of,
    product,
)
from privalign.errors import PrivacyParameterError

__all__ = ["register"]


# Size limits: the engine holds one (replicates × candidates) permutation per prompt and the synthetic pool
# two (prompts × candidates) float arrays; beyond these it failed with a MemoryError instead of a message.
MAX_SYNTHETIC_SCORES = 2**26  # PROMPTS × CANDIDATES of --synthetic (67,108,864 scores, 0.5 GiB per array)
MAX_REPLICATE_DRAWS = 2**25  # --replicates × the widest prompt's candidates (33,554,432; 256 MiB per prompt)

#: The authors' protocol's values for what the command line leaves out (a parameter's own default otherwise).
_CLI_DEFAULTS = {"beta": "0.05", "epsilon": "4"}
#: Sweeps whose values must be finite, with the message's words.
_FINITE = {
    "epsilon": (
        EPSILON_RULE,
        f"{INFINITE_EPSILON}: the non-private reference curve is --methods bon (or --sigma-gumbel 0)",
    ),
    "sigma": ("a finite σ ≥ 0", ""),
}


def _methods(args) -> list[str]:
    from privalign.alignment.selectors import methods as known
    from privalign.errors import PrivacyParameterError

    names = ", ".join(known())
    methods = [x.strip() for x in args.methods.split(",") if x.strip()]
    for m in methods:
        if m not in known():
            raise PrivacyParameterError(f"The '--methods' option must list {names}. Got {m!r} instead.")
    if not methods:  # the engine would call it 'specs'
        raise PrivacyParameterError(
            f"The '--methods' option must list at least one of {names}. Got {args.methods!r} instead."
        )
    return methods


@dataclass(frozen=True)
class _Reads:
    """What one listed method reads from the command line: its sweeps (parameter → text or value) and
    whether its noise is calibrated to each --epsilon (PrivITP without --sigma-x)."""

    method: str
    sweeps: dict
    calibrate: bool


def _reads(args, methods: list[str]) -> list[_Reads]:
    """Each method's options, checked once before anything is read: an option that no listed method reads
    is refused, not ignored (as ``select`` does): e.g. ``--methods bon --epsilon 2`` would otherwise draw a
    non-private curve though ε = 2 was asked for."""
    from privalign.alignment.selectors import method_class

    given = given_options(args)
    out, used, excluded_by = [], set(), {}
    for m in methods:
        kind = method_class(m)
        declared = {p.name: p for p in kind.params}
        mine = {k: v for k, v in given.items() if k in declared}
        excluded = {x: g for g in mine for x in declared[g].excludes}
        excluded_by.update(excluded)
        mine = {k: v for k, v in mine.items() if k not in excluded}
        cal = kind.calibrated_params
        calibrate = bool(cal) and cal[0] not in mine
        if calibrate and any(c in mine for c in cal[1:]):
            other = option_of(next(c for c in cal[1:] if c in mine))
            raise PrivacyParameterError(
                f"argument {other}: needs {option_of(cal[0])} (without them {kind.label}'s noise is "
                f"calibrated so that its worst-case ε equals --epsilon); give {option_of(cal[0])} too or "
                f"drop {other}"
            )
        sweeps = dict(mine)
        for name, default in _CLI_DEFAULTS.items():
            if name in declared and name not in excluded and name not in sweeps:
                sweeps[name] = default
        if calibrate:
            sweeps["epsilon"] = given.get("epsilon", _CLI_DEFAULTS["epsilon"])  # last: per β, each ε
        used |= set(mine) | ({"epsilon"} if calibrate else set())
        out.append(_Reads(m, sweeps, calibrate))
    _refuse_unused(args, given, used, excluded_by)
    return out


def _refuse_unused(args, given: dict, used: set, excluded_by: dict) -> None:
    from privalign.alignment.selectors import method_class, methods

    for name in given:
        if name in used:
            continue
        opt = option_of(name)
        if name in excluded_by:
            raise PrivacyParameterError(
                f"argument {opt}: not used with {option_of(excluded_by[name])} (the method is then given by "
                "it); drop one of them"
            )
        readers = [m for m in methods() if name in {p.name for p in method_class(m).params}]
        readers += [
            f"{m} without {option_of(method_class(m).calibrated_params[0])}"
            for m in methods()
            if name == "epsilon" and method_class(m).calibrated_params
        ]
        raise PrivacyParameterError(
            f"argument {opt}: not used by --methods {args.methods} (it is read by {', '.join(readers)}); "
            f"drop {opt} or add a method that reads it"
        )


def _values(name: str, value) -> list:
    if not isinstance(value, str):
        return [value]
    dest = FLAGS.get(name, name)
    if name in _FINITE:
        vals = finite_sweep(value, dest, *_FINITE[name])
        if name == "epsilon":  # the one ε rule, as every --epsilon (privalign._validation.EPS_MIN/EPS_MAX)
            from privalign._validation import epsilon_problem
            from privalign.cli._methods import flag

            for v in vals:
                why = epsilon_problem(v)
                if why is not None:
                    raise PrivacyParameterError(
                        f"argument {flag(dest)}: every value must be {EPSILON_RULE}, got {v!r} in {value!r}; "
                        + why
                    )
        return vals
    return parse_floats(value, dest)


def _specs(reads: list[_Reads], k: int, r_max: float) -> list:
    """The curves: every combination of each method's sweeps. A calibrated method's noise makes its
    worst-case ε at the largest N = 2^k, at --delta, equal each --epsilon: the privacy of the PrivBoN curve
    beside it (at smaller N it is lower). Equal σ is not equal privacy (docs/alignment.md)."""
    from privalign.alignment.selectors import SelectorSpec, method_class
    from privalign.alignment.simulation import MethodSpec

    specs = []
    for r in reads:
        kind = method_class(r.method)
        for combo in product({name: _values(name, v) for name, v in r.sweeps.items()}):
            label = None
            if r.calibrate:
                eps = combo.pop("epsilon")
                base = SelectorSpec.of(r.method, **combo).resolved()
                combo.update(kind.calibrate(eps, 2**k, base, r_max=r_max, sensitivity=r_max))
                shown = {
                    n: float(f"{v:.3g}") for n, v in SelectorSpec.of(r.method, **combo).resolved().items()
                }
                label = f"{kind.describe(shown)} at worst-case ε_max={eps:g}"
            specs.append(MethodSpec.from_spec(SelectorSpec.of(r.method, **combo), label=label))
    return specs


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


def _check_max_n(args, pool, methods: list[str], k: int) -> None:
    """With --max-log2-n given: every prompt has the candidates N = 2^k needs, or --skip-short (the engine's
    message would name its parameters 'n_grid' and 'skip_short'); and some prompt has them, even with
    --skip-short. Checked before any noise is calibrated to the largest N (that calibration failed first,
    naming --epsilon, for an N no prompt holds)."""
    from privalign.alignment.selectors import pool_size
    from privalign.errors import PrivacyParameterError

    need = max(pool_size(m, 2**k, fallback_candidate=False) for m in methods)
    widest = int(pool.counts.max()) if pool.counts.size else 0
    if widest < need:
        raise PrivacyParameterError(
            f"argument --max-log2-n: N = 2^{k} needs {need} candidates per prompt"
            f"{' (two pools)' if need != 2**k else ''}; the pool's widest prompt has {widest}, so "
            "--skip-short would skip every prompt. Lower --max-log2-n."
        )
    short = int((pool.counts < need).sum())
    if short and not args.skip_short:
        raise PrivacyParameterError(
            f"argument --max-log2-n: N = 2^{k} needs {need} candidates per prompt"
            f"{' (two pools)' if need != 2**k else ''}; {short} prompt(s) have fewer "
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


def _max_log2_n(args, pool, methods: list[str]) -> int:
    """The largest k with 2^k (2·2^k for the two-pool ITP and PrivITP) candidates in every prompt, at most 12
    (the authors' N grid)."""
    import math

    from privalign.alignment.selectors import method_class

    if args.max_log2_n is not None:
        return args.max_log2_n
    pools = max(method_class(m).layout.pools for m in methods)  # ITP too, not only PrivITP
    smallest = int(pool.counts.min())
    usable = smallest // pools
    if usable < 1:
        raise PrivacyParameterError(
            f"The pool's smallest prompt has {smallest} candidate(s): too few for --methods {args.methods}."
        )
    return min(12, int(math.floor(math.log2(usable))))


def _read_pool(args):
    """The pool (``--pool``, through the columnar cache unless ``--no-pool-cache``, or ``--synthetic``) and
    what reading it found."""
    import sys

    from privalign.data.pool_cache import read_scored_pool
    from privalign.data.pools import ReadStats, ScoredPool

    stats = ReadStats()
    if not args.pool:
        from privalign.alignment.synthetic import make_synthetic_pool

        _check_sizes(args)
        p, c = _synthetic(args.synthetic)
        return make_synthetic_pool(p, c, random_state=args.seed), None
    read = ScoredPool.read if args.no_pool_cache else read_scored_pool
    pool = read(args.pool, stats=stats)
    if stats.describe():
        print(f"privalign simulate: note: reading {args.pool}: {stats.describe()}", file=sys.stderr)
    return pool, stats


def _score_range(args) -> tuple[float, float]:
    rng_ = parse_floats(args.score_range, "score_range")
    if len(rng_) != 2 or not rng_[0] < rng_[1]:
        raise PrivacyParameterError(
            f"argument --score-range: must be LOW,HIGH with LOW < HIGH, got {args.score_range!r}"
        )
    return rng_[0], rng_[1]


def _run(args) -> int:
    import sys

    from privalign.alignment.simulation import simulate
    from privalign.paths import check_out_dir

    check_out_dir(args.out)
    reads = _reads(args, _methods(args))
    if args.pdf and args.figure_backend == "pillow":
        raise PrivacyParameterError(
            "argument --figure-backend: 'pillow' draws PNG only; with --pdf use 'auto' or 'matplotlib'"
        )
    pool, stats = _read_pool(args)
    _check_sizes(args, pool)
    lo, hi = _score_range(args)
    k = _max_log2_n(args, pool, [r.method for r in reads])
    _check_max_n(args, pool, [r.method for r in reads], k)
    specs = _specs(reads, k, hi - lo)
    report = simulate(
        pool,
        specs,
        n_grid=[2**i for i in range(k + 1)],
        out=args.out,
        formats=("png", "pdf") if args.pdf else ("png",),
        figure_backend=args.figure_backend,
        replicates=args.replicates,
        random_state=args.seed,
        transform=args.transform,
        score_range=(lo, hi),
        skip_short=args.skip_short,
        progress=not args.no_progress,
    )
    if report.clipped_scores:
        print(
            f"privalign simulate: note: {report.clipped_scores} scores "
            f"({100 * report.clipped_fraction:.2f}%) "
            f"lie outside --score-range {lo:g},{hi:g} (after --transform {args.transform}) and are clipped "
            "for the bounded-score methods",
            file=sys.stderr,
        )
    summary = {**report.summary(), "pool_read": None if stats is None else stats.to_dict()}
    if args.json:
        emit_json(summary)
        return 0
    print(
        f"true-reward lift at N={2**k} (mean true reward of the selection minus the base policy's, "
        "in the pool's true-reward units) and privacy per query:"
    )
    for m in summary["methods"]:
        print(f"  {m['name']:<44s} {m['true_lift_at_max_n']:+.4f}   {_privacy_words(m['privacy'])}")
    print(f"wrote {report.results_path} and {len(report.figures)} figure files")
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
        help="comma-separated methods (bon, itp, privbon, privitp, or a registered one)",
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
    add_param_option(p, sweep=True)
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
