"""The report: one self-contained ``report.html`` (figures embedded as base64) and ``report.md``, with a
**claims table** computed from the run directories' ``results.jsonl`` files.

Every claim of the two papers is listed with the experiment that tests it, the numbers measured (read
from ``results.jsonl`` at report time, never typed in), and a verdict from a stated rule:

* ``holds`` / ``does not hold``: the rule was applied to the measured numbers;
* ``inconclusive``: the experiment ran but the numbers cannot decide (e.g. too few N values);
* ``not run``: no run directory of the testing experiment was given to ``privalign report``;
* ``not testable here``: with the reason (e.g. 7B models, asymptotic statements without constants).

Each rule states its one-sided α (0.05 unless stated) and uses exact critical values
(``privalign.experiments.verdicts``); a "does not hold" branch that fires on any one of k comparisons is
Bonferroni-corrected over them. There is no correction across the table, which is descriptive. A quick
configuration's verdict is about that small run only, and the report says so.
"""

from __future__ import annotations

import base64
import html
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from privalign._json import write_json_atomic
from privalign.experiments.base import ExperimentError
from privalign.experiments.manifest import read_manifest, utc_now
from privalign.experiments.plain import READERS, Reader, reading
from privalign.experiments.records import fixed_label
from privalign.experiments.runner import read_results, read_summary

__all__ = ["Claim", "CLAIMS", "evaluate_claims", "write_report"]

Records = dict[str, list[dict]]
Verdict = tuple[str, str]


@dataclass(frozen=True)
class Claim:
    """One claim of a paper and how it is tested.

    Attributes:
      id: Short id (``P1-1``).
      paper: ``"Paper 1"``, ``"Paper 2"`` or ``"Beyond"``.
      text: The claim, as stated (or paraphrased) with its source tag.
      experiment: The experiment that tests it (``None`` if none can).
      rule: The decision rule applied to the measured numbers.
      evaluate: ``(records_by_experiment, runs) -> (verdict, measured)``; ``None`` when not testable.
      reason: Why it is not testable here (when ``evaluate`` is ``None``).
      also: Further experiments the rule reads when their runs are given (e.g. the real-pool twin).
      plain: ``(verdict, facts) -> str``: the claim's one line in plain words, from the facts its rule
        returned (:mod:`privalign.experiments.plain`); ``None``: the reader registered for ``id`` in
        :data:`privalign.experiments.plain.READERS`, else the claim restated with its verdict.
    """

    id: str
    paper: str
    text: str
    experiment: str | None
    rule: str
    evaluate: Callable[..., Verdict] | None = None
    reason: str = ""
    also: tuple[str, ...] = ()
    plain: Reader | None = None


def _pool_kind(records: list[dict]) -> str:
    """The words for the kind of pool a run used (planted synthetic, planted real text, natural real text;
    :data:`privalign.alignment.capacity.POOL_KINDS`): the records' ``pool_kind``, else read off the label of
    runs made before records carried it."""
    from privalign.alignment.capacity import pool_kind_words

    kind = next((r.get("pool_kind") for r in records if r.get("pool_kind")), None)
    if kind is None:
        label = str(next((r.get("pool_label") for r in records if r.get("pool_label")), ""))
        kind = (
            "planted-synthetic"
            if label.startswith("synthetic (planted")
            else "synthetic"
            if label.startswith("synthetic")
            else "natural"
        )
    return pool_kind_words(kind)


def _combine(results: list[tuple[str, Verdict]], kinds: dict[str, str] | None = None) -> Verdict:
    """One verdict from several runs (pools): ``does not hold`` if any run says so, else ``holds`` if any
    does, else ``inconclusive``; the measured text lists every run's verdict, first per pool kind (a verdict
    on a pool with planted hacks shows that the rules detect hacking; only natural real text says whether
    best-of-N over-optimises a natural proxy); the facts list every run's facts (``facts["runs"]``, for the
    plain reading)."""
    from privalign.experiments.verdicts import Outcome, facts_of

    if not results:
        return "inconclusive", "no runs with results"
    vs = [v for _, (v, _) in results]
    verdict = "does not hold" if "does not hold" in vs else "holds" if "holds" in vs else "inconclusive"
    runs = [{**facts_of(res), "experiment": exp, "verdict": res[0]} for exp, res in results]
    head = ""
    if kinds:
        per: dict[str, list[str]] = {}
        for exp, (v, _) in results:
            per.setdefault(kinds.get(exp, "natural real text"), []).append(
                v if len(results) == 1 else f"{v} ({exp})"
            )
        head = "per pool kind: " + "; ".join(f"{k}: {', '.join(vv)}" for k, vv in per.items()) + " || "
        for r in runs:
            r["pool_kind"] = kinds.get(r["experiment"], "natural real text")
    if len(results) == 1:
        return Outcome(verdict, head + results[0][1][1], {"runs": runs})
    return Outcome(
        verdict, head + " || ".join(f"{exp} → {v}: {m}" for exp, (v, m) in results), {"runs": runs}
    )


_SCALING = ("p1-scaling", "p1-scaling-imdb")
_SWEEP = ("p1-privacy-sweep", "p1-privacy-sweep-imdb")


def _hack_rate(records: list[dict], runs: dict | None, exp: str) -> float | None:
    man = (runs or {}).get(exp, {}).get("manifest") or {}
    cfg = man.get("config") or {}
    label = str(next((r.get("pool_label") for r in records if r.get("pool_label")), ""))
    return cfg.get("syn_hack_rate") if label.startswith("synthetic") else None


