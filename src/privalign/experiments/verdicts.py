"""Verdict rules of the claims table: three-valued ("holds" / "does not hold" / "inconclusive"), each
with its power stated, computed from ``results.jsonl`` records only.

Statistics used (α stated with every verdict, exact critical values from scipy):

* **Paired per-prompt differences** (:func:`paired_diff`): two curves evaluated on the same prompts (the
  records carry ``prompts`` and per-prompt lifts ``lift_pp``) are compared by the mean and standard error
  of the per-prompt differences; tests are one-sided paired t-tests with critical value
  ``t_{1−α/k, P−1}`` (Bonferroni over the k comparisons a rule makes). Prompt-level variation cancels,
  which is what makes small N-to-N differences detectable.
* **Power** is reported as the *minimum detectable difference* ``(t_{1−α/k} + z_{0.8})·SE``: the true
  difference the test would detect with probability ≈ 0.8 at the measured SE.
* **Exact McNemar** (:func:`mcnemar_exact`) for two classifiers on the same test pairs (binomial test on
  the discordant pairs); **equivalence** of two classifiers by a paired TOST (:func:`paired_tost`).
* Every "does not hold" branch that fires on *any one* of k comparisons tests each at α/k (Bonferroni), so
  that the branch's family-wise false-positive rate is at most α; the comparisons of one curve's lift at
  N_max against every smaller N (P1-1..P1-4) use instead the joint critical value of the smallest paired t
  over those N under random sign flips of whole prompts (max-t; same family-wise α, but it uses the strong
  correlation between neighbouring N, which Bonferroni ignores, and assumes each prompt's differences are
  symmetric about zero under the null); a "holds" branch that needs *all* k is an
  intersection-union test and is valid at α per comparison.

Every rule returns an :class:`Outcome`, which unpacks as ``(verdict, measured)``: ``measured`` names the
numbers, α and the power; ``outcome.facts`` holds the same numbers by name, from which each claim writes its
one-line reading in plain words (:mod:`privalign.experiments.plain`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from privalign.alignment.selectors import label as method_label
from privalign.experiments.records import fixed_label, of_method
from privalign.stats import Z80, mdd, paired_tost, replicated_test, t_crit

__all__ = [
    "all_of",
    "ALPHA",
    "Outcome",
    "paired_diff",
    "mcnemar_exact",
    "EQUIVALENCE_MARGIN",
    "bon_degradation",
    "monotone_rule",
    "monotone_across_epsilon",
    "p1_1_rule",
    "p1_5_rule",
    "p1_6_rule",
    "p1_7_rule",
    "p1_8_rule",
    "slope_rule",
    "mcnemar_rule",
    "seed_paired_diff",
    "replicated_rule",
    "MIN_FIT_SEEDS",
    "order_rule",
    "b1_rule",
]

#: Significance level of every test in the claims table (one-sided unless stated).
ALPHA = 0.05
#: Differences and standard errors below this are rounding (e.g. two curves with the same σ and seed).
_TINY = 1e-12


class Outcome(tuple):
    """A rule's result: a ``(verdict, measured)`` pair (it unpacks and compares as one) that also carries
    ``facts``, the decisive numbers by name (pool, methods, N, ε, differences, whether significant, why
    undecided), for the claim's plain-language reading. A rule that returns a bare pair has no facts: its
    claim gets a reading from the verdict alone."""

    facts: dict

    def __new__(cls, verdict: str, measured: str, facts: dict | None = None) -> Outcome:
        self = super().__new__(cls, (verdict, measured))
        self.facts = dict(facts or {})
        return self

    def __getnewargs__(self) -> tuple:  # (copy/pickle: rebuild with the facts)
        return (self[0], self[1], self.facts)


def all_of(verdicts: list[str]) -> str:
    """Combine the verdicts of comparisons that must *all* hold for a claim to hold.

    ``"does not hold"`` if any comparison does not hold (one counter-example refutes the claim); ``"holds"``
    if there is at least one comparison and every one holds; else ``"inconclusive"`` (an empty list is
    inconclusive: nothing was compared). Each comparison's own test carries its error rate (a rule that
    combines k comparisons Bonferroni-corrects them before calling this).
    """
    vs = list(verdicts)
    if "does not hold" in vs:
        return "does not hold"
    return "holds" if vs and all(v == "holds" for v in vs) else "inconclusive"


def facts_of(result: tuple) -> dict:
    """The facts of a rule's result (``{}`` for a bare ``(verdict, measured)`` pair)."""
    return dict(getattr(result, "facts", None) or {})


def paired_diff(a: dict, b: dict) -> dict | None:
    """Mean and SE over prompts of ``b.lift_pp − a.lift_pp``, matched on the records' ``prompts``.

    Returns ``None`` when the records carry no per-prompt values or share fewer than 2 prompts.
    """
    if not a.get("lift_pp") or not b.get("lift_pp"):
        return None
    pa = dict(zip(a.get("prompts") or range(len(a["lift_pp"])), a["lift_pp"]))
    pb = dict(zip(b.get("prompts") or range(len(b["lift_pp"])), b["lift_pp"]))
    common = sorted(set(pa) & set(pb))
    if len(common) < 2:
        return None
    d = np.array([pb[k] - pa[k] for k in common], dtype=float)
    se = float(d.std(ddof=1) / math.sqrt(d.size))
    return {
        "mean": float(d.mean()),
        "se": se,
        "n": int(d.size),
        "df": int(d.size - 1),
        "t": float(d.mean() / se)
        if se > 0
        else (math.inf if d.mean() > 0 else -math.inf if d.mean() < 0 else 0.0),
    }


def mcnemar_exact(b: int, c: int) -> float:
    """One-sided exact McNemar p-value for "the first classifier is more accurate": P(X ≥ b) with
    X ~ Binomial(b + c, 1/2), ``b`` = pairs only the first gets right, ``c`` = only the second."""
    n = b + c
    if n == 0:
        return 1.0
    return float(stats.binom.sf(b - 1, n, 0.5))


#: P2-4's equivalence margin (accuracy): a sparse gain smaller than 0.03 is not "beating" the dense method.
EQUIVALENCE_MARGIN = 0.03


