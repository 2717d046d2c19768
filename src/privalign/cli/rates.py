"""``privalign rates``: synthetic sparse-BTL rate experiments (error vs n, d, s*, ε) for every estimator.

Writes ``results.json`` (all fits, means ± SE, fitted log-log slopes, seed entropy) and ``rates.png``
into ``--out``. ``--quick`` runs a small grid (about a minute on 2 cores); the full grid takes longer.
Label-DP (RR) and sample-DP curves share the ε axis but protect different units; the plot says so.
"""

from __future__ import annotations

import argparse
import json

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "rates",
        help="Synthetic rate experiments for the reward estimators (plots + results.json).",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="Output directory.")
    p.add_argument("--quick", action="store_true", help="Small grid (smoke test).")
    p.add_argument(
        "--methods", default=None, help="Comma-separated subset of mle,iht,dp-iht,rr-iht,rr,dp-sgd."
    )
    p.add_argument("--seed", type=int, default=None, help="SeedSequence entropy (default: fresh, recorded).")
    p.add_argument("--json", action="store_true", help="Print the slopes and paths as JSON on stdout.")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from privalign.estimation.rates import METHODS, run_rates

    methods = (
        METHODS if args.methods is None else tuple(m.strip() for m in args.methods.split(",") if m.strip())
    )
    res = run_rates(args.out, quick=args.quick, methods=methods, entropy=args.seed)
    out = {
        "results": str(Path(args.out) / "results.json"),
        "plot": str(Path(args.out) / "rates.png"),
        "entropy": res["entropy"],
        "slopes": res["slopes"],
    }
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        for scan, d in res["slopes"].items():
            print(f"log-log slope vs {scan}: " + ", ".join(f"{m} {v:+.2f}" for m, v in d.items()))
        print(f"wrote {out['results']} and {out['plot']}")
    return 0