def _p1_1(R: Records, runs=None) -> Verdict:
    from privalign.experiments.verdicts import p1_1_rule

    return _combine(
        [(e, p1_1_rule(R[e], planted_hack_rate=_hack_rate(R[e], runs, e))) for e in _SCALING if R.get(e)],
        {e: _pool_kind(R[e]) for e in _SCALING if R.get(e)},
    )


def _mono(method: str, fallback: str | None = None, *, across_epsilon: bool = False):
    def f(R: Records, runs=None) -> Verdict:
        from privalign.experiments.verdicts import Outcome, facts_of, monotone_rule

        out: list[tuple[str, Verdict]] = []
        for e in _SCALING:
            if not R.get(e):
                continue
            recs = R[e]
            m = method if any(r.get("method") == method for r in recs) or fallback is None else fallback
            res = monotone_rule(recs, m)
            v, txt = res
            # the paper's setting is a fixed noise level; also report equal-ε curves
            if m == fixed_label("privitp"):
                v2, t2 = monotone_rule(recs, "PrivITP")
                txt += f" | for contrast, PrivITP re-matched to ε at every N (ε_max(N) = ε): {v2}"
            out.append((e, Outcome(v, txt, facts_of(res))))
        kinds = {e: _pool_kind(R[e]) for e in _SCALING if R.get(e)}
        if across_epsilon:
            from privalign.experiments.verdicts import monotone_across_epsilon

            for e in _SWEEP:
                if R.get(e):
                    out.append((e, monotone_across_epsilon(R[e], method)))
                    kinds[e] = _pool_kind(R[e])
        return _combine(out, kinds)

    return f


def _p1_5(R: Records, runs=None) -> Verdict:
    from privalign.experiments.verdicts import p1_5_rule

    out = [(e, p1_5_rule(R[e], match="worst")) for e in _SWEEP if R.get(e)]
    if not out:  # the scaling runs, when matched by the default rule
        out = [(e, p1_5_rule(R[e], match="worst")) for e in _SCALING if R.get(e)]
    return _combine(out)


def _p1_8(R: Records, runs=None) -> Verdict:
    from privalign.experiments.verdicts import p1_8_rule

    return _combine([(e, p1_8_rule(R[e])) for e in _SCALING if R.get(e)])


def _eps_star(R: Records, runs=None) -> Verdict:
    from privalign.experiments.verdicts import p1_7_rule

    return p1_7_rule(R["p1-epsilon-star"])


def _budget(R: Records, runs=None) -> Verdict:
    from privalign.experiments.verdicts import p1_6_rule

    return p1_6_rule(R["p1-budget"])


def _rates_slope(records: Records, *, sweep: str, method: str, low: float, high: float) -> Verdict:
    from privalign.experiments.paper2 import fit_slope, learning_regime
    from privalign.experiments.verdicts import slope_rule

    recs = records["p2-rates"]
    return slope_rule(
        fit_slope(recs, sweep, method),
        low=low,
        high=high,
        regime=learning_regime(recs, sweep, method),
        what=f"{method}: log-log slope of the squared error vs {sweep}",
    )


def _sparse_beats_dense(records: Records, runs=None) -> Verdict:
    from privalign.experiments.paper2 import sparse_beats_dense_verdict

    return sparse_beats_dense_verdict(records["p2-accuracy"])


def _winrate_order(records: Records, runs=None) -> Verdict:
    from privalign.experiments.winrate import order_verdict

    return order_verdict(records["p2-winrate"], epsilon=8.0)


def _train_vs_inference(records: Records, runs=None) -> Verdict:
    from privalign.experiments.verdicts import b1_rule

    return b1_rule(records["beyond-train-vs-inference"])


def _membership(records: Records, runs=None) -> Verdict:
    from privalign.experiments.records import of_method
    from privalign.experiments.verdicts import Outcome

    recs = [r for r in records["beyond-membership"] if r.get("kind") == "attack"]
    priv = sorted(of_method(recs, "privbon", key="service"), key=lambda r: r["epsilon_claimed"])
    bon = of_method(recs, "bon", key="service")
    if not priv:
        return "inconclusive", "no PrivBoN audit rows"
    ok = all(r["eps_lower_bound"] <= r["epsilon_claimed"] + 1e-12 for r in priv)
    # power: the same audit must detect the leak of plain BoN (a positive lower bound), else it says nothing
    powered = bool(bon) and bon[0]["eps_lower_bound"] > 0
    parts = (
        [
            f"BoN: advantage {bon[0]['advantage']:.3f} at Q={bon[0]['Q_max']}, audit ε ≥ "
            f"{bon[0]['eps_lower_bound']:.2f}"
        ]
        if bon
        else []
    )
    parts += [
        f"PrivBoN ε={r['epsilon_claimed']:g}: audit ε ≥ {r['eps_lower_bound']:.3f}, advantage "
        f"{r['advantage']:.3f} at Q={r['Q_max']}"
        for r in priv
    ]
    worst = max(priv, key=lambda r: r["eps_lower_bound"] - r["epsilon_claimed"])
    facts = {
        "epsilons": [r["epsilon_claimed"] for r in priv],
        "bon_lower_bound": bon[0]["eps_lower_bound"] if bon else None,
        "worst_lower_bound": worst["eps_lower_bound"],
        "worst_claimed": worst["epsilon_claimed"],
    }
    if not ok:
        return Outcome("does not hold", "; ".join(parts), facts)
    if not powered:
        return Outcome(
            "inconclusive",
            "; ".join(parts) + "; the audit finds no leak against plain BoN either: no power",
            facts,
        )
    return Outcome(
        "holds", "; ".join(parts) + "; the audit detects plain BoN's leak (positive control)", facts
    )


def _user_attack(records: Records, runs=None) -> Verdict:
    from privalign.experiments.user_level import attack_verdict

    return attack_verdict(records["beyond-user-level"])