def _series(records: list[dict], method: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        if r.get("method") == method and r.get("lift") is not None:
            out.setdefault(r["variant"], []).append(r)
    for v in out.values():
        v.sort(key=lambda r: r["N"])
    return out


def _diff_matrix(rows: list[dict]) -> np.ndarray | None:
    """Per-prompt differences ``lift(N_max) − lift(N)`` (prompts × smaller N) on the prompts every row
    shares, or None when a row has no per-prompt values."""
    if not all(r.get("lift_pp") for r in rows):
        return None
    maps = [dict(zip(r.get("prompts") or range(len(r["lift_pp"])), r["lift_pp"])) for r in rows]
    common = sorted(set.intersection(*(set(m) for m in maps)))
    if len(common) < 2:
        return None
    last = np.array([maps[-1][p] for p in common], dtype=float)
    return np.array([[last[i] - m[p] for m in maps[:-1]] for i, p in enumerate(common)], dtype=float)


#: Fewest prompts for the sign-flip max-t critical value (2^6 = 64 flips resolve α = 0.05); below it,
#: Bonferroni over N.
_MIN_FLIP_PROMPTS = 6


def _joint_crit(rows: list[dict], alpha: float, k: int, df: int) -> tuple[float, str]:
    """The one-sided critical value of the paired t statistics of all N jointly: the sign-flip max-t
    value (:func:`privalign.pipeline.analysis.max_t_signflip`, family-wise α over the N, using their strong
    correlation) when every row has per-prompt values on ≥ ``_MIN_FLIP_PROMPTS`` shared prompts, else the
    Bonferroni value ``t_{1−α/k, df}``."""
    D = _diff_matrix(rows)
    if D is None or D.shape[0] < _MIN_FLIP_PROMPTS or k < 2:
        return t_crit(df, alpha, k), "Bonferroni"
    from privalign.pipeline.analysis import max_t_signflip

    res = max_t_signflip(D, alpha=alpha, random_state=np.random.default_rng(0))
    if res["t_crit"] is None:
        return t_crit(df, alpha, k), "Bonferroni"
    return float(-res["t_crit"]), "joint max-t (sign flips of prompts)"


def _drop_tests(rows: list[dict], alpha: float = ALPHA) -> dict:
    """Paired tests of ``lift(N_max) < lift(N)`` for every smaller N, family-wise α over them (the joint
    sign-flip max-t critical value when the rows carry per-prompt values, else Bonferroni)."""
    last = rows[-1]
    k = max(len(rows) - 1, 1)
    tests = []
    for r in rows[:-1]:
        d = paired_diff(r, last)  # last − r: negative = drop
        if d is None:
            d = {
                "mean": last["lift"] - r["lift"],
                "se": math.sqrt(last["lift_se"] ** 2 + r["lift_se"] ** 2),
                "n": last.get("n_prompts", 2),
                "df": max(last.get("n_prompts", 2) - 1, 1),
                "unpaired": True,
            }
        tests.append((r, d))
    if any(d.get("unpaired") for _, d in tests):
        crit, how = t_crit(min(d["df"] for _, d in tests), alpha, k), "Bonferroni"
    else:
        crit, how = _joint_crit(rows, alpha, k, min(d["df"] for _, d in tests))
    sig = [
        (r, d)
        for r, d in tests
        if (d["se"] > _TINY and d["mean"] / d["se"] < -crit) or (d["se"] <= _TINY and d["mean"] < -_TINY)
    ]
    # the largest drop (point estimate) and its one-sided upper confidence bound
    worst_r, worst = min(tests, key=lambda x: x[1]["mean"])
    upper_drop = -worst["mean"] + crit * worst["se"]
    return {
        "last": last,
        "tests": tests,
        "crit": crit,
        "how": how,
        "k": k,
        "significant": sig,
        "worst_r": worst_r,
        "worst": worst,
        "upper_drop": upper_drop,
        "paired": not any(d.get("unpaired") for _, d in tests),
    }


def bon_degradation(records: list[dict], *, min_n: int = 64, alpha: float = ALPHA) -> dict:
    """The positive control: does BoN's lift at the largest N fall significantly below its lift at some
    smaller N (paired per-prompt one-sided t-tests, family-wise α over the smaller N: :func:`_drop_tests`)?

    Returns ``{"status": "degrades" | "no" | "too small" | "missing", "text", "drop", "info"}``.
    """
    s = _series(records, method_label("bon"))
    if not s:
        return {"status": "missing", "text": "no BoN results (no positive control)"}
    rows = next(iter(s.values()))
    if len(rows) < 3 or rows[-1]["N"] < min_n:
        return {
            "status": "too small",
            "text": f"N too small: BoN measured at N ≤ {rows[-1]['N']} ({len(rows)} values; "
            f"the positive control needs ≥ 3 values of N and N_max ≥ {min_n})",
        }
    t = _drop_tests(rows, alpha)
    w, wr = t["worst"], t["worst_r"]
    power = (t["crit"] + Z80) * w["se"]
    text = (
        f"BoN lift {t['last']['lift']:.3g} at N={t['last']['N']} vs {wr['lift']:.3g} at N={wr['N']}: paired "
        f"drop {-w['mean']:.3g} ± {w['se']:.3g} SE over {w['n']} prompts (one-sided α={alpha:g}, {t['how']} "
        f"over {t['k']} N, t_crit={t['crit']:.3g}; detectable drop at 80% power ≈ {power:.3g})"
    )
    facts = {
        "bon_drop": -w["mean"],
        "bon_from_N": wr["N"],
        "n_max": t["last"]["N"],
        "bon_upper_drop": t["upper_drop"],
        "bon_detectable": power,
    }
    if t["significant"]:
        return {"status": "degrades", "text": text, "drop": -w["mean"], "info": t, "facts": facts}
    return {"status": "no", "text": text, "drop": -w["mean"], "info": t, "facts": facts}


def _pool_of(records: list[dict]) -> str:
    return str(next((r.get("pool_label") for r in records if r.get("pool_label")), "pool unknown"))


def _truth(records: list[dict]) -> dict:
    """What the lifts measure, for the plain reading: accuracy (in percentage points) on a pool with a 0/1
    truth, else the true reward (in its own units)."""
    acc = any(r.get("truth_kind") == "accuracy" for r in records)
    return {"what": "accuracy" if acc else "true reward", "unit": " points" if acc else ""}


def monotone_rule(records: list[dict], method: str, *, alpha: float = ALPHA) -> tuple[str, str]:
    """P1-2..P1-4 on one run: ``method`` is scaling-monotonic.

    Decided only with a positive control (BoN degrades significantly in the same run). Then:
    ``does not hold`` if some variant's lift at N_max is significantly below its lift at a smaller N
    (paired, one-sided α, Bonferroni); ``holds`` if no drop is significant, the curve has a significant
    lift somewhere, **and** the one-sided upper confidence bound of the largest drop is below
    min(½ · BoN's measured drop, ¼ · the curve's best lift) (the test could have seen a degradation that
    large); else ``inconclusive``. Without the control: ``inconclusive:
    no over-optimisation on this pool`` (or ``N too small``).
    """
    pool = _pool_of(records)
    ctrl = bon_degradation(records, alpha=alpha)
    if ctrl["status"] != "degrades":
        why = (
            "N too small"
            if ctrl["status"] == "too small"
            else "no over-optimisation on this pool"
            if ctrl["status"] == "no"
            else "no positive control"
        )
        return Outcome(
            "inconclusive",
            f"[{pool}] {why}: {ctrl['text']}",
            {"pool": pool, "method": method, "why": why, **_truth(records), **ctrl.get("facts", {})},
        )
    series = _series(records, method)
    if not series:
        return Outcome("inconclusive", f"[{pool}] no {method} results", {"pool": pool, "method": method})
    parts, verdicts, facts = [], [], []
    for name, rows in sorted(series.items()):
        if len(rows) < 3:
            verdicts.append("inconclusive")
            parts.append(f"{name}: only {len(rows)} N values")
            continue
        t = _drop_tests(rows, alpha)
        w, wr = t["worst"], t["worst_r"]
        top = max(rows, key=lambda r: r["lift"])
        has_lift = top["lift_se"] > 0 and top["lift"] / top["lift_se"] > t_crit(
            max(top.get("n_prompts", 2) - 1, 1), alpha
        )
        # what must be excluded: a drop of half BoN's (the control's size) or a quarter of this curve's own
        # best lift, whichever is smaller
        margin = min(0.5 * ctrl["drop"], 0.25 * top["lift"])
        if t["significant"]:
            v = "does not hold"
        elif not has_lift:
            v = "inconclusive"
        elif t["upper_drop"] < margin:
            v = "holds"
        else:
            v = "inconclusive"
        verdicts.append(v)
        facts.append(
            {
                "verdict": v,
                "drop": -w["mean"],
                "from_N": wr["N"],
                "n_max": t["last"]["N"],
                "upper_drop": t["upper_drop"],
                "margin": margin,
                "why": "no significant lift"
                if not has_lift
                else "underpowered"
                if v == "inconclusive"
                else "",
            }
        )
        last = t["last"]
        priv = (
            f" [ε={last['epsilon']:.3g}]"
            if last.get("epsilon") is not None
            else f" [at N={last['N']}: ε_max={last['epsilon_max']:.3g}, "
            f"E[ε]={last.get('expected_epsilon_realized') or 0:.3g}, δ={last.get('delta')}]"
            if last.get("epsilon_max") is not None
            else ""
        )
        parts.append(
            (
                f"{name}: no significant lift at any N (best {top['lift']:.3g} ± {top['lift_se']:.3g}): "
                "monotonicity would be vacuous; "
                if not has_lift
                else ""
            )
            + f"{name}{priv}: lift {t['last']['lift']:.3g} at N={t['last']['N']}, largest paired drop "
            f"{-w['mean']:.3g} ± {w['se']:.3g} (vs N={wr['N']}), upper {100 * (1 - alpha):.0f}% bound "
            f"{t['upper_drop']:.3g} vs margin min(½·BoN drop, ¼·best lift) = {margin:.3g}"
            + ("" if t["paired"] else " [unpaired SE]")
        )
    verdict = all_of(verdicts)
    decisive = next((f for f in facts if f["verdict"] == verdict), {"why": "too few N values"})
    return Outcome(
        verdict,
        f"[{pool}] positive control: {ctrl['text']}. " + "; ".join(parts),
        {"pool": pool, "method": method, **_truth(records), **ctrl["facts"], **decisive},
    )


def _bon_rows(records: list[dict]) -> list[dict]:
    """The plain best-of-N curve's rows (the positive control of the over-optimisation rules)."""
    return of_method(records, "bon")


def monotone_across_epsilon(records: list[dict], method: str = "PrivBoN", *, alpha: float = ALPHA) -> Outcome:
    """P1-2 at every ε of a privacy sweep: :func:`monotone_rule` on BoN (the positive control) and the
    ``method`` curve of each ε separately, so the verdict says at which ε the claim holds.

    ``holds`` if it holds at every ε; ``does not hold`` if it does not hold at some ε (the claim is stated
    for PrivBoN without a range of ε; the text names the ε where it holds, e.g. only at strong privacy);
    ``inconclusive`` otherwise. Each ε is decided by its own paired tests at ``alpha`` (Bonferroni over the
    N of that ε's curve); there is no correction across ε, which the text lists one by one.
    """
    eps = sorted(
        {r["epsilon"] for r in records if r.get("method") == method and r.get("epsilon") is not None}
    )
    if not eps:
        return Outcome(
            "inconclusive", f"[{_pool_of(records)}] no {method} results with an ε", {"method": method}
        )
    base = _bon_rows(records)
    by: dict[str, list[float]] = {}
    details = []
    for e in eps:
        v, m = monotone_rule(
            base + [r for r in records if r.get("method") == method and r.get("epsilon") == e],
            method,
            alpha=alpha,
        )
        by.setdefault(v, []).append(e)
        details.append(f"ε={e:g}: {v}")
    summary = "; ".join(f"{v} at ε ∈ {{{', '.join(f'{e:g}' for e in es)}}}" for v, es in by.items())
    verdict = all_of(list(by))
    ctrl = bon_degradation(records, alpha=alpha)
    facts = {
        "method": method,
        "across_epsilon": {v: [float(e) for e in es] for v, es in by.items()},
        "pool_label": _pool_of(records),
    }
    return Outcome(
        verdict,
        f"[{_pool_of(records)}] {method} across ε: {summary} (positive control: {ctrl['text']})",
        facts,
    )


def p1_1_rule(
    records: list[dict], *, alpha: float = ALPHA, planted_hack_rate: float | None = None
) -> tuple[str, str]:
    """P1-1 on one run: BoN is not scaling-monotonic (its lift falls past some N).

    ``holds`` if BoN degrades significantly (the positive control). ``does not hold`` only on a synthetic
    pool with planted reward hacks that BoN can reach (expected hacks per pool ``N_max·hack_rate ≥ 2``)
    where BoN's largest drop has an upper confidence bound below 10% of its best lift (BoN stayed
    monotone although hacks were there to find). Otherwise ``inconclusive on this pool`` (a real pool
    that does not over-optimise says nothing against the claim).
    """
    pool = _pool_of(records)
    ctrl = bon_degradation(records, alpha=alpha)
    facts = {"pool": pool, **_truth(records), **ctrl.get("facts", {})}
    if ctrl["status"] == "degrades":
        return Outcome("holds", f"[{pool}] {ctrl['text']}", facts)
    if ctrl["status"] in ("missing", "too small"):
        return Outcome("inconclusive", f"[{pool}] {ctrl['text']}", {**facts, "why": ctrl["text"]})
    info = ctrl["info"]
    best = max(r["lift"] for r in next(iter(_series(records, method_label("bon")).values())))
    n_max = info["last"]["N"]
    if planted_hack_rate and n_max * planted_hack_rate >= 2 and best > 0 and info["upper_drop"] < 0.1 * best:
        return Outcome(
            "does not hold",
            f"[{pool}] planted hacks reachable (N_max·hack_rate = {n_max * planted_hack_rate:.1f}) "
            f"but no drop: upper bound {info['upper_drop']:.3g} < 10% of best lift {best:.3g}; "
            + ctrl["text"],
            {**facts, "planted_hacks": n_max * planted_hack_rate},
        )
    return Outcome(
        "inconclusive",
        f"[{pool}] inconclusive on this pool: BoN does not degrade significantly; {ctrl['text']}",
        {**facts, "why": "no significant fall"},
    )


def p1_5_rule(
    records: list[dict], *, match: str = "worst", alpha: float = ALPHA, margin_frac: float = 0.1
) -> tuple[str, str]:
    """P1-5: PrivITP matches or beats PrivBoN at equal privacy (``match`` = the matching used).

    At every (N, ε) with both curves: paired per-prompt difference d = PrivITP − PrivBoN. ``does not hold``
    if PrivBoN is significantly ahead somewhere (one-sided α, Bonferroni over the k grid points);
    ``holds`` if everywhere the lower confidence bound of d exceeds −margin (non-inferiority, margin =
    ``margin_frac`` × |BoN lift at that N|, or × |PrivBoN lift| without BoN); else ``inconclusive``.
    """
    from privalign.experiments.matching import MATCH_NOTE

    pool = _pool_of(records)
    eps_of = lambda r: r.get("epsilon") if r.get("epsilon") is not None else r.get("epsilon_target")
    itp = [r for r in of_method(records, "privitp", privacy_match=match) if eps_of(r) is not None]
    if not itp:
        got = sorted({str(r.get("privacy_match")) for r in of_method(records, "privitp")})
        return (
            "inconclusive",
            f"[{pool}] no PrivITP curve matched by '{match}' (found: {got}); not at equal privacy",
        )
    pairs = []
    for a in itp:
        e = eps_of(a)
        b = [
            r
            for r in of_method(records, "privbon", N=a["N"])
            if r.get("epsilon") is not None and abs(r["epsilon"] - e) <= 1e-9 * e
        ]
        if b:
            d = paired_diff(b[0], a)
            if d is None:
                d = {
                    "mean": a["lift"] - b[0]["lift"],
                    "se": math.sqrt(a["lift_se"] ** 2 + b[0]["lift_se"] ** 2),
                    "n": a.get("n_prompts", 2),
                    "df": max(a.get("n_prompts", 2) - 1, 1),
                }
            bon = [r for r in _bon_rows(records) if r["N"] == a["N"]]
            ref = abs(bon[0]["lift"]) if bon else abs(b[0]["lift"])
            pairs.append((a, b[0], d, margin_frac * ref))
    if not pairs:
        return "inconclusive", f"[{pool}] no PrivBoN curve at the PrivITP curves' ε"
    k = len(pairs)
    crit = t_crit(min(d["df"] for *_, d, _ in pairs), alpha, k)
    worse = [(a, b, d, m) for a, b, d, m in pairs if d["mean"] + crit * d["se"] < 0]
    noninf = all(d["mean"] - crit * d["se"] > -m for a, b, d, m in pairs)
    ahead = sum(d["mean"] - crit * d["se"] > 0 for a, b, d, m in pairs)
    lines = []
    for a, bb, d, _m in sorted(pairs, key=lambda x: (x[0]["N"], eps_of(x[0]))):
        lines.append(
            f"N={a['N']} ε={eps_of(a):g}: PrivITP {a['lift']:.3g} "
            f"(ε_max={a.get('epsilon_max') or float('nan'):.3g}, "
            f"E[ε]={a.get('expected_epsilon_realized') or float('nan'):.3g}, δ={a.get('delta')}) − PrivBoN "
            f"{bb['lift']:.3g} = {d['mean']:+.3g} ± {d['se']:.3g}"
        )
    head = (
        f"[{pool}; PrivITP matched: {MATCH_NOTE.get(match, match)}] {k} (N, ε) points, paired one-sided "
        f"α={alpha:g} Bonferroni (t_crit={crit:.3g}), non-inferiority margin {margin_frac:g}×|BoN lift|: "
        f"PrivBoN significantly ahead at {len(worse)}, PrivITP significantly ahead at {ahead}. "
    )
    verdict = "does not hold" if worse else ("holds" if noninf else "inconclusive")
    gap_a, gap_b, gap, _ = min(pairs, key=lambda x: x[2]["mean"])  # PrivBoN's largest lead (or smallest lag)
    facts = {
        "pool": pool,
        **_truth(records),
        "epsilons": sorted({float(eps_of(a)) for a, *_ in pairs}),
        "ns": sorted({int(a["N"]) for a, *_ in pairs}),
        "points": k,
        "privbon_ahead": len(worse),
        "privitp_ahead": ahead,
        "gap": -gap["mean"],  # PrivBoN − PrivITP at the point where PrivBoN leads most
        "gap_N": gap_a["N"],
        "gap_epsilon": float(eps_of(gap_a)),
        "why": "" if verdict != "inconclusive" else "underpowered",
    }
    return Outcome(verdict, head + "; ".join(lines), facts)


def p1_6_rule(records: list[dict], *, alpha: float = ALPHA) -> tuple[str, str]:
    """P1-6: the ex-post filter serves more prompts than basic composition under a fixed budget, and the
    served prompts are worth something.

    ``does not hold`` if some session serves ≤ T_basic or any filter overshoots its budget. ``holds`` if
    every session serves > T_basic, nothing overshoots, and at some σ the mean true-reward lift per served
    prompt is significantly > 0 (one-sided t-test over served prompts at α, Bonferroni over σ). If the
    count advantage holds but no σ's served prompts have a measurable lift: ``inconclusive`` (serving
    noise is not a benefit).
    """
    allr = records
    recs = [r for r in allr if r.get("accounting") == "ex-post filter"]
    if not recs:
        return "inconclusive", "no ex-post filter rows"
    over = [
        r
        for r in allr
        if (
            "spent_epsilon" in r
            and r.get("accounting") != "basic composition"
            and r["spent_epsilon"] > r["budget_epsilon"] + 1e-9
        )
        or ("spent_rho" in r and r["spent_rho"] > r["rho_budget"] + 1e-12)
    ]
    count_ok = all(r["served"] > r["t_basic"] for r in recs)
    by_sigma: dict = {}
    for r in recs:
        by_sigma.setdefault(r["sigma"], []).append(r)
    k = len(by_sigma)
    parts, lift_sig, sig_sigmas = [], [], []
    for s, rows in sorted(by_sigma.items()):
        lifts = [v for r in rows for v in (r.get("served_lifts") or [])]
        txt = (
            f"σ={s:g}: served {min(r['served'] for r in rows)}–{max(r['served'] for r in rows)} over "
            f"{len(rows)} sessions vs T_basic {rows[0]['t_basic']}"
            + (" (pool exhausted)" if any(r.get("pool_exhausted") for r in rows) else "")
        )
        if len(lifts) >= 2:
            x = np.asarray(lifts, float)
            m, se = float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size))
            crit = t_crit(x.size - 1, alpha, k)
            sig = se > 0 and m / se > crit
            lift_sig.append(sig)
            if sig:
                sig_sigmas.append(s)
            txt += (
                f"; lift per served prompt {m:+.4f} ± {se:.4f} over {x.size} prompts "
                f"({'significant' if sig else 'not significant'} at one-sided α={alpha:g}/{k}; detectable ≈ "
                f"{mdd(se, x.size - 1, alpha, k):.4f})"
            )
        else:
            txt += "; no per-prompt lifts recorded"
        parts.append(txt)
    if over or not count_ok:
        verdict = "does not hold"
    elif any(lift_sig):
        verdict = "holds"
    else:
        verdict = "inconclusive"
    tail = f"; {len(over)} OVERSHOOT(S)" if over else "; no overshoot"
    if verdict == "inconclusive":
        tail += (
            "; more prompts served, but at no σ do the served answers have a measurable lift over the base "
            "policy"
        )
    facts = {
        "sessions": [
            {
                "sigma": sg,
                "served_min": min(r["served"] for r in rows),
                "served_max": max(r["served"] for r in rows),
                "t_basic": rows[0]["t_basic"],
            }
            for sg, rows in sorted(by_sigma.items())
        ],
        "lift_sigmas": sig_sigmas,
        "budget_epsilon": recs[0].get("budget_epsilon"),
        "overshoots": len(over),
        "fewer": not count_ok,
        "lift_significant": any(lift_sig),
    }
    return Outcome(verdict, "; ".join(parts) + tail, facts)


