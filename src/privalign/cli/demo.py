"""``privalign demo --out DIR``: the main job (what ``make demo`` runs)."""

from __future__ import annotations

import argparse
import sys

from privalign.cli._args import emit_json

__all__ = ["register"]


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the quick headline experiments and write the report (the main job)",
        description="Run the quick configurations of the headline experiments of both papers into --out, "
        "write OUT/report/report.html, and print a summary of the claims table.",
    )
    p.add_argument("--out", default="runs/demo", help="output directory (default: runs/demo)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from privalign.experiments.base import ExperimentError
    from privalign.experiments.config import ConfigError
    from privalign.experiments.demo import run_demo

    try:
        res = run_demo(args.out, progress=False if args.no_progress else None)
    except (ExperimentError, ConfigError) as exc:
        print(f"privalign demo: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        emit_json(res, indent=2)
        return 0
    print(f"\n{'claim':<6} {'experiment':<26} {'verdict':<18} measured")
    for c in res["claims"]:
        measured = c["measured"] if len(c["measured"]) <= 90 else c["measured"][:87] + "..."
        exps = c["experiment"].split(" + ")
        exp = exps[0] + (f" +{len(exps) - 1}" if len(exps) > 1 else "")  # the full list is in the report
        print(f"{c['id']:<6} {exp:<26} {c['verdict']:<18} {measured}")
    print("\nper experiment (s): " + ", ".join(f"{k} {v:.1f}" for k, v in res["timings"].items()))
    print(f"total {res['seconds']:.1f} s")
    print(f"report: {res['report']}")
    return 0