def _user_utility(records: Records, runs=None) -> Verdict:
    from privalign.experiments.user_level import utility_verdict

    recs = records["beyond-user-level"]
    # the run's public K: in its records, else (records written before they carried it) its configuration
    k = next((r["k_public"] for r in recs if r.get("k_public")), None)
    if k is None:
        k = (
            (((runs or {}).get("beyond-user-level") or {}).get("manifest") or {})
            .get("config", {})
            .get("k_public")
        )
    if k is None:
        return "inconclusive", "no public K (k_public) in the records or the run's configuration"
    return utility_verdict(recs, int(k))


def _frontier(records: Records, runs=None) -> Verdict:
    from privalign.experiments.frontier import frontier_verdict

    return frontier_verdict(records["beyond-frontier"])


def _rlhf(records: Records, runs=None) -> Verdict:  # noqa: ANN001
    """Best-of-n at exact KL (``p2-rlhf-bon``) decides; a GRPO run (``p2-rlhf``), when given, is reported
    beside it and not combined (its KL is a Monte Carlo estimate and its runs are few)."""
    from privalign.experiments.rlhf import rlhf_equal_kl_verdict, rlhf_verdict
    from privalign.experiments.rlhf_bon import bon_verdict
    from privalign.experiments.verdicts import Outcome, facts_of

    grpo = records.get("p2-rlhf") or []
    if not records.get("p2-rlhf-bon"):
        res = rlhf_verdict(grpo)
        eq = rlhf_equal_kl_verdict(grpo)
        return Outcome(
            res[0],
            f"GRPO only (no p2-rlhf-bon run given): {res[1]} || equal KL (reported, not combined): "
            f"{eq[0]}: {eq[1]}",
            facts_of(res),
        )
    res = bon_verdict(records["p2-rlhf-bon"])
    v, m = res
    if grpo:
        gv, gm = rlhf_verdict(grpo)
        eq = rlhf_equal_kl_verdict(grpo)
        m += f" || GRPO (p2-rlhf; reported, not combined): {gv}: {gm}; at equal KL: {eq[0]}: {eq[1]}"
    return Outcome(v, "best-of-n at exact KL: " + m, facts_of(res))


_PAIRED = (
    "paired per-prompt one-sided t-tests at family-wise α = 0.05 over the N compared (the joint sign-flip "
    "max-t critical value; Bonferroni when the results lack per-prompt values)"
)
#: P2-1's admissible slope of the error vs n: the rate s*/n + s*²/(n²ε²) has slope −1 (statistical term) to
#: −2 (privacy term); ± 0.2 for the finite grid. It was [−2.5, −0.5], which let a quick run with CI
#: [−2.47, −0.74] "hold" although its upper end is far from any rate the theory allows.
P2_1_WINDOW = (-2.2, -0.8)

