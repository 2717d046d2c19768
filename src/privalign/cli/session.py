"""``privalign session``: serve a pool's prompts under a privacy budget (reserve → settle)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["register"]

#: The CLI's defaults of the method parameters left out (PrivBoN's ε = 1). PrivITP's σ_X, when left out, is
#: R_max: 1 in units of the public score range, whatever the range (see ``_run``).
_DEFAULTS = {"beta": 0.05, "L": 3.0, "delta": 1e-6, "epsilon": 1.0}


def _spec(args):
    """The method's spec from its options (the defaults above for the ones left out): an option the method
    does not read is refused, not ignored (as ``select`` and ``simulate`` do)."""
    from privalign.alignment.selectors import SelectorSpec, method_class, methods
    from privalign.cli._methods import given_options, option_of
    from privalign.errors import PrivacyParameterError

    declared = {p.name for p in method_class(args.method).params}
    given = given_options(args)
    for name, value in given.items():
        if name not in declared:
            opt = option_of(name)
            others = [m for m in _private_methods() if name in {p.name for p in method_class(m).params}]
            raise PrivacyParameterError(
                f"argument {opt}: not used by --method {args.method} (got {value!r}); drop {opt}"
                + (f" or use --method {' or '.join(others)}" if others else "")
            )
    if args.score_range is not None and args.r_max is not None:
        raise PrivacyParameterError(
            "argument --r-max: not used with --score-range (the range is then [0, HIGH - LOW]); drop one"
        )
    assert args.method in methods()  # argparse's choices
    return SelectorSpec.of(args.method, **{**{k: v for k, v in _DEFAULTS.items() if k in declared}, **given})


def _private_methods() -> list[str]:
    from privalign.alignment.selectors import method_class, methods

    return [m for m in methods() if method_class(m).private]


def _use_declared_range(args) -> None:
    """No --score-range, --r-max or --clip: take the public score range the pool's manifest declares
    (``proxy_score_range``, e.g. [-4, 4] for the shipped HH pools' unbounded Bradley-Terry proxy), and say
    so on stderr."""
    import sys

    from privalign.data.pools import declared_score_range, pool_manifest_path

    if args.score_range is not None or args.r_max is not None or args.clip:
        return
    declared = declared_score_range(args.pool)
    if declared is not None:
        low, high, _why = declared
        args.score_range = f"{low!r},{high!r}"
        args.score_range_source = str(pool_manifest_path(args.pool))
        print(
            f"privalign session: note: public score range [{low:g}, {high:g}] declared in "
            f"{args.score_range_source}: scores clipped into it, R_max = {high - low:g} (--score-range to "
            "choose another)",
            file=sys.stderr,
        )


def _public_range(args, pool):
    """The pool with its proxy scores in the public range the selectors assume, ``[0, R_max]``.

    With ``--score-range LOW,HIGH`` (a public bound of the reward model, chosen without looking at the
    scores): every score clipped into it and shifted by ``-LOW``, so ``R_max = HIGH - LOW``; a
    data-independent map, which keeps the guarantee. Without it, ``--r-max`` (default 1) and scores outside
    ``[0, R_max]`` are refused here (unless ``--clip``) in one line that says what to give, not after the
    first prompts."""
    import numpy as np

    from privalign.cli._methods import parse_floats
    from privalign.data.pools import ScoredPool
    from privalign.errors import PrivacyParameterError

    _use_declared_range(args)
    if args.score_range is not None:
        rng_ = parse_floats(args.score_range, "score_range")
        if len(rng_) != 2 or not rng_[0] < rng_[1] or not all(np.isfinite(rng_)):
            raise PrivacyParameterError(
                f"argument --score-range: must be LOW,HIGH (finite, LOW < HIGH), got {args.score_range!r}"
            )
        lo, hi = rng_
        args.r_max = hi - lo
        proxy = np.clip(pool.proxy, lo, hi) - lo  # (NaN padding stays NaN)
        return ScoredPool(proxy, pool.true, pool.counts, pool.prompts)
    if args.r_max is None:
        args.r_max = 1.0
    vals = pool.proxy[np.isfinite(pool.proxy)]
    if not args.clip and vals.size and (vals.min() < 0.0 or vals.max() > args.r_max):
        raise PrivacyParameterError(
            f"argument --r-max: the pool's proxy scores do not all lie in the public range "
            f"[0, {args.r_max:g}] (the values are private: not shown). Give the reward model's public range, "
            "chosen without looking at the scores: --score-range LOW,HIGH (scores clipped into it; for an "
            "unbounded reward such as the linear Bradley-Terry proxy of the shipped HH pools), or --r-max "
            "R_MAX for scores in [0, R_MAX], or --clip to clip into [0, R_MAX]"
        )
    return pool


def _run(args) -> int:
    import sys

    import numpy as np

    from privalign._validation import check_real
    from privalign.alignment.session import serve_pool
    from privalign.cli._args import check_out_dir
    from privalign.cli.select import _clean
    from privalign.data.pools import ReadStats, ScoredPool

    check_out_dir(args.out)
    spec = _spec(args)
    # The budgets are checked here, under their own names: the filters would call them 'epsilon'/'delta',
    # which are other options of this command (the per-query ε, the per-prompt δ).
    check_real(args.budget_epsilon, "budget_epsilon", low=0.0, closed="neither")
    # (privbon converts zCDP to (ε, δ) at δ = --budget-delta, which needs δ > 0)
    zcdp = spec.kind.accounting == "pure" and not args.secure
    check_real(args.budget_delta, "budget_delta", low=0.0, high=1.0, closed="neither" if zcdp else "left")
    stats = ReadStats()
    pool = ScoredPool.read(args.pool, stats=stats)
    if stats.describe():
        print(f"privalign session: note: reading {args.pool}: {stats.describe()}", file=sys.stderr)
    if args.shuffle_seed is not None:
        order = np.random.default_rng(args.shuffle_seed).permutation(pool.proxy.shape[0])
        pool = ScoredPool(
            pool.proxy[order],
            pool.true[order],
            pool.counts[order],
            tuple(pool.prompts[i] for i in order) if pool.prompts else (),
        )
    pool = _public_range(args, pool)
    if args.n is None:  # the largest n ≤ 16 that every prompt supports (2n + 1 candidates for privitp)
        smallest = int(pool.counts.min()) if pool.counts.size else 0
        args.n = max([1] + [n for n in range(1, 17) if spec.kind.candidates_needed(n) <= smallest])
    if "sigma_x" in {p.name for p in spec.kind.params} and spec.get("sigma_x") is None:
        from privalign.alignment.selectors import SelectorSpec

        spec = SelectorSpec.of(spec.method, **{**spec.as_dict(), "sigma_x": args.r_max})
    sel = spec.build(r_max=args.r_max, sensitivity=args.sensitivity, clip=args.clip)
    out = serve_pool(
        pool,
        sel,
        budget_epsilon=args.budget_epsilon,
        budget_delta=args.budget_delta,
        n=args.n,
        seed=args.seed,
        secure=args.secure,
        principal=args.principal,
        max_prompts=args.max_prompts,
        progress=not args.no_progress,
    )
    out["pool_read"] = stats.to_dict()
    if getattr(args, "score_range_source", None):  # the range came from the pool's manifest
        out["score_range"] = {"range": args.score_range, "declared_in": args.score_range_source}
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "session.json").write_text(json.dumps(_clean(out), indent=2, allow_nan=False))
    summary = {k: v for k, v in out.items() if k != "per_prompt"}
    for k in ("pure", "zcdp"):
        if k in summary:
            summary[k] = {kk: vv for kk, vv in summary[k].items() if kk != "per_prompt"}
    if args.json:
        print(json.dumps(_clean(summary), allow_nan=False))
    else:
        _print_summary(out, outdir / "session.json", args)
    parts = [("", out)] + [
        (f" by the {name} filter", out[k]) for k, name in (("pure", "pure-ε"), ("zcdp", "zCDP")) if k in out
    ]
    for label, part in parts:
        served, base, got = (
            part.get("prompts_served"),
            part.get("base_true_reward"),
            part.get("mean_true_reward"),
        )
        if served == 0:
            delta = f", delta = {spec.get('delta'):g}" if spec.get("delta") is not None else ""
            print(
                f"privalign session: note: no prompt was served{label}: one prompt's worst-case cost "
                f"(epsilon_max = {part.get('epsilon_max', float('nan')):.3g}{delta}) does not fit the budget "
                f"(--budget-epsilon {args.budget_epsilon:g}, --budget-delta {args.budget_delta:g}); raise "
                "the budget or the noise",
                file=sys.stderr,
            )
        elif got is not None and base is not None and got == got and got < base:
            print(
                f"privalign session: note: mean true reward {got:.4f} is below the base policy's {base:.4f}: "
                f"at these settings the noise dominates the scores (scores in [0, {args.r_max:g}]); lower "
                "the noise (--sigma-x/--sigma-z, or a larger --epsilon) for useful selections",
                file=sys.stderr,
            )
    return 0


def _print_summary(out: dict, path: Path, args) -> None:
    """A few lines for a person (the full record is session.json; --json prints it without per_prompt)."""
    parts = [(out.get("filter", ""), out)]
    if "pure" in out:
        parts = [("pure-ε filter", out["pure"]), ("zCDP filter", out["zcdp"])]
    print(f"privalign session: {out['method']} on {args.pool}, budget ε = {args.budget_epsilon:g}")
    for name, part in parts:
        served, refused = part.get("prompts_served", 0), part.get("prompts_refused", 0)
        got, base = part.get("mean_true_reward"), part.get("base_true_reward")
        reward = (
            f"; mean true reward {got:.4f} (base policy {base:.4f})"
            if got is not None and base is not None and got == got
            else ""
        )
        print(
            f"  {name}: served {served} of {served + refused} prompts, spent ε = "
            f"{part.get('realized_epsilon', float('nan')):.4g} (worst case per prompt "
            f"{part.get('epsilon_max', float('nan')):.4g}){reward}"
        )
    print(f"  wrote {path} (add --json for the summary as JSON)")


def register(subparsers) -> None:
    from privalign.cli._args import INFINITE_EPSILON, finite_float, pos_int

    p = subparsers.add_parser(
        "session",
        help="serve a pool's prompts under a privacy budget",
        description="Process a scored pool prompt by prompt through PrivITP (ex-post filter) "
        "or PrivBoN (pure-ε and zCDP filters): reserve the worst case, run, "
        "settle the realized cost. Writes session.json into --out. Options the method does not read are "
        "refused; scores outside the public range are refused unless --clip or --score-range (default: the "
        "range the pool's manifest declares, if any: the shipped HH pools declare -4,4).",
    )
    p.add_argument("--pool", required=True, help="scored-pool JSONL(.gz) file")
    from privalign.alignment.selectors import method_class, methods

    p.add_argument(
        "--method",
        choices=[m for m in methods() if method_class(m).private],
        default="privitp",
        help="privitp (ex-post filter, default) or privbon (pure-ε and zCDP filters compared)",
    )
    p.add_argument("--budget-epsilon", type=float, required=True, help="total ε budget")
    p.add_argument(
        "--budget-delta",
        type=float,
        default=1e-3,
        help="total δ budget (and the zCDP conversion δ; default 1e-3)",
    )
    p.add_argument(
        "--n",
        type=int,
        default=None,
        help="candidates per pool (default: 16, or the largest n the pool's smallest prompt supports: n "
        "candidates for privbon, 2n + 1 for privitp)",
    )
    p.add_argument("--beta", type=float, default=None, help="PrivITP β > 0 (default 0.05)")
    p.add_argument(
        "--sigma-x",
        type=float,
        default=None,
        help="PrivITP phase-1 noise σ_X (default R_max: 1 with the default range [0, 1], 8 with the shipped "
        "HH pools' declared [-4, 4]; heavy noise: raise --budget-epsilon or lower σ for useful selections)",
    )
    p.add_argument("--sigma-z", type=float, default=None, help="default: = σ_X")
    p.add_argument(
        "--L", type=float, default=None, help="PrivITP envelope widening in units of σ_Z (default 3)"
    )
    p.add_argument("--delta", type=float, default=None, help="PrivITP per-prompt δ (default 1e-6)")
    p.add_argument(
        "--epsilon",
        type=finite_float(
            "a finite ε > 0", if_infinite=f"{INFINITE_EPSILON}; a session serves private answers only"
        ),
        default=None,
        help="PrivBoN per-query ε, finite and > 0 (default 1)",
    )
    p.add_argument(
        "--r-max",
        type=float,
        default=None,
        help="public upper end of the score range [0, R_max] (default 1); scores outside it are refused "
        "unless --clip",
    )
    p.add_argument(
        "--score-range",
        default=None,
        metavar="LOW,HIGH",
        help="public range of the reward model's scores, chosen without looking at them (e.g. -4,4 for an "
        "unbounded linear reward): scores are clipped into it and shifted, R_max = HIGH - LOW",
    )
    p.add_argument("--sensitivity", type=float, default=None, help="public Δ_r (default R_max)")
    p.add_argument("--clip", action="store_true", help="clip scores into [0, R_max]")
    p.add_argument(
        "--principal", default="session", help="name of the budget holder in the filter (default 'session')"
    )
    p.add_argument(
        "--max-prompts", type=pos_int, default=None, help="process at most this many prompts (default: all)"
    )
    p.add_argument(
        "--shuffle-seed",
        type=int,
        default=None,
        help="shuffle prompt order with this seed (default: none, the file order)",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the (non-secure) noise, a non-negative integer (default 0)",
    )
    g.add_argument(
        "--secure", action="store_true", help="OS-entropy noise with OpenDP samplers (refuses seeds)"
    )
    p.add_argument("--out", required=True, help="output directory (session.json)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the summary as one JSON line (default: a few lines of text)",
    )
    p.set_defaults(func=_run)