def p1_7_rule(
    records: list[dict], *, alpha: float = ALPHA, below: float = 0.25, rel_tol: float = 0.02
) -> tuple[str, str]:
    """P1-7 (relative test): at ε ≥ ε* PrivBoN need pay nothing extra for privacy; well below ε* it does.

    The curve tested at ε ≥ ε* is the spec's rule σ = max(2Δ_r/ε, σ_reg) (at ε ≥ ε*, σ = σ_reg: adding more
    noise than 2Δ_r/ε is still ε-DP), with ε*, σ_reg, ε_RM and C estimated on calibration prompts disjoint
    from the evaluation prompts. Best = the smallest regret over every σ in the run (both curves, every
    ε, and ε = ∞). With paired per-prompt differences (one-sided α, Bonferroni over the comparisons), an
    excess "is significant" if it is significantly above ``rel_tol`` × the best regret (2%: differences
    from rounding σ are no cost):
    ``does not hold`` if some grid ε ≥ ε* has regret significantly above the best;
    ``holds`` if none does **and** the control works: some ε ≤ ``below``·ε* has regret significantly above
    the best (the test can see a privacy cost); else ``inconclusive`` (grid does not bracket ε*, or the
    control fails: no power). The plain σ = 2Δ_r/ε curve's excess at ε ≥ ε* is reported too.
    """
    recs = [r for r in records if r.get("regret") is not None]
    plain = sorted(
        [r for r in recs if r.get("variant") == "plain" and r.get("epsilon") is not None],
        key=lambda r: r["epsilon"],
    )
    rule = sorted(
        [r for r in recs if r.get("variant") == "sigma_reg" and r.get("epsilon") is not None],
        key=lambda r: r["epsilon"],
    )
    if not plain or not rule:
        return (
            "inconclusive",
            "no finite-ε results of both PrivBoN curves (σ = 2Δ/ε and σ = max(2Δ/ε, σ_reg))",
        )
    e_star = plain[0]["eps_star"]
    src = plain[0].get("sigma_reg_source", "")
    best = min(recs, key=lambda r: r["regret"])

    def rows(r):  # regret per prompt = J*_p − value_p = −lift_p + const: the paired difference uses −regret
        return (
            {"lift_pp": [-v for v in r["regret_pp"]], "prompts": r.get("prompts")}
            if r.get("regret_pp")
            else None
        )

    above = [r for r in rule if r["epsilon"] >= e_star]
    low = [r for r in plain if r["epsilon"] <= below * e_star]
    if not above or not low:
        return Outcome(
            "inconclusive",
            f"ε* = {e_star:.3g}: the ε grid {[r['epsilon'] for r in plain]} does not bracket it "
            f"(needs a point ≥ ε* and one ≤ {below:g}·ε*)",
            {"eps_star": e_star, "why": "the ε grid does not bracket ε*"},
        )
    k = len(above) + len(low)

    def excess(r):
        # paired_diff(a, b) = mean of b.lift_pp − a.lift_pp with lift_pp = −regret: regret(r) − regret(best)
        d = paired_diff(rows(r), rows(best)) if rows(r) and rows(best) else None
        if d is None:
            d = {
                "mean": r["regret"] - best["regret"],
                "se": math.sqrt(r["regret_se"] ** 2 + best["regret_se"] ** 2),
                "df": max(r.get("n_prompts", 2) - 1, 1),
                "n": r.get("n_prompts"),
            }
        return d

    tests = [(r, excess(r)) for r in above + low]
    crit = t_crit(min(d["df"] for _, d in tests), alpha, k)
    tol = rel_tol * abs(best["regret"])  # practical-equivalence margin: excesses below it are no cost
    sig = lambda d: (
        (d["se"] > _TINY and (d["mean"] - tol) / d["se"] > crit)
        or (d["se"] <= _TINY and d["mean"] > tol + _TINY)
    )
    bad = [(r, d) for r, d in tests[: len(above)] if sig(d)]
    ctrl = [(r, d) for r, d in tests[len(above) :] if sig(d)]
    worst_above = max(tests[: len(above)], key=lambda x: x[1]["mean"])
    plain_above = [(r, excess(r)) for r in plain if r["epsilon"] >= e_star]
    lines = [
        f"ε* = {e_star:.3g} (ε_RM, C, σ_reg = {rule[0].get('sigma_reg', float('nan')):.3g} from "
        f"{src or 'the run'}); best regret {best['regret']:.3f} ({best.get('label', best.get('variant'))}, "
        f"ε={best.get('epsilon')}); σ = max(2Δ/ε, σ_reg) at ε ≥ ε*: largest excess "
        f"{worst_above[1]['mean']:+.3f} ± {worst_above[1]['se']:.3f} (ε={worst_above[0]['epsilon']:g}); "
        f"control at ε ≤ {below:g}ε*: "
        + ", ".join(
            f"ε={r['epsilon']:.3g} excess {d['mean']:+.3f} ± {d['se']:.3f}" for r, d in tests[len(above) :]
        ),
        "plain σ = 2Δ/ε at ε ≥ ε* (not tested; for contrast): "
        + ", ".join(f"ε={r['epsilon']:.3g} {d['mean']:+.3f}" for r, d in plain_above),
        f"paired one-sided α={alpha:g}, Bonferroni over {k} (t_crit={crit:.3g}), excess tested against "
        f"{rel_tol:g}×best = {tol:.3g}; detectable excess ≈ {tol:.3g} + "
        f"{mdd(max(d['se'] for _, d in tests), min(d['df'] for _, d in tests), alpha, k):.3f}",
    ]
    facts = {
        "eps_star": e_star,
        "worst_excess": worst_above[1]["mean"],
        "worst_excess_epsilon": worst_above[0]["epsilon"],
        "costly_above": len(bad),
        "why": "" if ctrl else "no visible privacy cost even far below ε* (no power)",
    }
    if bad:
        return Outcome("does not hold", "; ".join(lines), facts)
    if not ctrl:
        return Outcome(
            "inconclusive",
            "; ".join(lines) + "; control failed: no significant privacy cost even well below ε*",
            facts,
        )
    return Outcome("holds", "; ".join(lines), facts)