CLAIMS: list[Claim] = [
    Claim(
        "P1-1",
        "Paper 1",
        "BoN is not scaling-monotonic: past a critical N its true reward falls (reward hacking). On a pool "
        "with planted reward hacks (synthetic, or real text with a planted proxy bonus) the fall is built "
        "in: there a 'holds' shows that the rules detect it. [paper; Huang]",
        "p1-scaling",
        "holds if BoN's lift at the largest N is significantly below its lift at some smaller N "
        f"({_PAIRED}); on a pool where BoN does not degrade: inconclusive on this pool (never 'does not "
        "hold'), except on a synthetic pool with reachable planted hacks (N_max·hack_rate ≥ 2) where the "
        "drop's upper bound is < 10% of the best lift",
        _p1_1,
        also=("p1-scaling-imdb",),
    ),
    Claim(
        "P1-2",
        "Paper 1",
        "PrivBoN is scaling-monotonic: its lift does not fall as N grows. Decided only where BoN "
        "over-optimises in the same run (on the shipped pools: those with planted reward hacks), so it tests "
        "PrivBoN's resistance where hacks were planted. [paper]",
        "p1-scaling",
        "decided only with a positive control (BoN degrades significantly in the same run); then: does not "
        f"hold if the lift at N_max is significantly below a smaller N's ({_PAIRED}); holds if not and the "
        "drop's upper 95% bound is below min(½·BoN's drop, ¼·the curve's best lift) and the curve has a "
        "significant lift; else inconclusive. With a privacy-sweep run, the same rule at every ε of the "
        "sweep (BoN + PrivBoN at that ε), saying at which ε it holds: does not hold if it fails at some ε",
        _mono("PrivBoN", across_epsilon=True),
        also=("p1-scaling-imdb", "p1-privacy-sweep", "p1-privacy-sweep-imdb"),
    ),
    Claim(
        "P1-3",
        "Paper 1",
        "PrivITP is scaling-monotonic. Decided only where BoN over-optimises in the same run (on the shipped "
        "pools: those with planted reward hacks), so it tests PrivITP's resistance where hacks were planted. "
        "[paper]",
        "p1-scaling",
        "as P1-2, for PrivITP at a fixed noise level (σ with ε_max(16) = ε; the paper's setting); the curve "
        "re-matched to ε at every N is reported for contrast",
        _mono(fixed_label("privitp"), fallback="PrivITP"),
        also=("p1-scaling-imdb",),
    ),
    Claim(
        "P1-4",
        "Paper 1",
        "ITP is scaling-monotonic (attains the skyline; Huang et al.). Decided only where BoN over-optimises "
        "in the same run (on the shipped pools: those with planted reward hacks), so it tests ITP's "
        "resistance where hacks were planted. [paper; Huang]",
        "p1-scaling",
        "as P1-2, for ITP",
        _mono("ITP"),
        also=("p1-scaling-imdb",),
    ),
    Claim(
        "P1-5",
        "Paper 1",
        "PrivITP matches or beats PrivBoN at equivalent privacy. [paper]",
        "p1-privacy-sweep",
        "at equal privacy (default matching 'worst': PrivITP's ε_max(N) at δ = PrivBoN's ε), at every (N, "
        "ε): paired per-prompt difference PrivITP − PrivBoN; does not hold if PrivBoN is significantly ahead "
        "anywhere (one-sided α = 0.05, Bonferroni over the grid); holds if everywhere the lower bound "
        "exceeds −10% of BoN's lift (non-inferiority); else inconclusive",
        _p1_5,
        also=("p1-privacy-sweep-imdb", "p1-scaling", "p1-scaling-imdb"),
    ),
    Claim(
        "P1-6",
        "Paper 1",
        "Ex-post (adaptive) composition serves more prompts under a fixed budget than basic composition. "
        "[paper]",
        "p1-budget",
        "does not hold if some session serves ≤ T_basic = ⌊ε_total/ε_max⌋ or a filter overshoots; holds if "
        "not and at some σ the mean true-reward lift per served prompt is significantly > 0 (one-sided t, α "
        "= 0.05, Bonferroni over σ); inconclusive if the served prompts have no measurable lift",
        _budget,
    ),
    Claim(
        "P1-7",
        "Paper 1",
        "At ε ≥ ε* = 2Δ_r√C/ε_RM, PrivBoN's regret is O(√(C·ε_RM²)): privacy costs nothing extra. [paper]",
        "p1-epsilon-star",
        "relative test on the plain PrivBoN curve (σ = 2Δ_r/ε), ε* and σ_reg from calibration prompts "
        "disjoint from the evaluation prompts: does not hold if some grid ε ≥ ε* has regret significantly "
        "above the best regret over every σ in the run (paired, one-sided α = 0.05, Bonferroni); holds if "
        "none does and the control works (some ε ≤ ε*/4 has significantly larger regret); else inconclusive",
        _eps_star,
    ),
    Claim(
        "P1-8",
        "Paper 1",
        "PrivITP's ex-post cost depends only on the realised stopping time, not on n. [paper]",
        "p1-scaling",
        "at a fixed σ, from N ≈ N_max/8 to N_max: holds if the upper 95% bound of the growth of E[realised "
        "ε] (paired over prompts) is < 10% of the growth of ε_max(N); does not hold if its lower bound is > "
        "50%; inconclusive otherwise or if ε_max grows < 10%",
        _p1_8,
        also=("p1-scaling-imdb",),
    ),
    Claim(
        "P1-9",
        "Paper 1",
        "Regret bounds: PrivITP O(√(C(ε_RM² + R_max σ))); skyline lower bound ¼√(C ε_RM²). [paper]",
        None,
        "—",
        None,
        "asymptotic statements with unstated constants; only P1-7's instance is checked numerically",
    ),
    Claim(
        "P1-10",
        "Paper 1",
        "The reported trends on GSM8K, MMLU and MATH with two LMs and four reward models. [paper]",
        None,
        "—",
        None,
        "needs GPU-built pools (Phi-3-class LM, 10,000 samples per prompt, 7B-scale reward models); "
        "run p1-scaling with --config pointing at such a pool",
    ),
    Claim(
        "P2-1",
        "Paper 2",
        "Sample-DP-IHT: error Õ(s*/n + s*²/(n²ε²)), decreasing in n. [paper]",
        "p2-rates",
        f"holds if the 95% CI of the log-log slope of the error vs n lies inside [{P2_1_WINDOW[0]:g}, "
        f"{P2_1_WINDOW[1]:g}] (the theory's slopes −1 to −2, ± 0.2) and every fitted point is in the "
        "learning regime (error < ½‖θ*‖²); does not hold if the CI lies outside (points in the regime); else "
        "inconclusive",
        lambda R, runs=None: _rates_slope(
            R, sweep="n", method="SampleDPIHT", low=P2_1_WINDOW[0], high=P2_1_WINDOW[1]
        ),
    ),
    Claim(
        "P2-2",
        "Paper 2",
        "RR-IHT: error Õ(s*/n·(1 + 1/ε²)): linear in s*. [paper]",
        "p2-rates",
        "as P2-1, for the RR-IHT slope vs s* in [0.5, 1.5]",
        lambda R, runs=None: _rates_slope(R, sweep="s", method="RRIHT", low=0.5, high=1.5),
    ),
    Claim(
        "P2-3",
        "Paper 2",
        "Sparse private estimators depend on d only logarithmically. [paper]",
        "p2-rates",
        "as P2-1, for the RR-IHT slope vs d in [-1, 0.35] (log d growth over the grid)",
        lambda R, runs=None: _rates_slope(R, sweep="d", method="RRIHT", low=-1.0, high=0.35),
    ),
    Claim(
        "P2-4",
        "Paper 2",
        "At ε ∈ {2, 8}, sparse methods (RR-IHT, Sample-DP IHT) beat dense ones (RR, DP-SGD). [paper]",
        "p2-accuracy",
        "replicated (≥ 2 fit seeds per cell, 5 in the configs), every method tuned by the same protocol: "
        "one-sided t-tests of the seed-averaged paired accuracy difference on the shared held-out pairs at "
        "ε = 2 and 8 (SE over fit seeds, i.e. the DP noise, and test pairs; exact t quantiles), α = 0.05 "
        "Bonferroni: holds if every sparse method is significantly more accurate than its dense counterpart; "
        "does not hold if some dense one is, or a pair is shown equivalent within ±0.03 (TOST); else (an ε "
        "missing, or an unreplicated comparison) inconclusive; untuned-at-full-ε comparisons printed beside",
        _sparse_beats_dense,
    ),
    Claim(
        "P2-5",
        "Paper 2",
        "Win rates at ε = 8: RR-IHT > Sample-DP IHT > RR > DP-SGD (Gemma-3-1B, Llama-2-7B). [paper]",
        "p2-winrate",
        "SmolLM2-135M best-of-16 analogue on IMDb and HH-RLHF at ε = 8, symmetric: holds if every adjacent "
        "gap of the paper's order is significantly in the paper's direction (95% prompt-paired bootstrap "
        "interval > 0) on every data set; does not hold if any gap is significantly reversed; else "
        'inconclusive; inconclusive with "regime mismatch" and the computed need when Sample-DP IHT '
        "cannot learn at the available n (Peeling's first-step need above the training pairs)",
        _winrate_order,
    ),
    Claim(
        "P2-6",
        "Paper 2",
        "PPO-aligned LLaMA-7b on IMDb: higher reward at the same KL for sparse methods. [paper]",
        "p2-rlhf-bon",
        "CPU analogue at exact KL: best-of-16 from SmolLM2-135M reference samples (400 held-out IMDb "
        "prompts, KL = log 16 − 15/16 ≈ 1.83 nats) selected by each private reward model (5 fits each); per "
        "(sparse, dense) pair of equal unit and ε, 95% bootstrap interval (prompts × fit seeds) of the gold "
        "difference: holds if every pair is significantly in the sparse direction; does not hold if any is "
        "significantly reversed (Bonferroni); else inconclusive; the text states the power. GRPO policies "
        "(p2-rlhf), when given, are reported beside it, not combined: at their last checkpoints and at equal "
        "KL (each policy's best point on its path at KL ≤ 0.5, 1, 2 nats)",
        _rlhf,
        also=("p2-rlhf",),
    ),
    Claim(
        "P2-7",
        "Paper 2",
        "Minimax lower bounds (Sample-DP and Label-DP). [paper]",
        None,
        "—",
        None,
        "theoretical statements; rates are only checked for their n, s*, d dependence (P2-1..P2-3)",
    ),
    Claim(
        "B-1",
        "Beyond",
        "A DP-trained reward model used without further noise (post-processing) beats per-query "
        "PrivBoN at the same total (ε, δ) once T is large. [our question]",
        "beyond-train-vs-inference",
        "per T, DP-RM + BoN − PrivBoN paired over the evaluation queries, one-sided α = 0.05 Bonferroni over "
        "the T grid; decided at the smallest T where DP-RM is significantly ahead: holds if it is and it is "
        "not significantly behind at any larger T; does not hold if PrivBoN is significantly ahead at the "
        "largest T; else inconclusive",
        _train_vs_inference,
    ),
    Claim(
        "B-2",
        "Beyond",
        "Membership inference by repeated queries succeeds against plain BoN; against PrivBoN the "
        "audit's empirical ε lower bound stays below the claimed ε. [paper describes the attack]",
        "beyond-membership",
        "does not hold if PrivBoN's empirical ε lower bound (Clopper–Pearson, stated α) exceeds the claimed "
        "ε; holds if not and the same audit finds plain BoN's leak (ε lower bound > 0); else inconclusive "
        "(no power)",
        _membership,
    ),
    Claim(
        "B-3",
        "Beyond",
        "On IMDb controlled sentiment, at each ε and KL budget one private alignment route (label- or "
        "sample-DP DPO; a private linear or MiniLM reward model with best-of-n or GRPO; PrivBoN per answer) "
        "gives significantly more gold reward than every other, judged by the gold model that also labelled "
        "the private pairs (the MiniLM gold in the configs: a verdict under that judge only). [our question]",
        "beyond-frontier",
        "per (ε, KL budget): each route's best gold at KL ≤ budget along its path (mixtures interpolate); "
        "winner − runner-up, one-sided bootstrap p-value over prompts × seeds, Holm across the comparisons "
        "(α = 0.05): holds if every winner is significant; does not hold if some winner and runner-up are "
        "shown equal (Bonferroni interval inside ± the equivalence margin); else inconclusive, with the "
        "difference detectable at power ≈ 0.8",
        _frontier,
    ),
    Claim(
        "U-1",
        "Beyond",
        "At the same stated ε, a record-level (per-label) label-DP reward model lets an attacker infer a "
        "heavy annotator's type beyond ε per person; a user-level model (≤ K labels per annotator, "
        "randomized response at ε/K) does not. [our question]",
        "beyond-user-level",
        "per seed, the audit's Clopper–Pearson lower bound on the per-person ε of each model (α/seeds "
        "each): does not hold if any user-level bound exceeds ε; holds if every per-label bound does and no "
        "user-level one does (≥ 2 seeds); else inconclusive (no power)",
        _user_attack,
    ),
    Claim(
        "U-2",
        "Beyond",
        "At equal ε per person, user-level label-DP with a contribution bound K fixed in advance is more "
        "accurate than record-level label-DP at ε/M_max (group privacy). [our question]",
        "beyond-user-level",
        "per (method, ε): user(K) − group accuracy paired over seeds, one-sided Student t at α = 0.05 "
        "Bonferroni over the cells: holds if every lower bound > 0; does not hold if some upper bound < 0.01 "
        "(no better by a point); else inconclusive",
        _user_utility,
    ),
]


