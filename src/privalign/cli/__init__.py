"""The ``privalign`` command line.

Each subcommand lives in its own module ``privalign.cli.<name>`` exposing
``register(subparsers) -> None``; the parser built there sets ``func`` (a callable taking the parsed
``argparse.Namespace`` and returning an exit code). Heavy imports stay inside the handlers so that
``privalign --help`` is fast.

Exit codes: 0 ok; 1 unexpected error; 2 usage / invalid parameter / bad data; 3 budget exhausted;
4 unsupported privacy event. JSON goes to stdout, messages to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from privalign.errors import (
    BudgetExhaustedError,
    DataFormatError,
    MissingDependencyError,
    PrivacyParameterError,
    ReservationError,
    UnsupportedEventError,
)

__all__ = ["main", "build_parser", "entrypoint"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_BUDGET, EXIT_UNSUPPORTED = 0, 1, 2, 3, 4


def build_parser() -> argparse.ArgumentParser:
    from privalign import __version__

    parser = argparse.ArgumentParser(
        prog="privalign",
        description="Differentially private alignment of language models: private best-of-N and ITP at "
        "inference time, private sparse reward estimation at training time.",
    )
    parser.add_argument("--version", action="version", version=f"privalign {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    pkg = importlib.import_module("privalign.cli")
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"privalign.cli.{info.name}")
        register = getattr(mod, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI in-process (tests call ``main([...])``); returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except BudgetExhaustedError as exc:
        print(f"privalign: budget exhausted: {exc}", file=sys.stderr)
        return EXIT_BUDGET
    except UnsupportedEventError as exc:
        print(f"privalign: unsupported privacy event: {exc}", file=sys.stderr)
        return EXIT_UNSUPPORTED
    except (PrivacyParameterError, DataFormatError, ReservationError, MissingDependencyError, FileNotFoundError) as exc:
        print(f"privalign: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def entrypoint() -> None:
    raise SystemExit(main())
