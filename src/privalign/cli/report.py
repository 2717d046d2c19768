"""``privalign report DIR... --out DIR``: one self-contained report.html + report.md with the claims table."""

from __future__ import annotations

import argparse
import json
import sys

from privalign.cli._args import emit_json

__all__ = ["register"]


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="write report.html/report.md (claims table, figures) from run directories",
        description="Read run directories written by 'privalign reproduce' and write OUT/report.html "
        "(self-contained, figures embedded), OUT/report.md and OUT/claims.json. Verdicts are computed from "
        "each run's results.jsonl.",
    )
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument("--out", required=True, help="output directory for the report")
    p.add_argument("--json", action="store_true", help="print the claims table as JSON on stdout")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from privalign.experiments.base import ExperimentError
    from privalign.experiments.report import write_report

    try:
        path = write_report(args.runs, args.out)
    except ExperimentError as exc:
        print(f"privalign report: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        from pathlib import Path

        emit_json(json.loads((Path(args.out) / "claims.json").read_text()), indent=2)
    print(f"privalign report: report written to {path}", file=sys.stderr)
    return 0