def _load_runs(run_dirs: list[Path]) -> tuple[Records, dict[str, dict]]:
    records: Records = {}
    runs: dict[str, dict] = {}
    for d in run_dirs:
        man = read_manifest(d)
        if man is None:
            raise ExperimentError(f"{d} is not a privalign run directory (no manifest.json).")
        name = man["experiment"]
        if name in runs:
            raise ExperimentError(
                f"Two run directories for experiment {name!r}: {runs[name]['dir']} and {d}."
            )
        records[name] = read_results(d)
        runs[name] = {"dir": str(d), "manifest": man, "summary": read_summary(d)}
    return records, runs


def _config_tag(name: str, man: dict) -> str:
    """``quick``, ``full`` (the packaged full configuration) or ``custom`` configuration."""
    if man.get("quick"):
        return "quick"
    try:
        from privalign.experiments.config import config_hash, load_config, packaged_config_path
        from privalign.experiments.registry import get_experiment

        exp = get_experiment(name)
        full = load_config(packaged_config_path(exp.config_name), exp.schema)
        return "full" if config_hash(exp.name, full) == man.get("config_hash") else "custom"
    except Exception:  # noqa: BLE001 - an unknown experiment or a missing packaged file: say custom
        return "custom"


def evaluate_claims(records: Records, runs: dict[str, dict] | None = None) -> list[dict]:
    """Apply every claim's rule to the records (``experiment name -> results.jsonl records``).

    Each row has ``plain``, the claim's one line in plain words (:mod:`privalign.experiments.plain`).
    Each computed verdict's text ends with the configuration of every run it read (``[p1-scaling: quick
    configuration]``, full or custom), incomplete runs and synthetic fallbacks; the rules themselves state
    the pool (real or synthetic with planted reward hacking), how privacy was matched, α and the power.
    """
    from privalign.experiments.verdicts import facts_of

    out = []
    for c in CLAIMS:
        facts: dict = {}
        exps = [e for e in (c.experiment, *c.also) if e]
        row = {
            "id": c.id,
            "paper": c.paper,
            "claim": c.text,
            "experiment": " + ".join(exps) or "—",
            "rule": c.rule,
        }
        present = [e for e in exps if e in records]
        if c.evaluate is None:
            row.update(verdict="not testable here", measured=c.reason)
        elif not present:
            from privalign.experiments.registry import EXPERIMENTS

            why = (
                f"no run directory of {c.experiment} was given"
                if c.experiment in EXPERIMENTS
                else f"{c.experiment} is not implemented in this build (docs/experiments.md says why)"
            )
            row.update(verdict="not run", measured=why)
        elif not any(records[e] for e in present):
            row.update(verdict="inconclusive", measured="the run has no results")
        else:
            full = {e: records.get(e, []) for e in exps}
            full.update(records)
            try:
                result = c.evaluate(full, runs)
                verdict, measured = result
                facts = facts_of(result)
            except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
                verdict, measured = (
                    "inconclusive",
                    f"results lack a needed field ({type(exc).__name__}: {exc})",
                )
            tags = []
            for e in present:
                if not (runs and e in runs) or not records[e]:
                    continue
                man = runs[e]["manifest"]
                tag = f"{e}: {_config_tag(e, man)} configuration"
                if man.get("status") != "complete":
                    tag += ", run INCOMPLETE"
                pool = (man.get("inputs") or {}).get("pool") or {}
                if pool.get("kind") == "synthetic-fallback":
                    tag += ", synthetic pool: the shipped pool was absent"
                tags.append(f"[{tag}]")
            row.update(verdict=verdict, measured=measured + (" " + " ".join(tags) if tags else ""))
        row["plain"] = reading(
            c.text, row["verdict"], facts, c.plain or READERS.get(c.id), measured=row["measured"]
        )
        out.append(row)
    return out


