"""Issue 36, item 4: a new user on a fresh clone walks ``docs/guide.md`` top to bottom.

No model is loaded and nothing is run: the guide's shell blocks are tokenised as bash would (quotes,
comments, ``\\`` continuations, here-documents), and every ``privalign`` command in them must parse with
the CLI's own parser (a renamed flag or subcommand fails here, not on the user's machine). Also: the guide
says how to put ``privalign`` on the PATH (activate ``.venv``) before its first command, and no two commands
of the guide write the same output, so following it in order overwrites no earlier result.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from privalign.cli import _join_negative_values, build_parser

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide.md"
ACTIVATE = "source .venv/bin/activate"
_PUNCT = "();<>|&\n"


def _blocks(text: str) -> list[tuple[int, str]]:
    """(offset, body) of each ```bash block."""
    return [(m.start(), m.group(1)) for m in re.finditer(r"```bash\n(.*?)```", text, re.S)]


def _strip(block: str) -> str:
    """The block with continuations joined, here-document bodies and comments removed (quote-aware)."""
    block = block.replace("\\\n", " ")
    lines, out, heredoc = block.split("\n"), [], None
    for line in lines:
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            continue
        m = re.search(r"<<-?\s*'?\"?(\w+)'?\"?", line)
        if m:
            heredoc = m.group(1)
            line = line[: m.start()]
        out.append(line)
    text, res, quote, i = "\n".join(out), [], None, 0
    while i < len(text):
        c = text[i]
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in " \t\n"):
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        res.append(c)
        i += 1
    return "".join(res)


def _commands(block: str) -> list[list[str]]:
    """The simple commands of a block, each as its argv (bash's word splitting and quote removal)."""
    lex = shlex.shlex(_strip(block), posix=True, punctuation_chars=_PUNCT)
    lex.whitespace = " \t\r"
    lex.whitespace_split = True
    lex.commenters = ""
    cmds: list[list[str]] = [[]]
    for tok in lex:
        if tok in (">", ">>"):  # a redirection: its target is the next word
            cmds[-1].append(">")
        elif all(ch in _PUNCT for ch in tok):  # ;  &  &&  |  ||  newline  (  )  and runs of them
            cmds.append([])
        else:
            cmds[-1].append(tok)
    return [c for c in cmds if c]


def _privalign_argv(cmd: list[str]) -> list[str] | None:
    """argv after ``privalign`` (or ``.venv/bin/privalign``), leading ``VAR=$`` words skipped."""
    words = [w for w in cmd if not re.fullmatch(r"[A-Z_]+=\$?", w)]
    if words and words[0] in ("privalign", ".venv/bin/privalign"):
        return words[1:]
    return None


def _outputs(cmd: list[str]) -> list[str]:
    """What one command writes: ``--out``, a ``>`` redirection, ``heldout_imdb_pairs('PATH')``."""
    outs = [
        cmd[i + 1] for i, w in enumerate(cmd[:-1]) if w == "--out" or (w == ">" and cmd[i + 1] != "/dev/null")
    ]
    outs += [w.split("=", 1)[1] for w in cmd if w.startswith("--out=")]
    for w in cmd:
        outs += re.findall(r"heldout_imdb_pairs\(['\"]([^'\"]+)['\"]\)", w)
    return outs


def _guide_commands(text: str) -> list[tuple[int, list[str]]]:
    return [(off, c) for off, body in _blocks(text) for c in _commands(body)]


def _parse(argv: list[str]) -> str | None:
    """None if the CLI's parser accepts ``argv``, else its error line."""
    import contextlib
    import io

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(_join_negative_values(argv))
    except SystemExit as exc:
        return None if exc.code == 0 else err.getvalue().strip() or f"exit {exc.code}"
    return None


# --- the pieces of the walker on known text (they must be able to fail) -------------------------------


def test_the_tokeniser_splits_commands_as_bash_does():
    block = (
        "privalign fit-reward --data pairs.jsonl --out rm.json  # a comment with --bogus\n"
        'TOKEN=$(privalign keys create --budget-epsilon 2)\ncurl -d \'{"a": 1,\n "b": "#x"}\' http://h\n'
        "privalign build-pool --n 4 \\\n  --out pool.jsonl &\npython - a <<'EOF'\nprivalign nope\nEOF\n"
        "head -n 64 a.jsonl > b.jsonl && privalign reproduce --list\n"
    )
    cmds = _commands(block)
    pa = [_privalign_argv(c) for c in cmds]
    assert [a for a in pa if a is not None] == [
        ["fit-reward", "--data", "pairs.jsonl", "--out", "rm.json"],
        ["keys", "create", "--budget-epsilon", "2"],
        ["build-pool", "--n", "4", "--out", "pool.jsonl"],
        ["reproduce", "--list"],
    ]
    assert [o for c in cmds for o in _outputs(c)] == ["rm.json", "pool.jsonl", "b.jsonl"]
    assert _parse(["fit-reward", "--bogus"]) is not None and _parse(["nope"]) is not None
    assert _parse(["reproduce", "--list"]) is None


# --- the guide ------------------------------------------------------------------------------------------


def test_the_guide_says_how_to_run_privalign_before_its_first_command():
    text = GUIDE.read_text(encoding="utf-8")
    assert any(_privalign_argv(c) is not None for _, c in _guide_commands(text))
    starts = [  # where each block's first privalign command line starts, and the first inline one
        m.start()
        for off, _ in _blocks(text)
        if (
            m := re.compile(r"(?m)^(?:[A-Z_]+=\$\()?privalign ").search(
                text, off, text.index("```\n", off + 3)
            )
        )
    ]
    inline = re.search(r"`privalign [^`]*`", text)
    first = min(starts + ([inline.start()] if inline else []))
    at = text.find(ACTIVATE)
    assert 0 <= at < first, f"docs/guide.md must say `{ACTIVATE}` (or how else) before its first privalign"
    recipes = text.index("\n## I ")  # the first recipe
    assert ".venv/bin/privalign" in text[:recipes], (
        "also the way that needs no activation, before the recipes"
    )


