"""``privalign law``: the exact selection probabilities and fallback mass of a selector."""

from __future__ import annotations

from privalign.cli._args import emit_json

__all__ = ["register"]


def _run(args) -> int:
    from privalign._validation import parse_floats
    from privalign.cli.select import build_selector

    sel = build_selector(args)
    a = parse_floats(args.scores, "scores")
    b = None if args.scores_b is None else parse_floats(args.scores_b, "scores_b")
    worst = sel.worst_case_event(len(b or a))  # first: it refuses parameters without a finite privacy cost
    law = sel.law(a, pool_b_scores=b)
    d = {"method": args.method, **law.to_dict(), "worst_case_event": worst.to_dict()}
    if args.json:
        emit_json(d)
    else:
        for i, p in enumerate(law.probabilities):
            print(f"{i}\t{p:.6g}")
        print(f"fallback\t{law.fallback:.6g}")
        if law.error_bound:
            print(f"error bound\t{law.error_bound:.3g}")
    return 0


def register(subparsers) -> None:
    from privalign.cli.select import add_selector_args

    p = subparsers.add_parser(
        "law",
        help="exact selection law of BoN, ITP, PrivBoN or PrivITP",
        description="Print the exact probability of selecting each candidate (of pool B for "
        "itp/privitp) and the fallback mass, without Monte Carlo.",
    )
    add_selector_args(p)
    p.set_defaults(func=_run)
