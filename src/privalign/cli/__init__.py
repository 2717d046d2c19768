"""The ``privalign`` command line.

Each subcommand lives in its own module ``privalign.cli.<name>`` exposing
``register(subparsers) -> None``; the parser built there sets ``func`` (a callable taking the parsed
``argparse.Namespace`` and returning an exit code), and is listed in :data:`COMMANDS`. ``main`` imports and
registers only the module of the command it runs; heavy imports stay inside the handlers, so that
``privalign --help`` and ``privalign CMD --help`` are fast (tests/core/test_core_import_budget.py).

Exit codes: 0 ok; 1 unexpected error; 2 usage / invalid parameter / bad data; 3 budget exhausted;
4 unsupported privacy event; 141 stdout closed by its reader (``| head``), silently. JSON goes to stdout,
messages to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import warnings

from privalign.errors import (
    BudgetExhaustedError,
    MissingDependencyError,
    PrivalignError,
    UnsupportedEventError,
)

__all__ = ["COMMANDS", "main", "build_parser", "entrypoint"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_BUDGET, EXIT_UNSUPPORTED = 0, 1, 2, 3, 4
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a program killed by the closed pipe would report


#: Every subcommand, in ``privalign --help`` order: ``(name, module under privalign.cli, one-line help)``.
#: ``main`` imports only the module of the command it runs (``privalign simulate`` never imports the
#: service's, the trainers' or the audit's parsers); the others appear in ``privalign --help`` from this
#: table. tests/core/test_core_import_budget.py checks that it matches the modules' ``register``.
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("align", "align", "Train a policy with RL (TRL GRPO + LoRA) against a (private) reward model."),
    ("audit", "audit", "Audit a built-in mechanism on worst-case neighbours (empirical ε lower bound)."),
    (
        "build-pool",
        "build_pool",
        "generate and score a candidate pool (scored-pool JSONL + manifest; resumable)",
    ),
    ("demo", "demo", "run the quick headline experiments and write the report (the main job)"),
    ("dpo", "dpo", "Train a policy with DPO (LoRA) on preference pairs under label-DP or sample-DP."),
    (
        "fit-reward",
        "fit_reward",
        "Fit a (private) sparse linear BTL reward model, or a transformer one, on preference pairs.",
    ),
    ("keys", "keys", "Create, list, top up and revoke service API keys."),
    ("law", "law", "exact selection law of BoN, ITP, PrivBoN or PrivITP"),
    ("rescore-pool", "pool_tools", "re-score an existing pool with other proxy/true rewards (no generation)"),
    (
        "plant-hack",
        "pool_tools",
        "a planted reward-hacking control on real text: proxy + BONUS on a rare textual feature",
    ),
    (
        "bon-curve",
        "pool_tools",
        "exact BoN curves of proxy and gold reward; paired test of over-optimisation",
    ),
    (
        "fit-imdb-reward",
        "pool_tools",
        "fit an IMDb gold or proxy reward model (a reward-model file, privalign.reward_model v2)",
    ),
    (
        "fit-hh-reward",
        "pool_tools",
        "fit the HH-RLHF gold (MiniLM Bradley-Terry) or a proxy (n-gram Bradley-Terry on gold-relabelled "
        "pairs)",
    ),
    ("rates", "rates", "Synthetic rate experiments for the reward estimators (plots + results.json)."),
    ("report", "report", "write report.html/report.md (claims table, figures) from run directories"),
    (
        "reproduce",
        "reproduce",
        "run a paper experiment into a run directory (manifest, results, figures, summary)",
    ),
    ("select", "select", "select one candidate with BoN, ITP, PrivBoN or PrivITP"),
    ("serve", "serve", "Run the OpenAI-compatible private best-of-N service."),
    ("session", "session", "serve a pool's prompts under a privacy budget"),
    ("simulate", "simulate", "evaluation protocol (N = 2^0..2^k) on a scored pool"),
    (
        "upgrade-reward-model",
        "upgrade_reward_model",
        "rewrite an older reward-model file in the current format (privalign.reward_model v2)",
    ),
)


def _chosen_module(argv: list[str]) -> str | None:
    """The module of the subcommand ``argv`` names (its first non-option word), or ``None``."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return next((mod for name, mod, _ in COMMANDS if name == word), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``privalign`` parser. Without ``argv``: every subcommand's parser. With ``argv``: only the parser
    of the subcommand it names is built (its module imported and registered); the other subcommands are
    placeholders that carry their one-line help (``privalign --help`` lists them all the same)."""
    from privalign import __version__
    from privalign.cli._args import Parser

    parser = Parser(
        prog="privalign",
        description="Differentially private alignment of language models: private best-of-N and ITP at "
        "inference time, private sparse reward estimation at training time.",
    )
    parser.add_argument("--version", action="version", version=f"privalign {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    chosen = None if argv is None else _chosen_module(argv)
    registered: set[str] = set()
    for name, module, help_ in COMMANDS:
        if argv is not None and module != chosen:
            sub.add_parser(name, help=help_)  # a placeholder: never parses (its command was not named)
        elif module not in registered:  # one register() adds all of its module's commands
            registered.add(module)
            importlib.import_module(f"privalign.cli.{module}").register(sub)
    return parser


def _command(args: argparse.Namespace) -> str:
    parts = ["privalign", getattr(args, "command", None) or ""]
    for k in ("keys_command",):
        if getattr(args, k, None):
            parts.append(getattr(args, k))
    return " ".join(p for p in parts if p)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _check_seeds(args: argparse.Namespace) -> str | None:
    """Every seed option of every subcommand: a non-negative integer (numpy's SeedSequence rule)."""
    for k, v in vars(args).items():
        if (k == "seed" or k.endswith("_seed")) and isinstance(v, int) and not isinstance(v, bool) and v < 0:
            return f"argument --{k.replace('_', '-')}: must be a non-negative integer, got {v}"
    return None


# Options and positionals that name a file or directory: an empty value would silently mean the current
# directory ('--out ""' wrote results.json, or '..json', there).
_PATH_DESTS = ("out", "pool", "data", "config", "reward_model", "model", "runs", "math_path", "audit_record")


def _check_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """Every path option of every subcommand: not an empty (or blank) string."""
    options = _options_of(parser, args)
    for k in _PATH_DESTS:
        v = getattr(args, k, None)
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, str) and not x.strip():
                return f"argument {options.get(k, k)}: must not be empty, got {x!r}"
    return None


