"""One line in plain words per claim, written from its verdict and the numbers its rule measured.

Each claim of the claims table (:data:`privalign.experiments.report.CLAIMS`) may name a *reader*: a function
``(verdict, facts) -> str`` where ``facts`` is the dict its rule returned with the verdict
(:class:`privalign.experiments.verdicts.Outcome`). The reading says what was found, for someone choosing a
method, with the decisive numbers and whether the difference is significant; an undecided claim says why
(underpowered, nothing to compare, …). Nothing here knows an outcome in advance: every sentence is chosen by
the verdict and filled from the facts. A claim without a reader, or a result without the facts a reader
needs, gets :func:`generic` (the claim restated with the verdict), so a new claim plugs in by giving its
rule's facts and a reader, or neither.

Readers are one line, at most about 240 characters; :func:`reading` applies a reader per run when a claim
was decided on several runs (pools) and joins them.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["Reader", "reading", "generic", "READERS", "num"]

Reader = Callable[[str, dict], str]

_SIG = "significant"


def num(x: object) -> str:
    """A number for a person: 2 significant digits (3 when ≥ 100), integers as such."""
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if x != x:  # NaN
            return "n/a"
        if x == int(x) and abs(x) < 1e6:
            return f"{int(x):,}"
        return f"{x:.3g}" if abs(x) >= 100 else f"{x:.2g}"
    return str(x)


def _list(xs: list) -> str:
    return ", ".join(num(x) for x in xs)


def _claim_words(text: str) -> str:
    """The claim without its source tag (``[paper]``) and final full stop."""
    return re.sub(r"\s*\[[^\]]*\]\s*$", "", text).rstrip(". ")


def generic(claim_text: str, verdict: str, facts: dict | None = None) -> str:
    """The reading of a claim without a reader (or without the facts its reader needs)."""
    what = _claim_words(claim_text)
    why = (facts or {}).get("why")
    if verdict == "holds":
        return f"Supported by this run: {what}."
    if verdict == "does not hold":
        return f"Contradicted by this run: {what}."
    return f"Could not tell whether {what[:1].lower() + what[1:]}" + (f" ({why})." if why else ".")


#: The unit of a lift or regret, by what it measures (the rule's ``what`` fact): accuracy lifts are in
#: percentage points of accuracy (×100 of a 0/1 truth); a true reward in the pool's own true-reward units.
_UNITS = {"accuracy": " percentage points", "true reward": " true-reward units"}


def _unit(f: dict) -> str:
    """The unit after a number of ``f``'s ``what`` (``" percentage points"``, ``" true-reward units"``)."""
    return _UNITS.get(f.get("what", "true reward"), f.get("unit", ""))


def _method(m: str) -> str:
    from privalign.experiments.records import fixed_label

    return "PrivITP (at a fixed noise level)" if m == fixed_label("privitp") else m


# --- paper 1 ------------------------------------------------------------------------------------------------


def p1_1(verdict: str, f: dict) -> str:
    w, u = f.get("what", "true reward"), _unit(f)
    if verdict == "holds":
        return (
            f"BoN over-optimised (reward hacking): its {w} fell by {num(f['bon_drop'])}{u} from "
            f"N = {num(f['bon_from_N'])} to N = {num(f['n_max'])} ({_SIG})."
        )
    if verdict == "does not hold":
        return (
            f"BoN did not over-optimise although planted hacks were within reach: its {w} did not "
            f"fall up to N = {num(f['n_max'])}."
        )
    if "bon_drop" not in f:
        return "Could not tell whether BoN over-optimises: too few values of N to see a fall."
    return (
        f"Could not tell whether BoN over-optimises: no significant fall in {w} up to N = "
        f"{num(f['n_max'])} (a fall below {num(f['bon_detectable'])}{u} would go unseen)."
    )


