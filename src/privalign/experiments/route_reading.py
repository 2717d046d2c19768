"""Which private route should I use? A reading across ``reproduce beyond-frontier`` runs.

Each run of ``reproduce beyond-frontier`` writes a ``summary.json`` for one number of private pairs ``n`` and
one labeller (the gold model that drew the pairs' Bradley–Terry labels). In it, per judge (the gold that
scores the selected completions), per ε and per KL budget ``K``, the routes are ranked by their best gold at
``KL ≤ K`` and the leader is compared with the runner-up (paired bootstrap over prompts × seeds, one-sided
p-value, Holm over that run's comparisons). This module reads several such summaries side by side:

* :func:`gold_by_n`: per (labeller, judge, ε, route), the route's gold at ``KL ≤ K`` as a function of ``n``,
  with the non-private DPO reference where the run has it (``nonprivate_dpo_gold``);
* :func:`leaders`: per (run, judge, ε, budget), the leader, its margin over the runner-up with the run's 95 %
  interval and verdict, and the margin the comparison detects with 80 % power at its Holm level,
  ``(z_{1−α_Holm} + z_{0.8}) · SE`` (SE: the bootstrap standard error of the difference);
* :func:`across_runs`: Holm's step-down over *every* comparison of every run read (runs × judges × ε ×
  budgets) at family-wise α = 0.05, with the three-valued verdict per comparison: ``holds`` (the leader is
  ahead, Holm-significant over the whole family), ``does not hold`` (the leader and runner-up are shown
  within ± the run's equivalence margin by the normal interval ``diff ± z_{1−α/(2k)} · SE``, Bonferroni over
  the k comparisons), else ``inconclusive``.

:func:`render` writes the three as Markdown; ``python -m privalign.experiments.route_reading RUN_DIR...``
prints it, and ``--write docs/choosing-a-route.md`` replaces the block between the
``<!-- route-reading: ARGS -->`` and ``<!-- /route-reading -->`` markers of that file (the docs test checks
the committed block is what the committed summaries give). Only summaries are read: nothing here touches the
private pairs, and every number is a function of the runs' DP outputs and their public evaluation.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist

from privalign.stats import ALPHA, holm

__all__ = [
    "Comparison",
    "Source",
    "load_source",
    "gold_by_n",
    "leaders",
    "across_runs",
    "detectable_margin",
    "render",
    "update_block",
    "main",
]

#: Power of the "detectable margin" column.
POWER = 0.8
#: The labeller of a summary that names none: the MiniLM gold drew the pairs of every run before labellers.
DEFAULT_LABELLER = "minilm"
#: The judge of a summary's main ``comparisons`` when it names none: the MiniLM gold.
DEFAULT_JUDGE = "minilm"

_Z = NormalDist()


@dataclass(frozen=True)
class Comparison:
    """One (judge, ε, budget) comparison of one run: the ranking and the leader vs runner-up test."""

    judge: str
    epsilon: float
    budget: float
    gold: dict[str, float]
    labels: dict[str, str]
    nonprivate_dpo_gold: float | None
    winner: str
    runner_up: str
    diff: float
    ci: tuple[float, float]
    se: float
    p_value: float
    holm_alpha: float
    margin: float
    verdict: str


@dataclass(frozen=True)
class Source:
    """One ``beyond-frontier`` run: where it was read from, its ``n``, labeller and comparisons."""

    path: str
    n: int
    labeller: str
    comparisons: list[Comparison] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"n = {self.n:,}, labeller {self.labeller}"


def _comparison(judge: str, c: dict) -> Comparison:
    return Comparison(
        judge=judge,
        epsilon=float(c["epsilon"]),
        budget=float(c["budget"]),
        gold={r["route"]: float(r["gold"]) for r in c["ranking"]},
        labels={r["route"]: str(r["label"]) for r in c["ranking"]},
        nonprivate_dpo_gold=None if c.get("nonprivate_dpo_gold") is None else float(c["nonprivate_dpo_gold"]),
        winner=str(c["winner"]),
        runner_up=str(c["runner_up"]),
        diff=float(c["diff"]),
        ci=(float(c["ci"][0]), float(c["ci"][1])),
        se=float(c["se"]),
        p_value=float(c["p_value"]),
        holm_alpha=float(c["holm_alpha"]),
        margin=float(c["margin"]),
        verdict=str(c["verdict"]),
    )


def load_source(path: str | Path) -> Source:
    """Read one run: ``path`` is its ``summary.json`` or the folder holding it. The labeller is
    ``data.labeller`` (default: the MiniLM gold); the main ``comparisons`` are judged by ``judges.main``
    (default: the MiniLM gold); ``alt_gold`` (runs before several judges) adds its judge, and
    ``judges.per_judge`` (name → ``{"comparisons": [...]}``) the others. Raises ``ValueError`` naming the file
    when it is not a ``beyond-frontier`` summary."""
    p = Path(path)
    if p.is_dir():
        p = p / "summary.json"
    if not p.is_file():
        raise ValueError(f"RUN: no summary.json at {str(path)!r}")
    try:
        s = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"RUN: {str(p)!r} is not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(s, dict) or s.get("experiment") != "beyond-frontier" or "comparisons" not in s:
        raise ValueError(f"RUN: {str(p)!r} is not a beyond-frontier summary.json")
    data = s.get("data") or {}
    comps: list[Comparison] = []
    seen: set[str] = set()

    def add(judge: str, cs: list) -> None:
        if judge in seen:
            return
        seen.add(judge)
        comps.extend(_comparison(judge, c) for c in cs)

    judges = s.get("judges") or {}
    per_judge = judges.get("per_judge", {}) if isinstance(judges, dict) else {}
    add(
        str(judges.get("main", DEFAULT_JUDGE) if isinstance(judges, dict) else DEFAULT_JUDGE),
        s["comparisons"],
    )
    alt = s.get("alt_gold")
    if isinstance(alt, dict) and alt.get("comparisons"):
        add(str(alt["gold"]), alt["comparisons"])
    for judge, block in per_judge.items():
        if isinstance(block, dict) and block.get("comparisons"):
            add(str(judge), block["comparisons"])
    return Source(str(p), int(data["n_pairs"]), str(data.get("labeller", DEFAULT_LABELLER)), comps)


def detectable_margin(se: float, holm_alpha: float, power: float = POWER) -> float:
    """The leader's margin that a one-sided test at level ``holm_alpha`` detects with probability ``power``
    (normal approximation of the bootstrap difference with standard error ``se``)."""
    return (_Z.inv_cdf(1 - holm_alpha) + _Z.inv_cdf(power)) * se


def gold_by_n(sources: Sequence[Source], budget: float) -> list[dict]:
    """Per (labeller, judge, ε, route): the route's best gold at KL ≤ ``budget`` for each ``n`` read (``None``
    where that run has no such route), the non-private DPO reference as its own row (route ``"dpo:none"``)."""
    rows: dict[tuple[str, str, float, str], dict] = {}
    for src in sources:
        for c in src.comparisons:
            if abs(c.budget - budget) > 1e-12:
                continue
            entries = dict(c.gold)
            labels = dict(c.labels)
            if c.nonprivate_dpo_gold is not None:
                entries["dpo:none"] = c.nonprivate_dpo_gold
                labels["dpo:none"] = "non-private DPO (reference)"
            for route, g in entries.items():
                key = (src.labeller, c.judge, c.epsilon, route)
                row = rows.setdefault(
                    key,
                    {"labeller": key[0], "judge": key[1], "epsilon": key[2], "route": route,
                     "label": labels[route], "gold": {}},
                )  # fmt: skip
                row["gold"][src.n] = g
    return sorted(rows.values(), key=lambda r: (r["labeller"], r["judge"], -r["epsilon"], r["route"]))


def leaders(sources: Sequence[Source]) -> list[dict]:
    """Per (run, judge, ε, budget): leader, runner-up, margin, 95 % interval, p-value, the run's Holm level
    and verdict, and the margin detectable with 80 % power at that level."""
    out = []
    for src in sources:
        for c in src.comparisons:
            out.append(
                {
                    "n": src.n, "labeller": src.labeller, "judge": c.judge, "epsilon": c.epsilon,
                    "budget": c.budget, "winner": c.winner, "runner_up": c.runner_up, "diff": c.diff,
                    "ci": c.ci, "p_value": c.p_value, "holm_alpha": c.holm_alpha, "verdict": c.verdict,
                    "detectable": detectable_margin(c.se, c.holm_alpha), "se": c.se, "margin": c.margin,
                }
            )  # fmt: skip
    return out


def across_runs(sources: Sequence[Source], alpha: float = ALPHA) -> list[dict]:
    """:func:`leaders` with Holm over every comparison of every run read and the three-valued verdict per
    comparison at that family (module docstring)."""
    rows = leaders(sources)
    k = len(rows)
    if not k:
        return rows
    levels = holm([r["p_value"] for r in rows], alpha)
    z = _Z.inv_cdf(1 - alpha / (2 * k))
    for r, (level, reject) in zip(rows, levels, strict=True):
        lo, hi = r["diff"] - z * r["se"], r["diff"] + z * r["se"]
        r["family_alpha"] = level
        r["family_detectable"] = detectable_margin(r["se"], level)
        if reject:
            r["family_verdict"] = "holds"
        elif -r["margin"] < lo and hi < r["margin"]:
            r["family_verdict"] = "does not hold"
        else:
            r["family_verdict"] = "inconclusive"
    return rows


def _eps(e: float) -> str:
    return f"{e:g}"


def render(sources: Sequence[Source], budget: float, alpha: float = ALPHA) -> str:
    """The reading as Markdown: gold by n at ``KL ≤ budget``, then the leaders with the family verdict."""
    ns = sorted({s.n for s in sources})
    lines = [
        f"Runs read: {'; '.join(s.name for s in sorted(sources, key=lambda s: (s.labeller, s.n)))}.",
        "",
        f"**Gold at KL ≤ {budget:g}** (best point on each route's path; blank: the route was not run "
        "at that n):",
        "",
        "| labeller | judge | ε | route | " + " | ".join(f"n = {n:,}" for n in ns) + " |",
        "|---|---|---|---|" + "---:|" * len(ns),
    ]
    for r in gold_by_n(sources, budget):
        cells = [f"{r['gold'][n]:.3f}" if n in r["gold"] else "" for n in ns]
        lines.append(
            f"| {r['labeller']} | {r['judge']} | {_eps(r['epsilon'])} | {r['label']} | "
            + " | ".join(cells)
            + " |"
        )
    rows = across_runs(sources, alpha)
    lines += [
        "",
        "**Leaders** (leader − runner-up, 95 % bootstrap interval; run: the run's own Holm verdict; "
        f"family: Holm over all {len(rows)} comparisons below at α = {alpha:g}; detectable: the margin "
        f"found with {POWER:.0%} power at the family's level for that comparison):",
        "",
        "| n | labeller | judge | ε | KL ≤ | leader | runner-up | margin [95 % CI] | p | run | family "
        "| detectable |",
        "|---:|---|---|---|---|---|---|---|---:|---|---|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r["labeller"], r["n"], r["judge"], -r["epsilon"], r["budget"])):
        lines.append(
            f"| {r['n']:,} | {r['labeller']} | {r['judge']} | {_eps(r['epsilon'])} | {r['budget']:g} | "
            f"`{r['winner']}` | `{r['runner_up']}` | {r['diff']:+.3f} "
            f"[{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}] | "
            f"{r['p_value']:.2g} | {r['verdict']} | {r['family_verdict']} | {r['family_detectable']:.3f} |"
        )
    counts = {
        v: sum(r["family_verdict"] == v for r in rows) for v in ("holds", "does not hold", "inconclusive")
    }
    lines += [
        "",
        f"Family verdicts: {counts['holds']} hold, {counts['does not hold']} do not hold, "
        f"{counts['inconclusive']} inconclusive, of {len(rows)}.",
    ]
    return "\n".join(lines) + "\n"


_BLOCK = re.compile(
    r"(<!-- route-reading: (?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- /route-reading -->)", re.S
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m privalign.experiments.route_reading",
        description="Read beyond-frontier runs side by side: gold by n at a KL budget, leaders with Holm "
        "over every comparison read.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="a beyond-frontier summary.json or its folder")
    p.add_argument("--budget", type=float, default=1.0, help="the KL budget (nats) of the gold-by-n table")
    p.add_argument("--write", metavar="FILE", help="replace the route-reading block of this Markdown file")
    return p


def block_args(text: str) -> list[str] | None:
    """The arguments recorded in ``text``'s route-reading marker, or ``None`` without one."""
    m = _BLOCK.search(text)
    return None if m is None else m.group("args").split()