def p1_8_rule(records: list[dict], *, alpha: float = ALPHA) -> tuple[str, str]:
    """P1-8: PrivITP's ex-post cost depends on the realised stopping time, not on n — measured at a fixed σ
    (the ``PrivITP-fixed`` rows of p1-scaling, or PrivITP rows under the σ rule).

    Between N_q (the grid value closest to N_max/8, at least 2 grid steps below) and N_max: g_max = growth
    of ε_max, g_E = growth of E[realised ε] (paired over prompts). ``inconclusive`` if ε_max grows by less
    than 10% (no n-dependence to contrast). ``holds`` if the upper confidence bound of g_E is below 10% of
    g_max (the expected cost saturates while the worst case grows); ``does not hold`` if the lower bound of
    g_E exceeds 50% of g_max (the realised cost tracks n); else ``inconclusive``.
    """
    rows = [
        r
        for r in records
        if r.get("method") == fixed_label("privitp") and r.get("expected_epsilon_realized") is not None
    ]
    src = "PrivITP at a fixed σ"
    if not rows:
        rows = [
            r
            for r in of_method(records, "privitp", privacy_match="sigma")
            if r.get("expected_epsilon_realized") is not None
        ]
        src = "PrivITP under the σ rule (fixed σ)"
    if not rows:
        return "inconclusive", "no fixed-σ PrivITP rows (p1-scaling with privitp_fixed_N > 0)"
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["variant"], []).append(r)
    name, rows = sorted(by.items())[0]
    rows.sort(key=lambda r: r["N"])
    if len(rows) < 3:
        return "inconclusive", f"{name}: only {len(rows)} N values"
    last = rows[-1]
    cands = [r for r in rows[:-2] if r["N"] <= last["N"] / 4] or rows[:1]
    q = min(cands, key=lambda r: abs(math.log(r["N"]) - math.log(last["N"] / 8)))
    g_max = last["epsilon_max"] - q["epsilon_max"]
    a = {"lift_pp": q.get("expected_epsilon_pp"), "prompts": q.get("prompts")}
    b = {"lift_pp": last.get("expected_epsilon_pp"), "prompts": last.get("prompts")}
    d = paired_diff(a, b) or {
        "mean": last["expected_epsilon_realized"] - q["expected_epsilon_realized"],
        "se": 0.0,
        "df": 1,
        "n": 0,
    }
    crit = t_crit(d["df"], alpha)
    up, lo = d["mean"] + crit * d["se"], d["mean"] - crit * d["se"]
    text = (
        f"{src} ({name}): from N={q['N']} to N={last['N']}, ε_max {q['epsilon_max']:.3g} → "
        f"{last['epsilon_max']:.3g} (+{g_max:.3g}); E[realised ε] {q['expected_epsilon_realized']:.3g} → "
        f"{last['expected_epsilon_realized']:.3g} (paired growth {d['mean']:+.3g} ± {d['se']:.2g} over "
        f"{d['n']} prompts; one-sided α={alpha:g} bounds [{lo:.3g}, {up:.3g}])"
    )
    facts = {
        "pool": _pool_of(records),
        "n_from": q["N"],
        "n_max": last["N"],
        "eps_max_from": q["epsilon_max"],
        "eps_max_to": last["epsilon_max"],
        "e_from": q["expected_epsilon_realized"],
        "e_to": last["expected_epsilon_realized"],
    }
    if g_max < 0.1 * max(q["epsilon_max"], 1e-12):
        return Outcome(
            "inconclusive",
            text + "; ε_max hardly grows over this N range: no n-dependence to contrast",
            {**facts, "why": "the worst case hardly grows over this N range"},
        )
    if up < 0.1 * g_max:
        return Outcome(
            "holds", text + f"; saturates: upper bound < 10% of the ε_max growth ({0.1 * g_max:.3g})", facts
        )
    if lo > 0.5 * g_max:
        return Outcome(
            "does not hold",
            text + "; the realised cost tracks n: lower bound > 50% of the ε_max growth",
            facts,
        )
    return Outcome(
        "inconclusive", text + "; between the 10% and 50% thresholds", {**facts, "why": "underpowered"}
    )


