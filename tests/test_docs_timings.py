"""Every time README.md and docs/guide.md quote is one that ``benchmarks/readme_timings.py`` re-measures, so a
figure cannot go stale silently: a duration in the docs the script does not measure fails, and so does a
figure the script quotes that the docs no longer hold. The commands the script times are the ones the guide
shows (a different command would time something else)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/guide.md")

#: A duration as the docs write one: "41 s", "1 min 47 s", "11 min", "45–75 minutes", "a few seconds", "2 h".
DURATION = re.compile(
    r"(?<![\w.])(?:\d+(?:[.,]\d+)?(?:\s?[–-]\s?\d+(?:[.,]\d+)?)?\s?(?:min(?:utes?)?(?:\s\d+\s?s)?|s|secs?|"
    r"seconds?|h|hours?)|(?:a few|several|a couple of) (?:seconds|minutes|hours))(?![\w])"
)


def _script():
    spec = importlib.util.spec_from_file_location("readme_timings", ROOT / "benchmarks" / "readme_timings.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("readme_timings", mod)  # (dataclasses look their module up there)
    spec.loader.exec_module(mod)
    return mod


def _text(doc: str) -> str:
    return (ROOT / doc).read_text(encoding="utf-8")


def _durations(text: str) -> list[str]:
    return [m.group(0) for m in DURATION.finditer(text)]


def test_the_pattern_finds_the_forms_the_docs_use():
    found = _durations("took 41 s, then 1 min 47 s (11 min; about 45–75 minutes, a few seconds) at N = 16 s.")
    assert found == ["41 s", "1 min 47 s", "11 min", "45–75 minutes", "a few seconds", "16 s"]
    assert _durations("ε = 1.5, 2 CPUs, 64 prompts × 512, docs/guide.md#timings, 0.5 σ") == []


def test_every_quoted_time_is_measured_by_the_script():
    quoted = {q for t in _script().TIMINGS for q in (t.quoted, t.quoted_cpu) if q}
    for doc in DOCS:
        stray = [d for d in _durations(_text(doc)) if d not in quoted]
        assert not stray, f"{doc} quotes {stray}: add them to benchmarks/readme_timings.py or remove them"


def test_every_figure_the_script_quotes_is_in_the_docs_with_its_commands():
    docs = " ".join(_text(d) for d in DOCS)
    flat = re.sub(r"\s+", " ", re.sub(r"\\\n\s*", " ", docs))
    for t in _script().TIMINGS:
        for q in (t.quoted, t.quoted_cpu):
            assert not q or q in _durations(docs), f"{t.name}: the docs no longer quote {q!r}"
        for cmd in (*t.setup, *t.commands):
            shown = re.sub(r"\s+", " ", cmd.replace(" --no-progress", ""))  # (display only: not shown)
            assert shown in flat, f"{t.name}: the docs do not show {cmd!r}"


def test_every_figure_states_wall_and_cpu_time_together():
    """A wall-clock time alone misleads on a shared machine (issue 36): each entry quotes both, side by side
    (within one table row or one parenthesis) somewhere in the docs."""
    docs = re.sub(r"\s+", " ", " ".join(_text(d) for d in DOCS))
    for t in _script().TIMINGS:
        assert t.quoted_cpu, f"{t.name}: quote the CPU time too (quoted_cpu)"
        near = re.escape(t.quoted) + r"(?![\w]).{0,40}?(?<![\w.])" + re.escape(t.quoted_cpu) + r"(?![\w])"
        assert re.search(near, docs), (
            f"{t.name}: the docs do not state {t.quoted} wall with {t.quoted_cpu} CPU"
        )


def test_every_long_command_of_the_guide_is_timed():
    """Each command of the guide that trains, samples or reproduces is one the script runs (timed, or as the
    set-up of a timed entry), so its recipe's time is measured, not guessed."""
    text = _text("docs/guide.md")
    timed = {  # (a set-up command is run by the script too, before the entry's timed commands)
        re.sub(r"\s+", " ", c.replace(" --no-progress", ""))
        for t in _script().TIMINGS
        for c in (*t.setup, *t.commands)
    }
    long = re.compile(r"^privalign (?:align|dpo|build-pool|simulate|fit-reward|demo|reproduce (?!--list)) ")
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            cmd = re.sub(r"\s+", " ", line.split("  #")[0].replace(" --no-progress", "")).strip()
            if long.match(cmd):
                found.append(cmd)
                assert cmd in timed, (
                    f"docs/guide.md runs {cmd!r}, which benchmarks/readme_timings.py does not time"
                )
    assert len(found) >= 6, found