_COLORS = {
    "holds": "#d8f0d8",
    "does not hold": "#f8d0d0",
    "inconclusive": "#fff2c0",
    "not run": "#eeeeee",
    "not testable here": "#e0e8f8",
}


def _img_tag(png: Path, alt: str) -> str:
    data = base64.b64encode(png.read_bytes()).decode()
    return (
        f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"/>'
        f"<figcaption>{html.escape(alt)}</figcaption></figure>"
    )


def _short_time(ts) -> str:
    """``2026-11-30T21:40:12.123+00:00`` → ``2026-11-30 21:40:12`` (UTC in the manifest; full value in the
    tooltip)."""
    if not isinstance(ts, str) or len(ts) < 19:
        return html.escape(str(ts))
    return html.escape(ts[:19].replace("T", " "))


def _span(start, end) -> str:
    """``2026-11-30 21:40:12 → 21:41:05`` (the end's date is shown only when it differs)."""
    a, b = _short_time(start), _short_time(end)
    if len(a) == 19 and len(b) == 19 and a[:10] == b[:10]:
        b = b[11:]
    return f"{a} → {b}"


def _json_cell(v, label: str | None = None) -> str:
    """Complete JSON, never cut: short values inline, long ones in a collapsed, scrollable block."""
    text = json.dumps(v, default=str)
    if len(text) <= 120:
        return f"<code class='json'>{html.escape(text)}</code>"
    summary = label or (
        f"{len(v)} item{'s' if len(v) != 1 else ''}" if isinstance(v, list | dict) else "value"
    )
    return (
        f"<details><summary>{html.escape(summary)}</summary>"
        f"<pre class='json'>{html.escape(json.dumps(v, indent=1, default=str))}</pre></details>"
    )


def _fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list | dict):
        return _json_cell(v)
    return html.escape(str(v))


def _fmt_md(v) -> str:
    if isinstance(v, list | dict):
        return json.dumps(v, default=str).replace("|", "\\|")
    return _fmt(v)