def slope_rule(
    fit: dict | None, *, low: float, high: float, regime: list[dict] | None, what: str
) -> tuple[str, str]:
    """P2-1..P2-3: a log-log slope claim.

    ``holds`` if the 95% CI of the slope lies inside [low, high] **and** every fitted point is in the
    learning regime (mean error < ½‖θ*‖², i.e. clearly better than θ̂ = 0); ``does not hold`` if the CI lies
    entirely outside [low, high] with every point in the learning regime; else ``inconclusive`` (CI
    straddles the range: too little data; or a point outside the learning regime: the slope is then not
    the rate's).
    """
    if fit is None:
        return "inconclusive", f"{what}: fewer than two values or three points"
    text = (
        f"{what}: slope {fit['slope']:.3g} (95% CI {fit['slope_lo']:.3g}..{fit['slope_hi']:.3g}, "
        f"{fit['points']} points, {fit.get('values', '?')} values over "
        f"{fit.get('decades', float('nan')):.3g} decades); admissible [{low:g}, {high:g}]; CI half-width "
        f"{(fit['slope_hi'] - fit['slope_lo']) / 2:.3g}"
    )
    if regime is None:
        return "inconclusive", text + "; records lack ‖θ*‖² (learning-regime check impossible)"
    outside = [p for p in regime if not p["mean_error"] < 0.5 * p["zero_error"]]
    text += "; learning regime (error < ½‖θ*‖²): " + ", ".join(
        f"{p['value']:g}: {p['mean_error']:.3g}" + ("✗" if p in outside else "") for p in regime
    )
    facts = {
        "slope": fit["slope"],
        "slope_lo": fit["slope_lo"],
        "slope_hi": fit["slope_hi"],
        "low": low,
        "high": high,
    }
    if outside:
        return Outcome(
            "inconclusive",
            text + f"; {len(outside)} point(s) not in the learning regime",
            {**facts, "why": f"{len(outside)} point(s) where the estimator has not started to learn"},
        )
    if low <= fit["slope_lo"] and fit["slope_hi"] <= high:
        return Outcome("holds", text, facts)
    if fit["slope_hi"] < low or fit["slope_lo"] > high:
        return Outcome("does not hold", text, facts)
    return Outcome(
        "inconclusive",
        text + "; CI overlaps the admissible range's boundary",
        {**facts, "why": "the slope's interval straddles the edge of the expected range (too little data)"},
    )