_PARAM = re.compile(r"\b([Tt])he '([A-Za-z_][A-Za-z0-9_]*)' parameter")
_SWITCH = re.compile(r"\bpass ([A-Za-z_][A-Za-z0-9_]*)=True\b")


def _options_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """``dest → option string`` of the options of the subcommand that ran (positionals excluded)."""
    out: dict[str, str] = {}
    current = parser
    for key in ("command", "keys_command"):
        sub = next((a for a in current._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, key, None)
        if sub is None or name not in sub.choices:
            break
        current = sub.choices[name]
    for a in current._actions:
        if a.option_strings and a.dest not in ("help",):
            out[a.dest] = max(a.option_strings, key=len)
    return out


def _flagify(msg: str, options: dict[str, str]) -> str:
    """Name the command-line flag, not the Python parameter: "The 'epsilon' parameter" → "The '--epsilon'
    option"."""

    def sub(m: re.Match) -> str:
        flag = options.get(m.group(2))
        return f"{m.group(1)}he '{flag}' option" if flag else m.group(0)

    def switch(m: re.Match) -> str:  # "pass clip=True" → "pass --clip"
        flag = options.get(m.group(1))
        return f"pass {flag}" if flag else m.group(0)

    return _SWITCH.sub(switch, _PARAM.sub(sub, msg))


def _flag_of_value(args: argparse.Namespace | None, filename: object) -> str | None:
    """The option (of the command that ran) whose value is the path an OSError names, if exactly one."""
    if args is None:
        return None
    target = os.fspath(filename) if isinstance(filename, str | os.PathLike) else None
    if target is None:
        return None
    options = _options_of(build_parser([getattr(args, "command", None) or ""]), args)
    hits = []
    for dest, flag in options.items():
        v = getattr(args, dest, None)
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, str | os.PathLike) and os.fspath(x) == target:
                hits.append(flag)
    return hits[0] if len(set(hits)) == 1 else None


def _os_error(exc: OSError, args: argparse.Namespace | None) -> str | None:
    """A file-system error on a path the user gave, in words, naming the option when one has that value."""
    flag = _flag_of_value(args, exc.filename)
    prefix = f"argument {flag}: " if flag else ""
    if isinstance(exc, FileNotFoundError):
        return f"{prefix}no such file or directory: {exc.filename}"
    if isinstance(exc, IsADirectoryError):
        return f"{prefix}{exc.filename} is a directory (a file was expected)"
    if isinstance(exc, NotADirectoryError):
        return f"{prefix}{exc.filename}: a part of this path is a file, not a directory"
    if isinstance(exc, FileExistsError) and not os.path.isdir(exc.filename):
        # an output directory (--out) that is a file: mkdir(exist_ok=True) says only "File exists"
        return f"{prefix}{exc.filename} exists and is not a directory (an output directory was expected)"
    return None