def _claim_row(c: dict) -> str:
    """One row of the HTML claims table: id, the claim, its verdict and the plain reading in view; the
    experiment, the rule and the measured numbers (long) in a collapsed block."""
    exps = " + ".join(f"<code>{html.escape(e)}</code>" for e in c["experiment"].split(" + "))
    return (
        f"<tr id='claim-{html.escape(c['id'])}'><td>{html.escape(c['id'])}</td><td class='stmt'>"
        f"{html.escape(c['claim'])}</td><td class='v' style='background:{_COLORS.get(c['verdict'], '#fff')}'>"
        f"{html.escape(c['verdict'])}</td><td>{html.escape(c.get('plain') or '')}</td><td><details><summary>"
        f"rule and numbers</summary><p><b>experiment:</b> {exps}</p><p><b>rule:</b> {html.escape(c['rule'])}"
        f"</p><p><b>measured:</b> {html.escape(c['measured'])}</p></details></td></tr>"
    )


def _scalar_items(summary: dict) -> list[tuple[str, object]]:
    skip = {"experiment", "title", "paper", "table"}
    return [(k, v) for k, v in summary.items() if k not in skip and not isinstance(v, list | dict)]


_ORDER = {"holds": 0, "does not hold": 0, "inconclusive": 1}  # decided first, in the table's order


def _plain_section(claims: list[dict], runs: dict[str, dict]) -> tuple[str, list[str]]:
    """The report's first section: every decided or undecided claim as one line in plain words (decided
    first, in the table's order), the claims not run or not testable named in one line; HTML and Markdown."""
    shown = sorted((c for c in claims if c["verdict"] in _ORDER), key=lambda c: _ORDER[c["verdict"]])
    rest: dict[str, list[str]] = {}
    for c in claims:
        if c["verdict"] not in _ORDER:
            rest.setdefault(c["verdict"], []).append(c["id"])
    quick = [n for n, r in runs.items() if (r.get("manifest") or {}).get("quick")]
    note = (
        "Each claim is stated, then its verdict, then what the run found, written from the verdict and the "
        "numbers measured below (one-sided α = 0.05; "
        "“significant” means the test rejected at that level; “could not tell” means the run could not "
        "decide, and says why)."
        + (
            f" {len(quick)} of {len(runs)} runs used the quick configuration: small runs, about themselves "
            "only; <code>privalign reproduce all</code> runs the full ones."
            if quick
            else ""
        )
    )
    h = [
        "<section id='plain'><h2>Key findings in plain words</h2>",
        f"<p class='note'>{note}</p><ul class='plain'>",
    ]
    md = ["## Key findings in plain words", ""]
    for c in shown:
        h.append(
            f"<li><a href='#claim-{html.escape(c['id'])}'>{html.escape(c['id'])}</a> "
            f"<span class='stmt'>{html.escape(c['claim'])}</span> <span class='v' "
            f"style='background:{_COLORS[c['verdict']]}'>{html.escape(c['verdict'])}</span>"
            f"<div class='found'>{html.escape(c['plain'])}</div></li>"
        )
        md.append(f"- **{c['id']}** {c['claim']} — **{c['verdict']}**. Found: {c['plain']}")
    h.append("</ul>")
    if rest:
        tail = "; ".join(f"{v}: {', '.join(ids)}" for v, ids in rest.items()) + " (reasons in the table)."
        h.append(f"<p class='note'>{html.escape(tail)}</p>")
        md += ["", tail]
    h.append("</section>")
    return "\n".join(h), md + [""]