def monotone(verdict: str, f: dict) -> str:
    """P1-2..P1-4: a method resists over-optimisation where BoN does not."""
    m = _method(f["method"])
    if f.get("across_epsilon"):
        words = {
            "holds": f"{m} resisted over-optimisation",
            "does not hold": f"{m} over-optimised",
            "inconclusive": "the data could not tell",
        }
        parts = [f"{words.get(v, v)} at ε = {_list(es)}" for v, es in f["across_epsilon"].items()]
        return "Across the privacy sweep, " + "; ".join(parts) + "."
    w, u = f.get("what", "true reward"), _unit(f)
    if verdict == "holds":
        return (
            f"{m} did not over-optimise where BoN did: its {w} did not fall up to N = "
            f"{num(f['n_max'])} (any fall is below {num(f['upper_drop'])}{u})."
        )
    if verdict == "does not hold":
        return (
            f"{m} over-optimised: its {w} fell by {num(f['drop'])}{u} from N = {num(f['from_N'])} to "
            f"N = {num(f['n_max'])} ({_SIG})."
        )
    why = f.get("why", "")
    if why == "no over-optimisation on this pool":
        return (
            f"Could not tell whether {m} resists over-optimisation: BoN did not over-optimise here either, "
            "so there was nothing to resist."
        )
    if why == "no significant lift":
        return (
            f"Could not tell: {m} gave no significant gain over the base policy at any N, so 'its true "
            "reward does not fall' would say nothing."
        )
    if why == "underpowered":
        return (
            f"Could not tell whether {m} resists over-optimisation: no significant fall up to N = "
            f"{num(f['n_max'])}, but one up to {num(f['upper_drop'])}{u} cannot be ruled out (underpowered)."
        )
    return f"Could not tell whether {m} resists over-optimisation ({why or 'no results'})."


def p1_5(verdict: str, f: dict) -> str:
    w, u = f.get("what", "true reward"), _unit(f)
    eps = f"ε = {_list(f['epsilons'])}"
    if verdict == "does not hold":
        return (
            f"PrivBoN gave higher {w} than PrivITP at equal privacy ({eps}): ahead at "
            f"{num(f['privbon_ahead'])} of {num(f['points'])} (N, ε) points, by up to {num(f['gap'])}{u} at "
            f"N = {num(f['gap_N'])}, ε = {num(f['gap_epsilon'])} ({_SIG})."
        )
    if verdict == "holds":
        better = f", significantly better at {num(f['privitp_ahead'])}" if f["privitp_ahead"] else ""
        return (
            f"PrivITP did at least as well as PrivBoN at equal privacy ({eps}) at all {num(f['points'])} "
            f"(N, ε) points{better}."
        )
    return (
        f"Could not tell PrivITP and PrivBoN apart at equal privacy ({eps}): no significant gap, but PrivITP "
        "being worse by more than the margin cannot be ruled out (underpowered)."
    )


def _served(sessions: list[dict]) -> str:
    """``4 vs 3 at σ = 0.5; 53–55 vs 25 at σ = 4``: prompts served, ex-post filter vs basic composition."""
    out = []
    for x in sessions:
        served = num(x["served_min"]) + (
            f"–{num(x['served_max'])}" if x["served_max"] != x["served_min"] else ""
        )
        out.append(f"{served} vs {num(x['t_basic'])} at σ = {num(x['sigma'])}")
    return "; ".join(out)


def p1_6(verdict: str, f: dict) -> str:
    budget = f" (ε = {num(f['budget_epsilon'])})" if f.get("budget_epsilon") is not None else ""
    served = _served(f["sessions"])
    if verdict == "holds":
        return (
            f"Under one budget{budget}, the ex-post filter served more prompts than basic composition "
            f"({served}), and the answers served were measurably better at σ = {_list(f['lift_sigmas'])} "
            f"({_SIG})."
        )
    if verdict == "does not hold":
        if f["overshoots"]:
            return f"A privacy filter spent more than its budget ({num(f['overshoots'])} time(s))."
        return (
            f"The ex-post filter did not always serve more prompts than basic composition ({served}){budget}."
        )
    return (
        f"Under one budget{budget}, the ex-post filter served more prompts than basic composition "
        f"({served}), but could not tell whether the answers served beat no alignment at all."
    )


