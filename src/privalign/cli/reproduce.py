"""``privalign reproduce EXPERIMENT [--config FILE] [--quick] --out DIR`` and ``privalign reproduce all``."""

from __future__ import annotations

import argparse
import sys

from privalign.cli._args import emit_json

__all__ = ["register"]


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "reproduce",
        help="run a paper experiment into a run directory (manifest, results, figures, summary)",
        description="Run one experiment (or 'all') into --out. Checks the experiment name, the config, the "
        "output directory and the inputs before any work; an interrupted run is resumed by rerunning the "
        "same command. Use 'privalign reproduce --list' to see the experiments.",
    )
    p.add_argument("experiment", nargs="?", help="experiment name, or 'all'")
    p.add_argument("--config", help="TOML configuration file (default: the packaged one)")
    p.add_argument("--quick", action="store_true", help="use the quick packaged configuration")
    p.add_argument(
        "--out", help="run directory (for 'all': a parent directory, one sub-directory per experiment)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one configuration key (VALUE in TOML syntax, e.g. --set records_only=true "
        "--set 'policies=[\"IHT\"]'; a bare word is a string); repeatable",
    )
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from privalign.experiments.base import ExperimentError
    from privalign.experiments.config import ConfigError
    from privalign.experiments.registry import EXPERIMENTS
    from privalign.experiments.runner import prepare, run_experiment

    if args.list:
        rows = [{"name": n, "paper": e.paper, "title": e.title} for n, e in EXPERIMENTS.items()]
        if args.json:
            emit_json(rows, indent=2)
        else:
            for r in rows:
                print(f"{r['name']:<22} {r['paper']:<7} {r['title']}")
        return 0
    if not args.experiment or not args.out:
        print(
            "privalign reproduce: error: EXPERIMENT and --out are required (or use --list)", file=sys.stderr
        )
        return 2
    progress = False if args.no_progress else None
    try:
        overrides = parse_overrides(args.set)
    except ValueError as exc:
        print(f"privalign reproduce: error: argument --set: {exc}", file=sys.stderr)
        return 2
    if overrides and args.experiment == "all":
        print("privalign reproduce: error: --set cannot be combined with 'all'", file=sys.stderr)
        return 2
    try:
        if args.experiment == "all":
            if args.config:
                print("privalign reproduce: error: --config cannot be combined with 'all'", file=sys.stderr)
                return 2
            out = Path(args.out)
            # Every check of every experiment first, then the work.
            for name in EXPERIMENTS:
                prepare(name, out=out / name, quick=args.quick, progress=progress)
            summaries = {}
            for name in EXPERIMENTS:
                summaries[name] = run_experiment(name, out=out / name, quick=args.quick, progress=progress)
                print(f"privalign reproduce: {name}: done -> {out / name}", file=sys.stderr)
            if args.json:
                emit_json(summaries, indent=2)
            return 0
        summary = run_experiment(
            args.experiment,
            out=args.out,
            config_path=args.config,
            quick=args.quick,
            overrides=overrides or None,
            progress=progress,
        )
    except (ExperimentError, ConfigError) as exc:
        print(f"privalign reproduce: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        emit_json(summary, indent=2)
    else:
        print(f"privalign reproduce: {args.experiment}: done -> {args.out}", file=sys.stderr)
    return 0


def parse_overrides(items: list[str]) -> dict:
    """``["records_only=true", "steps=50", "gold=pools/x.json"]`` → ``{"records_only": True, "steps": 50,
    "gold": "pools/x.json"}``: each VALUE is read as TOML, and a value that is not TOML (a bare word or path)
    as a string. The experiment's schema then checks every key and value.

    Raises:
      ValueError: an item without ``=``, an empty key, or a key given twice.
    """
    import tomllib

    out: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        if key in out:
            raise ValueError(f"key {key!r} given twice")
        try:
            out[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = value
    return out