def test_every_command_of_the_guide_parses_with_the_cli():
    cmds = [c for _, c in _guide_commands(GUIDE.read_text(encoding="utf-8"))]
    argvs = [a for a in map(_privalign_argv, cmds) if a is not None]
    assert len(argvs) >= 15, argvs  # the walker found the guide's commands
    bad = {" ".join(a): e for a in argvs if (e := _parse(a)) is not None}
    assert not bad, bad


def test_every_inline_privalign_command_uses_known_subcommands_and_flags():
    text = GUIDE.read_text(encoding="utf-8")
    sub = next(a for a in build_parser()._actions if a.choices and "fit-reward" in a.choices).choices
    bad = []
    for span in re.findall(r"`((?:\.venv/bin/)?privalign [^`]+)`", re.sub(r"\s*\n\s*", " ", text)):
        words = shlex.split(span)[1:]
        if not words or words[0].startswith("-"):
            continue
        parser = sub.get(words[0])
        if parser is None:
            bad.append(f"{span}: no subcommand {words[0]!r}")
            continue
        nested = next((a.choices for a in parser._actions if a.choices and isinstance(a.choices, dict)), {})
        if len(words) > 1 and words[1] in nested:
            parser = nested[words[1]]
        known = parser._option_string_actions
        bad += [f"{span}: {w}" for w in words if w.startswith("--") and w.split("=")[0] not in known]
    assert not bad, bad


def test_no_two_commands_of_the_guide_write_the_same_output():
    seen: dict[str, str] = {}
    dup = []
    for _, c in _guide_commands(GUIDE.read_text(encoding="utf-8")):
        for out in _outputs(c):
            key = out.rstrip("/")
            if key in seen:
                dup.append(f"{key}: {seen[key]!r} and {' '.join(c)!r}")
            seen.setdefault(key, " ".join(c))
    assert seen, "the walker found no outputs"
    assert not dup, dup


@pytest.mark.parametrize("name", ["--out", "--data", "--reward-model", "--model", "--pool", "--proxy-reward"])
def test_the_guide_s_recipes_write_under_runs_guide_and_read_what_they_wrote(name):
    """Every output is under ``runs/guide/`` (one folder per recipe: ``rm -rf`` starts it afresh), and a
    file a command reads from ``runs/`` was written by an earlier command of the guide."""
    cmds = [c for _, c in _guide_commands(GUIDE.read_text(encoding="utf-8"))]
    written: list[str] = []
    for c in cmds:
        argv = _privalign_argv(c) or []
        if name == "--out":
            stray = [o for o in _outputs(c) if not o.startswith("runs/guide/")]
            assert not stray, f"{' '.join(c)!r} writes outside runs/guide/: {stray}"
        else:
            for i, w in enumerate(argv[:-1]):
                if w == name:
                    path = argv[i + 1].removeprefix("linear:")
                    if path.startswith("runs/"):
                        assert any(path == o or path.startswith(o.rstrip("/") + "/") for o in written), (
                            f"{' '.join(c)!r} reads {path}, which no earlier command of the guide writes"
                        )
        written += _outputs(c)