def p1_7(verdict: str, f: dict) -> str:
    star = f"ε* = {num(f['eps_star'])}"
    if verdict == "holds":
        return (
            f"From {star} up, PrivBoN paid no measurable price for privacy (largest extra regret "
            f"{num(f['worst_excess'])} true-reward units), while far below ε* it did."
        )
    if verdict == "does not hold":
        return (
            f"PrivBoN paid a significant price for privacy even above {star} (extra regret "
            f"{num(f['worst_excess'])} true-reward units at ε = {num(f['worst_excess_epsilon'])})."
        )
    return f"Could not tell whether privacy is free for PrivBoN above {star}: {f['why']}."


def p1_8(verdict: str, f: dict) -> str:
    span = f"from N = {num(f['n_from'])} to {num(f['n_max'])}"
    if verdict == "holds":
        return (
            f"PrivITP's realised privacy cost stayed flat {span} (expected ε "
            f"{num(f['e_from'])} → {num(f['e_to'])}) while its worst case grew (ε_max "
            f"{num(f['eps_max_from'])} → {num(f['eps_max_to'])})."
        )
    if verdict == "does not hold":
        return (
            f"PrivITP's realised privacy cost grew with N {span} (expected ε "
            f"{num(f['e_from'])} → {num(f['e_to'])}), "
            "like its worst case."
        )
    return f"Could not tell whether PrivITP's realised privacy cost depends on N {span}: {f['why']}."


# --- paper 2 ------------------------------------------------------------------------------------------------


def slope(subject: str) -> Reader:
    """P2-1..P2-3: ``subject`` (e.g. "Sample-DP-IHT's error vs the number of pairs n") follows the theory's
    log-log slope."""

    def read(verdict: str, f: dict) -> str:
        s = f"slope {num(f['slope'])} (95% CI {num(f['slope_lo'])} to {num(f['slope_hi'])})"
        rng = f"[{num(f['low'])}, {num(f['high'])}]"
        if verdict == "holds":
            return f"{subject} follows the theory: {s}, inside the expected {rng}."
        if verdict == "does not hold":
            return f"{subject} does not follow the theory: {s}, outside the expected {rng}."
        return f"Could not tell whether {subject} follows the theory: {s} vs {rng}; {f['why']}."

    return read


def p2_4(verdict: str, f: dict) -> str:
    eps = f"ε = {_list(f['epsilons'])}"
    k = num(f["comparisons"])
    if verdict == "holds":
        return (
            f"Sparse private reward models were significantly more accurate than dense ones in all {k} "
            f"comparisons ({eps})."
        )
    if verdict == "does not hold":
        return (
            f"Sparse private reward models did not beat dense ones ({eps}): dense significantly better "
            f"in {num(f['dense_wins'])}, equally accurate (within 3 percentage points of accuracy) in "
            f"{num(f['ties'])} of {k} comparisons."
        )
    return (
        f"Could not tell whether sparse private reward models beat dense ones ({eps}): sparse significantly "
        f"better in {num(f['sparse_wins'])} of {k} comparisons ({f['why']})."
    )


def p2_5(verdict: str, f: dict) -> str:
    k = num(f["gaps"])
    if verdict == "holds":
        return (
            f"Win rates follow the paper's order (RR-IHT > Sample-DP IHT > RR > DP-SGD) on all {k} adjacent "
            f"gaps ({_SIG})."
        )
    if verdict == "does not hold":
        return (
            f"Win rates contradict the paper's order: {num(f['reversed'])} of {k} adjacent gaps reversed "
            f"({_SIG})."
        )
    if str(f.get("why", "")).startswith("regime mismatch"):
        return (
            "Could not tell whether win rates follow the paper's order: a method could not learn at the "
            f"available number of pairs ({f['why']})."
        )
    return (
        f"Could not tell whether win rates follow the paper's order: {num(f['in_order'])} of {k} gaps "
        f"resolved (about {num(f['prompts_needed'])} prompts would be needed; underpowered)."
    )