def update_block(text: str, args: Sequence[str]) -> str:
    """``text`` with its route-reading block regenerated from ``args`` (the CLI's arguments
    without ``--write``)."""
    m = _BLOCK.search(text)
    if m is None:
        raise ValueError(
            "--write: the file has no '<!-- route-reading: ARGS -->' … '<!-- /route-reading -->' block"
        )
    ns = _parser().parse_args(list(args))
    body = render([load_source(r) for r in ns.runs], ns.budget)
    head = f"<!-- route-reading: {' '.join(args)} -->\n"
    return text[: m.start()] + head + body + m.group(4) + text[m.end() :]


def _without_write(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--write":
            skip = True
        elif not a.startswith("--write="):
            out.append(a)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = _parser().parse_args(argv)
    if ns.budget <= 0:
        print(f"error: --budget must be > 0 (got {ns.budget:g})", file=sys.stderr)
        return 2
    try:
        sources = [load_source(r) for r in ns.runs]
        if not any(abs(c.budget - ns.budget) < 1e-12 for s in sources for c in s.comparisons):
            print(
                f"error: --budget {ns.budget:g}: no run read compares routes at this KL budget",
                file=sys.stderr,
            )
            return 2
        if ns.write:
            target = Path(ns.write)
            if not target.is_file():
                print(f"error: --write: no file {ns.write!r}", file=sys.stderr)
                return 2
            args = _without_write(argv)
            new = update_block(target.read_text(encoding="utf-8"), args)
            tmp = target.with_suffix(target.suffix + ".tmp")
            tmp.write_text(new, encoding="utf-8")
            tmp.replace(target)
        else:
            sys.stdout.write(render(sources, ns.budget))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