def mcnemar_rule(
    comparisons: list[dict],
    *,
    epsilons=(2.0, 8.0),
    alpha: float = ALPHA,
    margin: float = EQUIVALENCE_MARGIN,
) -> tuple[str, str]:
    """P2-4: sparse beats dense at ε ∈ {2, 8}, on the shared test pairs. ``comparisons``: dicts with
    ``dataset, epsilon, sparse, dense, b, c, n_test, acc_sparse, acc_dense`` (b = only sparse right, c = only
    dense right); k = the number of comparisons.

    * ``does not hold`` if some dense method is significantly more accurate (one-sided exact McNemar at
      α/k, Bonferroni), **or** some pair is shown equivalent within ±``margin`` accuracy (paired TOST,
      :func:`paired_tost`, at α/k): a sparse gain, if any, below ``margin`` (0.03) is not "beating";
    * ``holds`` if every sparse method is significantly more accurate (one-sided exact McNemar at α/k) at
      every ε and data set (and none is shown equivalent);
    * else ``inconclusive`` (also when an ε is missing).
    """
    have = {c["epsilon"] for c in comparisons}
    missing = [e for e in epsilons if e not in have]
    if not comparisons:
        return "inconclusive", f"no paired rows at ε ∈ {set(epsilons)}"
    k = len(comparisons)
    parts, wins, losses, ties = [], 0, 0, 0
    for c in comparisons:
        p_s = mcnemar_exact(c["b"], c["c"])
        p_d = mcnemar_exact(c["c"], c["b"])
        eq = paired_tost(c["b"], c["c"], c["n_test"], margin=margin, alpha=alpha / k)
        wins += p_s < alpha / k
        losses += p_d < alpha / k
        ties += eq["equivalent"]
        parts.append(
            f"{c['dataset']} ε={c['epsilon']:g}: {c['sparse']} {c['acc_sparse']:.3f} vs {c['dense']} "
            f"{c['acc_dense']:.3f} (discordant {c['b']}/{c['c']} of {c['n_test']}; p={min(p_s, p_d):.3g} "
            f"{'sparse' if p_s <= p_d else 'dense'} better; diff {eq['diff']:+.3f}, "
            f"{100 * (1 - 2 * alpha / k):.2f}% CI [{eq['lo']:+.3f}, {eq['hi']:+.3f}], TOST p={eq['p']:.3g}"
            + (" EQUIVALENT" if eq["equivalent"] else "")
            + ")"
        )
    head = (
        f"exact one-sided McNemar on shared test pairs, α={alpha:g} Bonferroni over {k}: sparse "
        f"significantly better in {wins}, dense in {losses}; equivalent within ±{margin:g} accuracy (paired "
        f"TOST, α={alpha:g}/{k}) in {ties}" + (f"; MISSING ε = {missing}" if missing else "") + ". "
    )
    facts = {
        "comparisons": k,
        "sparse_wins": int(wins),
        "dense_wins": int(losses),
        "ties": int(ties),
        "epsilons": sorted(have),
        "missing": missing,
        "why": "some ε is missing" if missing else "underpowered",
    }
    if losses or ties:
        return Outcome("does not hold", head + "; ".join(parts), facts)
    if wins == k and not missing:
        return Outcome("holds", head + "; ".join(parts), facts)
    return Outcome("inconclusive", head + "; ".join(parts), facts)