def p2_6(verdict: str, f: dict) -> str:
    k, steps = num(f["comparisons"]), f"{num(f['steps'])} training steps"
    if verdict == "holds":
        return (
            f"Policies trained on sparse private reward models got higher gold reward at no more KL than "
            f"dense ones in all {k} comparisons ({_SIG}; {steps})."
        )
    if verdict == "does not hold":
        return (
            f"Policies trained on dense private reward models did significantly better in "
            f"{num(f['dense_better'])} of {k} comparisons ({steps})."
        )
    return (
        f"Could not tell whether sparse private reward models give better policies: "
        f"{num(f['sparse_better'])} of {k} comparisons significant ({steps}; underpowered)."
    )


# --- beyond -------------------------------------------------------------------------------------------------


def b_3(verdict: str, f: dict) -> str:
    """One frontier: per ε, the route with the most gold at the headline KL budget, its lead over the
    runner-up and whether that lead is significant (Holm across the comparisons)."""
    comps = [c for c in f.get("comparisons", []) if c["budget"] == f.get("headline_budget")]
    if not comps:
        return f"Could not tell which private alignment route wins: {f.get('why') or 'nothing to compare'}."
    parts = []
    for c in comps:
        win, run = c["winner_label"], c["runner_up_label"]
        kinds = (c.get("winner_kind"), c.get("runner_up_kind"))
        if None not in kinds and kinds[0] != kinds[1]:  # guarantees of different strength: say which is which
            win, run = f"{win} [{kinds[0]}]", f"{run} [{kinds[1]}]"
        lead = f"{'+' if c['diff'] >= 0 else ''}{c['diff']:.2f} over {run}"
        if c["verdict"] == "does not hold":
            parts.append(
                f"at ε = {num(c['epsilon'])}, {win} and {run} give the same "
                f"gold at KL ≤ {num(c['budget'])} nat within ±{num(f.get('margin', 0.02))}"
            )
        else:
            sig = _SIG if c["significant"] else "not significant at α = 0.05"
            parts.append(
                f"at ε = {num(c['epsilon'])}, {win} gives the most gold at KL ≤ {num(c['budget'])} nat "
                f"({lead}, {sig})"
            )
    s = "; ".join(parts)
    if any(c.get("winner_kind") == "label-DP" for c in comps):
        s += " (label-DP protects a pair's label only, its texts are public; sample-DP the whole pair)"
    if f.get("per_answer_routes"):
        s += " (PrivBoN pays its ε per answer: k answers cost kε)"
    if verdict == "holds":
        return s[:1].upper() + s[1:] + "."
    if verdict == "does not hold":
        return "No single route wins everywhere: " + s + "."
    return "Could not tell which route wins everywhere (underpowered): " + s + "."


def b_1(verdict: str, f: dict) -> str:
    if verdict == "holds":
        return (
            f"Training a private reward model once beat per-query PrivBoN at the same total privacy from "
            f"T = {num(f['crossover_T'])} quer{'y' if f['crossover_T'] == 1 else 'ies'} on ({_SIG})."
        )
    if verdict == "does not hold":
        return (
            f"Per-query PrivBoN beat a privately trained reward model at the same total privacy even at "
            f"T = {num(f['t_max'])} queries ({_SIG})."
        )
    return (
        f"Could not tell whether a privately trained reward model beats per-query PrivBoN up to T = "
        f"{num(f['t_max'])} queries (underpowered)."
    )


def b_2(verdict: str, f: dict) -> str:
    eps = f"ε = {_list(f['epsilons'])}"
    if verdict == "holds":
        return (
            f"The membership attack exposed plain BoN (audit ε ≥ {num(f['bon_lower_bound'])}) but never "
            f"beat PrivBoN's stated privacy ({eps})."
        )
    if verdict == "does not hold":
        return (
            f"The membership attack found more leakage than PrivBoN claims (audit ε ≥ "
            f"{num(f['worst_lower_bound'])} against a claimed ε = {num(f['worst_claimed'])})."
        )
    return (
        f"Could not tell whether PrivBoN leaks less than claimed ({eps}): the attack found no leak even in "
        "plain BoN (no power)."
    )


