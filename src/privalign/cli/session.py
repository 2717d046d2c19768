"""``privalign session``: serve a pool's prompts under a privacy budget (reserve → settle).

The command parses the options, calls :func:`privalign.alignment.session.run_pool_session` (the workflow)
and prints; the method's options become its :class:`~privalign.alignment.selectors.SelectorSpec` here."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["register"]

#: The CLI's defaults of the method parameters left out (PrivBoN's ε = 1). PrivITP's σ_X, when left out, is
#: R_max: 1 in units of the public score range, whatever the range (see
#: :func:`privalign.alignment.session.run_pool_session`).
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
    assert args.method in methods()  # argparse's choices
    return SelectorSpec.of(args.method, **{**{k: v for k, v in _DEFAULTS.items() if k in declared}, **given})


def _private_methods() -> list[str]:
    from privalign.alignment.selectors import method_class, methods

    return [m for m in methods() if method_class(m).private]


def _run(args) -> int:
    from privalign._json import to_jsonable
    from privalign.alignment.session import PoolSessionOptions, run_pool_session
    from privalign.cli._args import warn
    from privalign.paths import check_out_dir

    check_out_dir(args.out)
    spec = _spec(args)
    opts = PoolSessionOptions(
        pool=args.pool,
        budget_epsilon=args.budget_epsilon,
        budget_delta=args.budget_delta,
        n=args.n,
        r_max=args.r_max,
        score_range=args.score_range,
        sensitivity=args.sensitivity,
        clip=args.clip,
        seed=args.seed,
        secure=args.secure,
        principal=args.principal,
        max_prompts=args.max_prompts,
        shuffle_seed=args.shuffle_seed,
        progress=not args.no_progress,
    )
    session = run_pool_session(opts, spec, note=lambda msg: warn("session", msg))
    path = session.write(args.out)
    if args.json:
        print(json.dumps(to_jsonable(session.summary()), allow_nan=False))
    else:
        _print_summary(session.record, path, args)
    for msg in session.notes():
        warn("session", msg)
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
    from privalign.cli._args import INFINITE_EPSILON, epsilon_float, pos_int

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
        type=epsilon_float(if_infinite=f"{INFINITE_EPSILON}; a session serves private answers only"),
        default=None,
        help="PrivBoN per-query ε, finite, in [1e-9, 700] (default 1)",
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