def _user_error(exc: BaseException, args: argparse.Namespace | None = None) -> str | None:
    """The one-line message of an exception that is the user's to fix, or ``None`` (a bug)."""
    from privalign.cli._args import EXTRA_OF, extra_for

    if isinstance(exc, ModuleNotFoundError | MissingDependencyError):
        name = getattr(exc, "name", None)
        extra = extra_for(name)
        if extra is not None:
            return (
                f"this command needs {name!r}, which is not installed: pip install 'privalign[{extra}]' "
                f"(or the whole set: pip install 'privalign[all]')"
            )
        if isinstance(exc, MissingDependencyError):
            msg = _one_line(str(exc))
            for mod, extra in EXTRA_OF.items():
                if (
                    extra is not None
                    and "privalign[" not in msg
                    and (mod in msg or mod.replace("_", "-") in msg)
                ):
                    return f"{msg} (or install the extra: pip install 'privalign[{extra}]')"
            return msg
        return None
    if isinstance(exc, PrivalignError | ValueError | OSError):
        if isinstance(exc, OSError) and exc.filename and str(exc).startswith("[Errno"):
            os_msg = _os_error(exc, args)
            if os_msg is not None:
                return os_msg
        return _one_line(str(exc)) or type(exc).__name__
    if type(exc).__name__ in (
        "GenerationError",
        "UpstreamError",
    ):  # a generator/server the user pointed at failed
        return f"generation failed: {_one_line(str(exc))[:500]}"
    mod = type(exc).__module__ or ""
    if mod.startswith("sqlalchemy"):
        orig = getattr(exc, "orig", None)
        detail = _one_line(str(orig if orig is not None else exc).split("\n")[0])
        url = getattr(args, "db", None)
        where = f"--db {url!r}" if url is not None else "the --db URL or the config's [database].url"
        if isinstance(url, str) and "://" not in url:  # a bare path: say what a URL looks like
            where += f"; a database URL, e.g. 'sqlite:///{os.path.abspath(url) if url.strip() else 'PATH'}'"
        return f"cannot use the database ({type(exc).__name__}): {detail[:300]} (check {where})"
    if mod.split(".")[0] in ("httpx", "httpcore", "openai", "requests", "urllib3"):
        return f"network error ({type(exc).__name__}): {_one_line(str(exc))[:300]}"
    return None


_NEGATIVE = re.compile(r"^-(\d|\.\d|inf\b)")


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--score-range -4,16`` → ``--score-range=-4,16``: argparse would take ``-4,16`` for an option."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and "=" not in a and i + 1 < len(argv) and _NEGATIVE.match(argv[i + 1]):
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def _default_ledger(args: argparse.Namespace, cmd: str) -> None:
    """``privalign keys`` without ``--db``/``--config`` uses the ledger of ``privalign serve`` without a
    config."""
    from pathlib import Path

    from privalign.service.config import default_config

    url = default_config().database.url
    Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    args.db = url
    print(
        f"{cmd}: note: no --db or --config: using the default ledger {url} (the one 'privalign serve' uses "
        "without --config)",
        file=sys.stderr,
    )


def _silence_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's last flush must not fail on the closed pipe again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (tests capture it)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI in-process (tests call ``main([...])``); returns the exit code.

    The error boundary: a user error (bad flag value, bad file, unreachable database or server, missing
    optional dependency) prints one line ``privalign CMD: error: ...`` on stderr and returns 2, never a
    traceback. An unexpected error (a bug) prints one line and returns 1; set ``PRIVALIGN_DEBUG=1`` to see
    its traceback.
    """
    import os

    argv = _join_negative_values(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser(argv)
    try:
        args, extra = parser.parse_known_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if extra:  # reported by the subcommand, not by the top-level parser
        cmd = _command(args)
        print(
            f"{cmd}: error: unrecognized arguments: {' '.join(extra)} (see '{cmd} --help')", file=sys.stderr
        )
        return EXIT_USAGE
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    cmd = _command(args)
    bad = _check_seeds(args) or _check_paths(parser, args)
    if bad:
        print(f"{cmd}: error: {bad}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "keys" and getattr(args, "db", "x") is None and getattr(args, "config", "x") is None:
        _default_ledger(args, cmd)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = lambda message, category, *a, **k: print(  # one line per warning
                f"{cmd}: warning: {_one_line(str(message))}", file=sys.stderr
            )
            return int(args.func(args) or 0)
    except BudgetExhaustedError as exc:
        print(f"{cmd}: error: budget exhausted: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_BUDGET
    except UnsupportedEventError as exc:
        print(f"{cmd}: error: unsupported privacy event: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_UNSUPPORTED
    except KeyboardInterrupt:
        print(f"{cmd}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed by its reader ('privalign reproduce --list | head'): not an error
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        if os.environ.get("PRIVALIGN_DEBUG"):
            raise
        msg = _user_error(exc, args)
        if msg is not None:
            msg = _flagify(msg, _options_of(parser, args))
            print(f"{cmd}: error: {msg}", file=sys.stderr)
            return EXIT_USAGE
        print(
            f"{cmd}: internal error ({type(exc).__name__}): {_one_line(str(exc))[:500]} "
            "(a bug: please report it; PRIVALIGN_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_ERROR


def entrypoint() -> None:
    raise SystemExit(main())