def write_report(run_dirs: list[str | Path], out: str | Path) -> Path:
    """Write ``OUT/report.html``, ``OUT/report.md``, ``OUT/claims.json`` and ``OUT/figures/``.

    Raises:
      ExperimentError: a directory is not a run directory, or two directories hold the same experiment.
    """
    dirs = [Path(d) for d in run_dirs]
    records, runs = _load_runs(dirs)
    claims = evaluate_claims(records, runs)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "figures").mkdir(exist_ok=True)
    write_json_atomic(out / "claims.json", claims)

    plain_html, plain_md = _plain_section(claims, runs)
    counts: dict[str, int] = {}
    for c in claims:
        counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    h: list[str] = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>privalign reproduction "
        "report</title>",
        "<style>body{font-family:system-ui,sans-serif;max-width:1180px;margin:1.5em auto;padding:0 "
        "1em;color:#222}table{border-collapse:collapse;margin:0.6em 0;font-size:0.88em}td,th{border:1px "
        "solid #bbb;padding:4px "
        "7px;vertical-align:top;text-align:left}th{background:#f0f0f0}td:first-child{white-space:nowrap}"
        "td{overflow-wrap:break-word;word-break:normal;hyphens:none;max-width:460px}.nw{white-space:nowrap}"
        "td "
        "code:not(.json){white-space:nowrap}.tw{max-width:100%;overflow-x:auto}pre.json{max-height:16em;"
        "max-width:440px;overflow:auto;margin:0.3em 0;font-size:0.92em;white-space:pre}details "
        "summary{cursor:pointer;color:#245}figure{display:inline-block;margin:0.5em;max-width:100%}"
        "img{max-width:100%;border:1px solid "
        "#ddd}figcaption{font-size:0.8em;color:#555}.v{font-weight:600;white-space:nowrap}"
        "code{background:#f4f4f4;padding:0 3px}ul.plain{padding-left:1.2em;line-height:1.5}ul.plain li{"
        "margin:0.45em 0}.note{color:#555;font-size:0.92em}.stmt{font-style:italic}"
        # the claims table: fixed column widths (colgroup), text wraps inside its column, never into the next
        "table.claims{table-layout:fixed;width:100%}table.claims td{overflow-wrap:anywhere;max-width:none}"
        "table.claims td.v{white-space:normal}table.claims details p{margin:0.35em 0}"
        "</style></head><body>",
        "<h1>privalign: reproduction report</h1>",
        plain_html,
        f"<p>Generated {utc_now()} from {len(dirs)} run director{'y' if len(dirs) == 1 else 'ies'}. "
        "Verdicts are computed from each run's <code>results.jsonl</code> with the stated rule; "
        "comparisons use a 2-standard-error margin. "
        + ", ".join(f"{v}: {n}" for v, n in sorted(counts.items()))
        + ".</p>",
        "<h2>Claims</h2><p class='note'>Each claim as stated, its verdict and what the run found in plain "
        "words; the experiment, the rule and every number measured are under “rule and numbers”.</p>"
        "<div class='tw'><table class='claims'><colgroup><col style='width:4.5em'><col style='width:26%'>"
        "<col style='width:8em'><col style='width:38%'><col></colgroup><tr><th>id</th><th>claim</th>"
        "<th>verdict</th><th>what this run found</th><th>experiment, rule, numbers</th></tr>",
    ]
    h += [_claim_row(c) for c in claims]
    h.append("</table></div>")
    h.append(
        "<h2>Runs</h2><div class='tw'><table><tr><th>experiment</th><th>status</th><th>quick</th><th>config "
        "hash</th><th>git commit</th><th>dirty</th><th>seed</th><th>ran (UTC)</th><th>inputs</th></tr>"
    )
    md: list[str] = [
        "# privalign: reproduction report",
        "",
        *plain_md,
        f"Generated {utc_now()}. Verdicts are computed from "
        "each run's `results.jsonl` with the stated rule (2-standard-error margins).",
        "",
        "## Claims",
        "",
        "| id | claim | experiment | rule | measured | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for c in claims:
        cells = [c["id"], c["claim"], f"`{c['experiment']}`", c["rule"], c["measured"], f"**{c['verdict']}**"]
        md.append("| " + " | ".join(x.replace("|", "\\|").replace("\n", " ") for x in cells) + " |")
    md += [
        "",
        "## Runs",
        "",
        "| experiment | status | quick | config hash | git commit | dirty | inputs |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        m = run["manifest"]
        git = m.get("git") or {}
        inp = m.get("inputs") or {}
        inputs_cell = (
            _json_cell(inp, ", ".join(inp) if isinstance(inp, dict) and inp else None) if inp else "—"
        )
        h.append(
            f"<tr><td>{html.escape(name)}</td><td>{html.escape(str(m.get('status')))}</td><td>"
            f"{m.get('quick')}</td><td><code>{str(m.get('config_hash'))[:12]}</code></td><td><code>"
            f"{str(git.get('commit'))[:10]}</code></td><td>{git.get('dirty')}</td><td>{m.get('seed_entropy')}"
            f"</td><td class='nw' title='{html.escape(str(m.get('started_at')))} to "
            f"{html.escape(str(m.get('ended_at')))}'>{_span(m.get('started_at'), m.get('ended_at'))}</td><td>"
            f"{inputs_cell}</td></tr>"
        )
        inputs_md = ", ".join(str(k) for k in inp) if isinstance(inp, dict) else str(inp)
        md.append(
            f"| {name} | {m.get('status')} | {m.get('quick')} | `{str(m.get('config_hash'))[:12]}` | "
            f"`{str(git.get('commit'))[:10]}` | {git.get('dirty')} | {inputs_md.replace('|', '/') or '—'} |"
        )
    h.append("</table></div>")
    for name, run in runs.items():
        summ = run["summary"]
        h.append(
            f"<h2 id='{html.escape(name)}'>{html.escape(name)}: {html.escape(summ.get('title', ''))}</h2>"
        )
        md += ["", f"## {name}: {summ.get('title', '')}", ""]
        items = _scalar_items(summ)
        if items:
            h.append(
                "<div class='tw'><table>"
                + "".join(f"<tr><th>{html.escape(k)}</th><td>{_fmt(v)}</td></tr>" for k, v in items)
                + "</table></div>"
            )
            md += [f"- {k}: {_fmt_md(v)}" for k, v in items]
        table = summ.get("table")
        if isinstance(table, list) and table and isinstance(table[0], dict):
            cols = list(table[0])
            h.append(
                "<div class='tw'><table><tr>"
                + "".join(f"<th>{html.escape(c)}</th>" for c in cols)
                + "</tr>"
                + "".join(
                    "<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in cols) + "</tr>" for r in table
                )
                + "</table></div>"
            )
            md += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            md += ["| " + " | ".join(_fmt_md(r.get(c)) for c in cols) + " |" for r in table]
        # further titled tables (e.g. p2-accuracy's sparsity check): summary["tables"] = {title: [row dicts]}
        for title, rows in (summ.get("tables") or {}).items():
            if not (isinstance(rows, list) and rows and isinstance(rows[0], dict)):
                continue
            cols = list(dict.fromkeys(c for r in rows for c in r))
            h.append(
                f"<h3>{html.escape(str(title))}</h3><div class='tw'><table><tr>"
                + "".join(f"<th>{html.escape(c)}</th>" for c in cols)
                + "</tr>"
                + "".join(
                    "<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in cols) + "</tr>" for r in rows
                )
                + "</table></div>"
            )
            md += ["", f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            md += ["| " + " | ".join(_fmt_md(r.get(c)) for c in cols) + " |" for r in rows]
        for png in sorted((Path(run["dir"]) / "figures").glob("*.png")):
            h.append(_img_tag(png, f"{name}: {png.stem}"))
            dest = out / "figures" / f"{name}__{png.name}"
            shutil.copyfile(png, dest)
            md += ["", f"![{name}: {png.stem}](figures/{dest.name})"]
    h.append("</body></html>")
    (out / "report.html").write_text("\n".join(h), encoding="utf-8")
    (out / "report.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    return out / "report.html"