def u_1(verdict: str, f: dict) -> str:
    eps = num(f.get("stated_epsilon"))
    per, usr = f.get("per_label_bounds") or [], f.get("user_bounds") or []
    if verdict == "holds":
        return (
            f"An attacker inferred a heavy annotator's type from the per-label ε = {eps} model beyond ε "
            f"per person (audit ε ≥ {num(min(per))}, every seed) but never from the user-level ε = {eps} "
            f"model (audit ε ≤ {num(max(usr))})."
        )
    if verdict == "does not hold":
        return (
            f"The audit found more than ε = {eps} per person against the user-level model (ε ≥ "
            f"{num(max(usr))}): its per-person guarantee failed."
        )
    return (
        f"Could not tell whether user-level training protects a heavy annotator better at ε = {eps}: the "
        "attack on the per-label model did not exceed ε in every seed (no power), or too few seeds."
    )


def u_2(verdict: str, f: dict) -> str:
    cells = f.get("cells") or []
    k = f.get("k_public")
    diffs = "; ".join(
        f"{c['method']} ε = {num(c['epsilon'])}: {c['diff'] * 100:+.1f} accuracy points" for c in cells
    )
    if verdict == "holds":
        return (
            f"At equal privacy per person, keeping ≤ {k} labels per annotator beat group privacy ({diffs}; "
            "significant)."
        )
    if verdict == "does not hold":
        return (
            f"At equal privacy per person, keeping ≤ {k} labels per annotator was no better than group "
            f"privacy in some cell ({diffs})."
        )
    return (
        f"Could not tell whether keeping ≤ {k} labels per annotator beats group privacy at equal privacy per "
        f"person ({diffs or 'no paired seeds'})."
    )


#: Claim id → reader; a claim of :data:`~privalign.experiments.report.CLAIMS` may also name its own.
READERS: dict[str, Reader] = {
    "P1-1": p1_1,
    "P1-2": monotone,
    "P1-3": monotone,
    "P1-4": monotone,
    "P1-5": p1_5,
    "P1-6": p1_6,
    "P1-7": p1_7,
    "P1-8": p1_8,
    "P2-1": slope("Sample-DP-IHT's error vs the number of pairs n"),
    "P2-2": slope("RR-IHT's error vs the sparsity s*"),
    "P2-3": slope("RR-IHT's error vs the dimension d"),
    "P2-4": p2_4,
    "P2-5": p2_5,
    "P2-6": p2_6,
    "B-1": b_1,
    "B-2": b_2,
    "U-1": u_1,
    "U-2": u_2,
    "B-3": b_3,
}


def _short_pool(label: str) -> str:
    """``synthetic (planted reward hacking)`` → ``Synthetic pool``; ``real: imdb-smollm2.jsonl.gz`` → ``Real
    pool imdb-smollm2``: the pool's name without its details."""
    label = str(label)
    if label.startswith("real:"):
        return "Real pool " + label.split(":", 1)[1].strip().split(".")[0]
    head = re.split(r"[(;:,\[]", label, maxsplit=1)[0].strip() or label
    return head[:1].upper() + head[1:] + ("" if " " in head or not head.isalpha() else " pool")


def _one(reader: Reader | None, claim_text: str, verdict: str, facts: dict) -> str:
    if reader is None or not facts:
        return generic(claim_text, verdict, facts)
    try:
        return reader(verdict, facts)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):  # facts lack what the reader needs
        return generic(claim_text, verdict, facts)


def reading(
    claim_text: str, verdict: str, facts: dict | None, reader: Reader | None = None, *, measured: str = ""
) -> str:
    """The claim's one line in plain words.

    ``facts["runs"]`` (a claim decided on several runs, e.g. the synthetic and the IMDb pool) is read run by
    run, each prefixed with its pool. ``not run`` and ``not testable here`` say so with their reason
    (``measured``).
    """
    if verdict == "not run":
        return f"Not run in this report ({measured})." if measured else "Not run in this report."
    if verdict == "not testable here":
        return f"Not tested here: {measured}." if measured else "Not tested here."
    facts = facts or {}
    runs = facts.get("runs")
    if runs and len(runs) > 1:
        return " ".join(
            f"{_short_pool(r.get('pool') or r['experiment'])}: {_one(reader, claim_text, r['verdict'], r)}"
            for r in runs
        )
    if runs:
        facts = runs[0]
        verdict = facts.get("verdict", verdict)
    return _one(reader, claim_text, verdict, facts)
