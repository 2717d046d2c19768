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
        "write OUT/report/report.html, and print the claims table: each claim's verdict, what the claim "
        "says, and what the run found in plain words (the report opens with the same lines; its claims table "
        "has the numbers and rules).",
    )
    p.add_argument("--out", default="runs/demo", help="output directory (default: runs/demo)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(func=_run)


def claims_table(claims: list[dict], width: int | None = None) -> str:
    """The claims as a person reads them: id, verdict, what the claim says (so that "does not hold" reads
    against its own statement) and what this run found in plain words, wrapped to the terminal (never cut;
    the rule and every number are in the report)."""
    import shutil
    import textwrap

    width = width or max(shutil.get_terminal_size((110, 24)).columns, 80)
    lines = [f"{'claim':<6} {'verdict':<17} the claim; what this run found (rules, α: report.html)"]
    indent = " " * 25

    def wrap(text: str) -> list[str]:
        text = text.replace(" = ", "\xa0=\xa0")  # keep "N = 16" on one line
        body = textwrap.wrap(text, width=width - len(indent), break_on_hyphens=False) or [""]
        return [b.replace("\xa0", " ") for b in body]

    for c in claims:
        body = wrap("Claim: " + c["claim"]) + wrap("Found: " + (c.get("plain") or c["measured"]))
        lines.append(f"{c['id']:<6} {c['verdict']:<17} {body[0]}")
        lines += [indent + b for b in body[1:]]
    return "\n".join(lines)


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
    print("\n" + claims_table(res["claims"]))
    print("\nper experiment (s): " + ", ".join(f"{k} {v:.1f}" for k, v in res["timings"].items()))
    print(f"total {res['seconds']:.1f} s")
    print(f"report: {res['report']}")
    return 0