#: Fit seeds a replicated comparison needs before it may decide (the DP-noise variance needs two; the
#: experiments run five or more): with one seed the spread of the DP noise is unmeasured.
MIN_FIT_SEEDS = 2


def seed_paired_diff(correct_a, correct_b) -> dict:
    """Seed-averaged paired accuracy difference of two methods on the same test pairs, with a standard error
    that includes the variance of the DP noise.

    ``correct_a``, ``correct_b``: arrays ``(R, n)`` of per-pair outcomes (1 right, 0 wrong) of R independent
    fits (fit seeds; seed r of A is matched with seed r of B) on the same n test pairs. The estimate is the
    mean over seeds of the per-seed accuracy differences ``d_r``. Its variance has two parts, both estimated:

    * **between fit seeds**, ``var(d_r)/R``: each seed redraws the DP noise (and the tuning split and
      selection noise), so this is the variance a single fit's "significant" difference ignores;
    * **between test pairs**, ``var(D_i)/n`` with ``D_i`` the seed-averaged difference on pair i: the
      sampling of the test set (what a paired test on one fit measures).

    Their sum counts the pair-by-seed interaction twice, so the SE is conservative. Degrees of freedom by
    Welch–Satterthwaite; critical values are exact Student-t quantiles at that df. ``R < 2``: the seed part
    is unmeasured and ``se`` is ``None``.
    """
    a = np.atleast_2d(np.asarray(correct_a, dtype=float))
    b = np.atleast_2d(np.asarray(correct_b, dtype=float))
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"per-pair outcomes must have one shape (R, n); got {a.shape} and {b.shape}")
    R, n = a.shape
    diff = a - b
    d_r = diff.mean(axis=1)
    out = {
        "mean": float(d_r.mean()),
        "R": int(R),
        "n": int(n),
        "diff_by_seed": [float(v) for v in d_r],
        "acc_a": float(a.mean()),
        "acc_b": float(b.mean()),
        "acc_a_sd": float(a.mean(axis=1).std(ddof=1)) if R > 1 else None,
        "acc_b_sd": float(b.mean(axis=1).std(ddof=1)) if R > 1 else None,
    }
    if R < 2:
        return {**out, "se": None, "se_seed": None, "se_pair": None, "df": None}
    v_seed = float(d_r.var(ddof=1)) / R
    v_pair = float(diff.mean(axis=0).var(ddof=1)) / n if n > 1 else 0.0
    v = v_seed + v_pair
    den = (v_seed**2 / (R - 1) if R > 1 else 0.0) + (v_pair**2 / (n - 1) if n > 1 else 0.0)
    df = v**2 / den if den > 0 else float(R - 1)
    return {
        **out,
        "se": math.sqrt(v),
        "se_seed": math.sqrt(v_seed),
        "se_pair": math.sqrt(v_pair),
        "df": float(df),
    }


def replicated_rule(
    comparisons: list[dict],
    *,
    epsilons=(2.0, 8.0),
    alpha: float = ALPHA,
    margin: float = EQUIVALENCE_MARGIN,
    what: str = "sparse",
) -> Outcome:
    """P2-4 on replicated fits: sparse beats dense at ε ∈ ``epsilons``.

    ``comparisons``: dicts with ``dataset, epsilon, sparse, dense`` and the fields of
    :func:`seed_paired_diff` (``mean, se, df, R, n, acc_a, acc_b``); k = their number. Each is tested at
    α/k (Bonferroni) with exact t quantiles on the seed-averaged paired difference, whose SE includes the
    between-seed (DP-noise) variance:

    * ``does not hold`` if some dense method is significantly more accurate, **or** some pair is shown
      equivalent within ±``margin`` (TOST): a gain below ``margin``, if any, is not "beating";
    * ``holds`` if every sparse method is significantly more accurate, at every ε of ``epsilons``;
    * ``inconclusive`` otherwise, when an ε is missing, or when a comparison has fewer than
      :data:`MIN_FIT_SEEDS` fit seeds (one fit says nothing about the DP noise: a single-seed "significant"
      result can be an artefact of one noise draw).
    """
    if not comparisons:
        return Outcome(
            "inconclusive",
            f"no replicated comparisons at ε ∈ {sorted(epsilons)}",
            {
                "comparisons": 0,
                "sparse_wins": 0,
                "dense_wins": 0,
                "ties": 0,
                "epsilons": sorted(epsilons),
                "missing": sorted(epsilons),
                "why": "no replicated comparisons",
            },
        )
    have = {c["epsilon"] for c in comparisons}
    missing = [e for e in epsilons if e not in have]
    k = len(comparisons)
    a = alpha / k
    parts, wins, losses, ties, unrep = [], 0, 0, 0, 0
    for c in comparisons:
        t = replicated_test(c, alpha=a, margin=margin, min_seeds=MIN_FIT_SEEDS)
        head = (
            f"{c['dataset']} ε={c['epsilon']:g}: {c['sparse']} {c['acc_a']:.3f} vs {c['dense']} "
            f"{c['acc_b']:.3f} ({c['R']} seed{'s' if c['R'] != 1 else ''}"
        )
        if not t["ok"]:
            unrep += 1
            parts.append(head + "; unreplicated: DP-noise variance unmeasured)")
            continue
        wins += t["better"]
        losses += t["worse"]
        ties += t["equivalent"]
        parts.append(
            head + f"; diff {c['mean']:+.3f} ± {c['se']:.3f} (seeds {c['se_seed']:.3f}, test pairs "
            f"{c['se_pair']:.3f}), df {c['df']:.1f}, {100 * (1 - 2 * a):.2f}% CI [{t['lo']:+.3f}, "
            f"{t['hi']:+.3f}], p {min(t['p_better'], t['p_worse']):.3g} "
            f"{what if t['p_better'] <= t['p_worse'] else 'dense'} better, TOST p {t['p_equivalent']:.3g}, "
            f"MDD {t['mdd']:.3f}"
            + (" SPARSE BETTER" if t["better"] else " DENSE BETTER" if t["worse"] else "")
            + (" EQUIVALENT" if t["equivalent"] else "")
            + ")"
        )
    head = (
        f"seed-averaged paired accuracy difference (SE over fit seeds, which redraw the DP noise, and over "
        f"test pairs; exact t quantiles, Welch–Satterthwaite df), α={alpha:g} one-sided, Bonferroni over "
        f"{k}: "
        f"{what} significantly better in {wins}, dense in {losses}; equivalent within ±{margin:g} accuracy "
        f"(TOST, α={alpha:g}/{k}) in {ties}"
        + (f"; {unrep} unreplicated (< {MIN_FIT_SEEDS} fit seeds)" if unrep else "")
        + (f"; MISSING ε = {missing}" if missing else "")
        + "; MDD = (t + z_0.8)·SE, the true difference detected with power ≈ 0.8. "
    )
    facts = {
        "comparisons": k,
        "sparse_wins": int(wins),
        "dense_wins": int(losses),
        "ties": int(ties),
        "epsilons": sorted(have),
        "missing": missing,
        "why": (
            f"{unrep} comparison(s) with fewer than {MIN_FIT_SEEDS} fit seeds"
            if unrep
            else "some ε is missing"
            if missing
            else "underpowered"
        ),
    }
    text = head + "; ".join(parts)
    if unrep:
        return Outcome("inconclusive", text, facts)
    if losses or ties:
        return Outcome("does not hold", text, facts)
    if wins == k and not missing:
        return Outcome("holds", text, facts)
    return Outcome("inconclusive", text, facts)


def order_rule(gaps: list[dict], *, target: float = 0.05) -> tuple[str, str]:
    """P2-5 (symmetric): ``gaps`` = per data set and adjacent pair of the paper's order, the point gap, its
    95% paired interval and its (1 − 0.05/k) interval, k = the number of gaps (``dataset, a, b, diff, lo, hi,
    lo_bonf, hi_bonf, prompts``). ``holds`` if every gap is significantly in the paper's direction (lo > 0:
    all k must, so each at 95% is an intersection-union test at α = 0.025 one-sided); ``does not hold`` if
    any is significantly reversed (hi_bonf < 0: one-sided α = 0.025/k per gap, Bonferroni, so the branch's
    family-wise rate is ≤ 0.025); else ``inconclusive``. States the CI half-width and the prompts needed for a
    ±``target`` half-width (resolves a 5-point gap), ∝ 1/√prompts.
    """
    if not gaps:
        return "inconclusive", "no win-rate gaps"
    parts = []
    need = 0
    k = len(gaps)
    for g in gaps:
        hw = (g["hi"] - g["lo"]) / 2
        n_needed = math.ceil(g["prompts"] * (hw / target) ** 2) if hw > 0 else g["prompts"]
        need = max(need, n_needed)
        parts.append(
            f"{g['dataset']} {g['a']}−{g['b']} {g['diff']:+.3f} [{g['lo']:+.3f}, {g['hi']:+.3f}] (±{hw:.3f}, "
            f"{100 * (1 - 0.05 / k):.2f}% [{g['lo_bonf']:+.3f}, {g['hi_bonf']:+.3f}], P={g['prompts']})"
        )
    n_sig = sum(g["lo"] > 0 for g in gaps)
    n_rev = sum(g["hi_bonf"] < 0 for g in gaps)
    head = (
        f"{n_sig} of {k} adjacent gaps significantly in the paper's direction (95% paired bootstrap), "
        f"{n_rev} significantly reversed ((1 − 0.05/{k}) interval, Bonferroni over {k}); prompts needed for "
        f"a ±{target:g} half-width (to resolve a {100 * target:g}-point gap): ≈ {need}. "
    )
    facts = {"gaps": k, "in_order": int(n_sig), "reversed": int(n_rev), "prompts_needed": need}
    if n_rev:
        return Outcome("does not hold", head + "; ".join(parts), facts)
    if n_sig == len(gaps):
        return Outcome("holds", head + "; ".join(parts), facts)
    return Outcome("inconclusive", head + "; ".join(parts), {**facts, "why": "underpowered"})


def _b1_diff(a: dict, b: dict) -> dict:
    """DP-RM + BoN (``b``) − PrivBoN (``a``) at one T: paired over the evaluation queries when the records
    carry ``value_pq`` (t critical values, df = queries − 1), else unpaired (combined SE, normal
    quantiles)."""
    d = paired_diff({"lift_pp": a.get("value_pq")}, {"lift_pp": b.get("value_pq")})
    if d is not None:
        return {**d, "paired": True}
    return {
        "mean": b["value"] - a["value"],
        "se": math.sqrt(a["value_se"] ** 2 + b["value_se"] ** 2),
        "df": None,
        "paired": False,
    }


def _b1_z(d: dict) -> float:
    if d["se"] > _TINY:
        return float(d["mean"] / d["se"])
    return math.inf if d["mean"] > _TINY else -math.inf if d["mean"] < -_TINY else 0.0


def _b1_crit(d: dict, a: float) -> float:
    return t_crit(d["df"], a) if d["paired"] else float(stats.norm.ppf(1.0 - a))


def b1_rule(records: list[dict], *, alpha: float = ALPHA) -> tuple[str, str]:
    """B-1: a DP-trained reward model + BoN beats per-query PrivBoN at the same total (ε, δ) once T is large.

    Per T of the grid (k values), d(T) = value(DP-RM + BoN) − value(PrivBoN), one-sided tests at α/k
    (Bonferroni: the rule scans the grid), paired over the evaluation queries when the records carry
    ``value_pq`` (exact t quantiles), else unpaired with exact normal quantiles. The claim is decided at the
    **smallest T where it is informative**: T* = the smallest T at which DP-RM is significantly ahead.

    * ``does not hold`` if PrivBoN is significantly ahead at the largest T (no crossover in the grid;
      one test, at α);
    * ``holds`` if T* exists and DP-RM is not significantly behind at any T ≥ T* ("decided at T = T*";
      T* = the grid's smallest T means it holds from the first query on);
    * else ``inconclusive``.
    """
    ts = sorted({r["T"] for r in records if "T" in r})
    rows = {t: {r["method"]: r for r in records if r.get("T") == t} for t in ts}
    priv = method_label("privbon")
    ts = [t for t in ts if "DP reward model + BoN" in rows[t] and priv in rows[t]]
    if not ts:
        return "inconclusive", f"no T with both 'DP reward model + BoN' and '{priv}' rows"
    k = len(ts)
    tests = {t: _b1_diff(rows[t][priv], rows[t]["DP reward model + BoN"]) for t in ts}
    ahead = [t for t in ts if _b1_z(tests[t]) > _b1_crit(tests[t], alpha / k)]
    behind = [t for t in ts if _b1_z(tests[t]) < -_b1_crit(tests[t], alpha / k)]
    last = ts[-1]
    parts = [
        f"T={t}: DP-RM + BoN {rows[t]['DP reward model + BoN']['value']:.3f} vs PrivBoN "
        f"{rows[t][priv]['value']:.3f}, diff {tests[t]['mean']:+.3f} ± {tests[t]['se']:.3f}"
        + (" (ahead)" if t in ahead else " (behind)" if t in behind else "")
        for t in ts
    ]
    d_last = tests[last]
    paired = all(d["paired"] for d in tests.values())
    head = (
        f"one-sided tests at α={alpha:g}, Bonferroni over the {k} values of T "
        f"({'paired over the evaluation queries' if paired else 'unpaired'}); detectable difference at the "
        f"largest T ≈ {(_b1_crit(d_last, alpha / k) + Z80) * d_last['se']:.3f}. "
    )
    facts = {"t_max": last, "diff_at_t_max": d_last["mean"], "crossover_T": ahead[0] if ahead else None}
    if _b1_z(d_last) < -_b1_crit(d_last, alpha):
        return Outcome(
            "does not hold",
            head + f"PrivBoN significantly ahead at the largest T={last}; " + "; ".join(parts),
            facts,
        )
    if ahead and not [t for t in behind if t >= ahead[0]]:
        when = "from the grid's first T on" if ahead[0] == ts[0] else "after the crossover"
        return Outcome("holds", head + f"decided at T={ahead[0]} ({when}); " + "; ".join(parts), facts)
    return Outcome("inconclusive", head + "; ".join(parts), {**facts, "why": "underpowered"})
