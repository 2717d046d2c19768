"""The report: one self-contained ``report.html`` (figures embedded as base64) and ``report.md``, with a
**claims table** computed from the run directories' ``results.jsonl`` files.

Every claim of the two papers is listed with the experiment that tests it, the numbers measured (read
from ``results.jsonl`` at report time, never typed in), and a verdict from a stated rule:

* ``holds`` / ``does not hold``: the rule was applied to the measured numbers;
* ``inconclusive``: the experiment ran but the numbers cannot decide (e.g. too few N values);
* ``not run``: no run directory of the testing experiment was given to ``privalign report``;
* ``not testable here``: with the reason (e.g. 7B models, asymptotic statements without constants).

Comparisons use a 2-standard-error margin: "A is below B" means ``B − A > 2·sqrt(se_A² + se_B²)``
(one-sided false-positive rate ≈ 2.3% per comparison under a normal approximation; no multiplicity
correction across the table, which is descriptive). A quick configuration's verdict is about that small
run only, and the report says so.
"""

from __future__ import annotations

import base64
import html
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from privalign.experiments.manifest import read_manifest, utc_now, write_json_atomic
from privalign.experiments.runner import ExperimentError, read_results, read_summary

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
      evaluate: ``records_by_experiment -> (verdict, measured)``; ``None`` when not testable.
      reason: Why it is not testable here (when ``evaluate`` is ``None``).
    """

    id: str
    paper: str
    text: str
    experiment: str | None
    rule: str
    evaluate: Callable[[Records], Verdict] | None = None
    reason: str = ""


def _z(a: float, se_a: float, b: float, se_b: float) -> float:
    """(b − a) in units of the combined standard error (inf when both SE are 0 and b ≠ a)."""
    se = math.sqrt((se_a or 0.0) ** 2 + (se_b or 0.0) ** 2)
    d = b - a
    return d / se if se > 0 else (math.inf if d > 0 else (-math.inf if d < 0 else 0.0))


def _series(records: list[dict], method: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        if r.get("method") == method and r.get("lift") is not None:
            out.setdefault(r["variant"], []).append(r)
    for v in out.values():
        v.sort(key=lambda r: r["N"])
    return out


def _monotone(records: Records, exp: str, method: str, *, want_monotone: bool) -> Verdict:
    recs = records[exp]
    series = _series(recs, method)
    if not series:
        return "inconclusive", f"no {method} results in {exp}"
    parts, drops = [], []
    for name, rows in sorted(series.items()):
        if len(rows) < 3:
            return "inconclusive", f"{name}: only {len(rows)} N values"
        best = max(rows, key=lambda r: r["lift"])
        last = rows[-1]
        z = _z(last["lift"], last["lift_se"], best["lift"], best["lift_se"])
        drops.append(z > 2.0)
        parts.append(f"{name}: lift {last['lift']:.2f}±{last['lift_se']:.2f} at N={last['N']} vs best "
                     f"{best['lift']:.2f}±{best['lift_se']:.2f} at N={best['N']} (drop {z:.1f} SE)")
    measured = "; ".join(parts)
    if want_monotone:
        return ("holds" if not any(drops) else "does not hold"), measured
    return ("holds" if all(drops) else "does not hold"), measured


def _privitp_vs_privbon(records: Records) -> Verdict:
    recs = records["p1-scaling"]
    itp, bon = _series(recs, "PrivITP"), _series(recs, "PrivBoN")
    if not itp or not bon:
        return "inconclusive", "PrivITP or PrivBoN missing from p1-scaling"
    parts, ok = [], []
    for (ni, ri), (nb, rb) in zip(sorted(itp.items()), sorted(bon.items())):
        a, b = ri[-1], rb[-1]
        z = _z(a["lift"], a["lift_se"], b["lift"], b["lift_se"])  # > 0: PrivBoN above PrivITP
        ok.append(z <= 2.0)
        e1 = a.get("epsilon1")
        parts.append(f"N={a['N']}: {ni} {a['lift']:.2f}±{a['lift_se']:.2f} vs {nb} {b['lift']:.2f}±{b['lift_se']:.2f} "
                     f"(PrivBoN ε={b.get('epsilon') or float('nan'):.3g}; PrivITP ε1={e1 if e1 is None else round(e1, 3)} "
                     "+ realised ε2; matched by σ as the authors did, not by ε: K12)")
    return ("holds" if all(ok) else "does not hold"), "; ".join(parts)


def _eps_star(records: Records) -> Verdict:
    recs = [r for r in records["p1-epsilon-star"] if r.get("epsilon") is not None and r.get("variant") == "sigma_reg"]
    if not recs:
        return "inconclusive", "no finite-ε results of the σ = max(2Δ/ε, σ_reg) curve"
    e_star = recs[0]["eps_star"]
    bound = math.sqrt(recs[0]["coverage"] * recs[0]["eps_rm"] ** 2)
    above = [r for r in recs if r["epsilon"] >= e_star]
    if not above:
        return "inconclusive", f"ε* = {e_star:.3g} is above the largest ε on the grid"
    worst = max(above, key=lambda r: r["regret"])
    ok = worst["regret"] - 2 * worst["regret_se"] <= bound
    plain = {r["epsilon"]: r["regret"] for r in records["p1-epsilon-star"] if r.get("variant") == "plain" and r.get("epsilon")}
    extra = f"; plain σ = 2Δ/ε at ε={worst['epsilon']:g}: {plain[worst['epsilon']]:.3f}" if worst["epsilon"] in plain else ""
    return ("holds" if ok else "does not hold"), (
        f"ε* = {e_star:.3g}; with σ = max(2Δ/ε, σ_reg), max regret at ε ≥ ε*: {worst['regret']:.3f}±{worst['regret_se']:.3f} "
        f"(ε={worst['epsilon']:g}); √(C·ε_RM²) = {bound:.3f}; skyline ¼√(C·ε_RM²) = {bound / 4:.3f}{extra}")


def _budget(records: Records) -> Verdict:
    allr = records["p1-budget"]
    recs = [r for r in allr if r.get("accounting") == "ex-post filter"]
    if not recs:
        return "inconclusive", "no ex-post filter rows"
    over = [r for r in allr if ("spent_epsilon" in r and r.get("accounting") != "basic composition"
                                and r["spent_epsilon"] > r["budget_epsilon"] + 1e-9)
            or ("spent_rho" in r and r["spent_rho"] > r["rho_budget"] + 1e-12)]
    ok = all(r["served"] > r["t_basic"] for r in recs)
    by_sigma: dict = {}
    for r in recs:
        by_sigma.setdefault(r["sigma"], []).append(r)
    parts = [f"σ={s:g}: served {min(r['served'] for r in rows)}–{max(r['served'] for r in rows)} over {len(rows)} sessions "
             f"vs T_basic {rows[0]['t_basic']}" + (" (pool exhausted)" if any(r.get("pool_exhausted") for r in rows) else "")
             for s, rows in sorted(by_sigma.items())]
    bon = {r["accounting"]: r["served"] for r in allr if r.get("method") == "PrivBoN" and r.get("seed_index") == 0}
    if bon:
        parts.append("PrivBoN seed 0: " + ", ".join(f"{k} {v}" for k, v in sorted(bon.items())))
    verdict = "holds" if ok and not over else "does not hold"
    return verdict, "; ".join(parts) + (f"; {len(over)} OVERSHOOT(S)" if over else "; no overshoot")


def _rates_slope(records: Records, *, sweep: str, method: str, low: float, high: float) -> Verdict:
    from privalign.experiments.paper2 import fit_slope

    s = fit_slope(records["p2-rates"], sweep, method)
    if s is None:
        return "inconclusive", f"fewer than two {sweep} values for {method}"
    if low <= s["slope"] <= high:
        verdict = "holds"
    elif s["slope_hi"] < low or s["slope_lo"] > high:
        verdict = "does not hold"
    else:
        verdict = "inconclusive"  # point estimate outside the range, but the 95% CI overlaps it
    return verdict, (
        f"{method}: log-log slope of the error vs {sweep} = {s['slope']:.2f} (95% CI {s['slope_lo']:.2f}..{s['slope_hi']:.2f}, "
        f"{s['points']} points)")


def _sparse_beats_dense(records: Records) -> Verdict:
    recs = records["p2-accuracy"]
    parts, ok = [], []
    for eps in (2.0, 8.0):
        for ds in sorted({r["dataset"] for r in recs}):
            row = {r["method"]: r for r in recs if r.get("epsilon") == eps and r.get("dataset") == ds}
            for sparse, dense in (("RRIHT", "DenseRR"), ("SampleDPIHT", "DPSGDLinear")):
                if sparse in row and dense in row:
                    a, b = row[dense], row[sparse]
                    ok.append(b["accuracy"] > a["accuracy"])
                    parts.append(f"{ds} ε={eps:g}: {sparse} {b['accuracy']:.3f} vs {dense} {a['accuracy']:.3f} "
                                 f"(±{max(a['accuracy_se'], b['accuracy_se']):.3f})")
    if not ok:
        return "inconclusive", "no matching rows at ε ∈ {2, 8}"
    return ("holds" if all(ok) else "does not hold"), "; ".join(parts)


def _winrate_order(records: Records) -> Verdict:
    from privalign.experiments.winrate import order_verdict

    return order_verdict(records["p2-winrate"], epsilon=8.0)


def _train_vs_inference(records: Records) -> Verdict:
    recs = records["beyond-train-vs-inference"]
    last = max((r["T"] for r in recs if "T" in r), default=None)
    if last is None:
        return "inconclusive", "no rows"
    rows = {r["method"]: r for r in recs if r.get("T") == last}
    if "DP reward model + BoN" not in rows or "PrivBoN" not in rows:
        return "inconclusive", f"methods at T={last}: {sorted(rows)}"
    a, b = rows["PrivBoN"], rows["DP reward model + BoN"]
    z = _z(a["value"], a["value_se"], b["value"], b["value_se"])
    return ("holds" if z > 2 else "does not hold"), (
        f"T={last}: DP-trained RM + BoN {b['value']:.3f}±{b['value_se']:.3f} vs PrivBoN {a['value']:.3f}±{a['value_se']:.3f} "
        "at the same total (ε, δ)")


def _membership(records: Records) -> Verdict:
    recs = [r for r in records["beyond-membership"] if r.get("kind") == "attack"]
    priv = sorted([r for r in recs if r["service"] == "PrivBoN"], key=lambda r: r["epsilon_claimed"])
    bon = [r for r in recs if r["service"] == "BoN"]
    if not priv:
        return "inconclusive", "no PrivBoN audit rows"
    ok = all(r["eps_lower_bound"] <= r["epsilon_claimed"] + 1e-12 for r in priv)
    parts = [f"BoN: advantage {bon[0]['advantage']:.3f} at Q={bon[0]['Q_max']}, audit ε ≥ {bon[0]['eps_lower_bound']:.2f}"] if bon else []
    parts += [f"PrivBoN ε={r['epsilon_claimed']:g}: audit ε ≥ {r['eps_lower_bound']:.3f}, advantage {r['advantage']:.3f} at "
              f"Q={r['Q_max']}" for r in priv]
    return ("holds" if ok else "does not hold"), "; ".join(parts)


CLAIMS: list[Claim] = [
    Claim("P1-1", "Paper 1", "BoN is not scaling-monotonic: past a critical N its true reward falls (reward hacking). [paper; Huang]",
          "p1-scaling", "holds if BoN's lift at the largest N is more than 2 SE below its best lift over N",
          lambda R: _monotone(R, "p1-scaling", "BoN", want_monotone=False)),
    Claim("P1-2", "Paper 1", "PrivBoN is scaling-monotonic: its lift does not fall as N grows. [paper]",
          "p1-scaling", "holds if, for every PrivBoN variant, the lift at the largest N is within 2 SE of its best lift",
          lambda R: _monotone(R, "p1-scaling", "PrivBoN", want_monotone=True)),
    Claim("P1-3", "Paper 1", "PrivITP is scaling-monotonic. [paper]", "p1-scaling",
          "holds if the PrivITP lift at the largest N is within 2 SE of its best lift",
          lambda R: _monotone(R, "p1-scaling", "PrivITP", want_monotone=True)),
    Claim("P1-4", "Paper 1", "ITP is scaling-monotonic (attains the skyline; Huang et al.). [paper; Huang]", "p1-scaling",
          "holds if the ITP lift at the largest N is within 2 SE of its best lift",
          lambda R: _monotone(R, "p1-scaling", "ITP", want_monotone=True)),
    Claim("P1-5", "Paper 1", "PrivITP matches or beats PrivBoN at equivalent privacy. [paper]", "p1-scaling",
          "holds if PrivITP's lift at the largest N is not more than 2 SE below PrivBoN's (pairs matched as in the authors' script)",
          _privitp_vs_privbon),
    Claim("P1-6", "Paper 1", "Ex-post (adaptive) composition serves more prompts under a fixed budget than basic composition. [paper]",
          "p1-budget", "holds if, for every σ and seed, prompts served by the ex-post filter > T_basic = ⌊ε_total/ε_max⌋ and no run overshoots",
          _budget),
    Claim("P1-7", "Paper 1", "At ε ≥ ε* = 2Δ_r√C/ε_RM, PrivBoN's regret is O(√(C·ε_RM²)): privacy costs nothing extra. [paper]",
          "p1-epsilon-star", "with σ = max(2Δ_r/ε, σ_reg) (docs/privacy/privbon.md): holds if the largest regret at grid ε ≥ ε*, minus 2 SE, is ≤ √(C·ε_RM²) (constant 1: our choice, the paper states O(·))",
          _eps_star),
    Claim("P1-8", "Paper 1", "PrivITP's ex-post cost depends only on the realised stopping time, not on n. [paper]", None,
          "—", None, "a property of the accountant's formula ε2 = (t−1)ℓ1 + ℓ2, checked by unit tests (tests/accounting), not by an experiment"),
    Claim("P1-9", "Paper 1", "Regret bounds: PrivITP O(√(C(ε_RM² + R_max σ))); skyline lower bound ¼√(C ε_RM²). [paper]", None,
          "—", None, "asymptotic statements with unstated constants; only P1-7's instance is checked numerically"),
    Claim("P1-10", "Paper 1", "The reported trends on GSM8K, MMLU and MATH with two LMs and four reward models. [paper]", None,
          "—", None, "needs GPU-built pools (Phi-3-class LM, 10,000 samples per prompt, 7B-scale reward models); "
          "run p1-scaling with --config pointing at such a pool"),
    Claim("P2-1", "Paper 2", "Sample-DP-IHT: error Õ(s*/n + s*²/(n²ε²)), decreasing in n. [paper]", "p2-rates",
          "holds if the log-log slope of the error vs n lies in [-2.5, -0.5]",
          lambda R: _rates_slope(R, sweep="n", method="SampleDPIHT", low=-2.5, high=-0.5)),
    Claim("P2-2", "Paper 2", "RR-IHT: error Õ(s*/n·(1 + 1/ε²)): linear in s*. [paper]", "p2-rates",
          "holds if the log-log slope of the RR-IHT error vs s* lies in [0.5, 1.5]",
          lambda R: _rates_slope(R, sweep="s", method="RRIHT", low=0.5, high=1.5)),
    Claim("P2-3", "Paper 2", "Sparse private estimators depend on d only logarithmically. [paper]", "p2-rates",
          "holds if the log-log slope of the RR-IHT error vs d is ≤ 0.35 (log d growth over the grid)",
          lambda R: _rates_slope(R, sweep="d", method="RRIHT", low=-1.0, high=0.35)),
    Claim("P2-4", "Paper 2", "At ε ∈ {2, 8}, sparse methods (RR-IHT, Sample-DP IHT) beat dense ones (RR, DP-SGD). [paper]",
          "p2-accuracy", "holds if each sparse method's held-out preference accuracy exceeds its dense counterpart's at ε = 2 and 8",
          _sparse_beats_dense),
    Claim("P2-5", "Paper 2", "Win rates at ε = 8: RR-IHT > Sample-DP IHT > RR > DP-SGD (Gemma-3-1B, Llama-2-7B). [paper]",
          "p2-winrate", "SmolLM2-135M best-of-16 analogue on IMDb and HH-RLHF at ε = 8: does not hold if any adjacent pair of "
          "the paper's order is reversed with its 95% paired bootstrap interval below 0 on a data set; holds if the point "
          "estimates are in the paper's order on every data set; else inconclusive",
          _winrate_order),
    Claim("P2-6", "Paper 2", "PPO-aligned LLaMA-7b on IMDb: higher reward at the same KL for sparse methods. [paper]", None,
          "—", None, "7B policy and PPO need a GPU; the SmolLM2 best-of-N analogue is P2-5"),
    Claim("P2-7", "Paper 2", "Minimax lower bounds (Sample-DP and Label-DP). [paper]", None, "—", None,
          "theoretical statements; rates are only checked for their n, s*, d dependence (P2-1..P2-3)"),
    Claim("B-1", "Beyond", "A DP-trained reward model used without further noise (post-processing) beats per-query "
          "PrivBoN at the same total (ε, δ) once T is large. [our question]", "beyond-train-vs-inference",
          "holds if at the largest T the DP-RM + BoN value exceeds PrivBoN's by more than 2 SE", _train_vs_inference),
    Claim("B-2", "Beyond", "Membership inference by repeated queries succeeds against plain BoN; against PrivBoN the "
          "audit's empirical ε lower bound stays below the claimed ε. [paper describes the attack]", "beyond-membership",
          "holds if PrivBoN's empirical ε lower bound (Clopper–Pearson, stated α) ≤ the claimed ε", _membership),
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
            raise ExperimentError(f"Two run directories for experiment {name!r}: {runs[name]['dir']} and {d}.")
        records[name] = read_results(d)
        runs[name] = {"dir": str(d), "manifest": man, "summary": read_summary(d)}
    return records, runs


def evaluate_claims(records: Records, runs: dict[str, dict] | None = None) -> list[dict]:
    """Apply every claim's rule to the records (``experiment name -> results.jsonl records``)."""
    out = []
    for c in CLAIMS:
        row = {"id": c.id, "paper": c.paper, "claim": c.text, "experiment": c.experiment or "—", "rule": c.rule}
        if c.evaluate is None:
            row.update(verdict="not testable here", measured=c.reason)
        elif c.experiment not in records:
            from privalign.experiments.registry import EXPERIMENTS

            why = (f"no run directory of {c.experiment} was given" if c.experiment in EXPERIMENTS
                   else f"{c.experiment} is not implemented in this build (docs/experiments.md says why)")
            row.update(verdict="not run", measured=why)
        elif not records[c.experiment]:
            row.update(verdict="inconclusive", measured="the run has no results")
        else:
            try:
                verdict, measured = c.evaluate(records)
            except (KeyError, TypeError, ValueError) as exc:
                verdict, measured = "inconclusive", f"results lack a needed field ({type(exc).__name__}: {exc})"
            if runs and c.experiment in runs:
                man = runs[c.experiment]["manifest"]
                if man.get("quick"):
                    measured += " [quick configuration]"
                if man.get("status") != "complete":
                    measured += " [run INCOMPLETE]"
                pool = (man.get("inputs") or {}).get("pool") or {}
                if pool.get("kind") == "synthetic-fallback":
                    measured += " [synthetic pool: the shipped pool was absent]"
            row.update(verdict=verdict, measured=measured)
        out.append(row)
    return out


_COLORS = {"holds": "#d8f0d8", "does not hold": "#f8d0d0", "inconclusive": "#fff2c0", "not run": "#eeeeee",
           "not testable here": "#e0e8f8"}


def _img_tag(png: Path, alt: str) -> str:
    data = base64.b64encode(png.read_bytes()).decode()
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"/><figcaption>{html.escape(alt)}</figcaption></figure>'


def _short_time(ts) -> str:
    """``2026-11-30T21:40:12.123+00:00`` → ``2026-11-30 21:40:12`` (UTC in the manifest; full value in the tooltip)."""
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
    summary = label or (f"{len(v)} item{'s' if len(v) != 1 else ''}" if isinstance(v, list | dict) else "value")
    return (f"<details><summary>{html.escape(summary)}</summary>"
            f"<pre class='json'>{html.escape(json.dumps(v, indent=1, default=str))}</pre></details>")


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


def _scalar_items(summary: dict) -> list[tuple[str, object]]:
    skip = {"experiment", "title", "paper", "table"}
    return [(k, v) for k, v in summary.items() if k not in skip and not isinstance(v, list | dict)]


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

    counts: dict[str, int] = {}
    for c in claims:
        counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    h: list[str] = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>privalign reproduction report</title>",
        "<style>body{font-family:system-ui,sans-serif;max-width:1180px;margin:1.5em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;margin:0.6em 0;font-size:0.88em}td,th{border:1px solid #bbb;padding:4px 7px;"
        "vertical-align:top;text-align:left}th{background:#f0f0f0}td:first-child{white-space:nowrap}"
        "td{overflow-wrap:break-word;word-break:normal;hyphens:none;max-width:460px}.nw{white-space:nowrap}"
        "td code:not(.json){white-space:nowrap}.tw{max-width:100%;overflow-x:auto}pre.json{max-height:16em;max-width:440px;overflow:auto;margin:0.3em 0;"
        "font-size:0.92em;white-space:pre}details summary{cursor:pointer;color:#245}"
        "figure{display:inline-block;margin:0.5em;max-width:100%}"
        "img{max-width:100%;border:1px solid #ddd}figcaption{font-size:0.8em;color:#555}"
        ".v{font-weight:600;white-space:nowrap}code{background:#f4f4f4;padding:0 3px}</style></head><body>",
        "<h1>privalign: reproduction report</h1>",
        f"<p>Generated {utc_now()} from {len(dirs)} run director{'y' if len(dirs) == 1 else 'ies'}. "
        "Verdicts are computed from each run's <code>results.jsonl</code> with the stated rule; "
        "comparisons use a 2-standard-error margin. " + ", ".join(f"{v}: {n}" for v, n in sorted(counts.items())) + ".</p>",
        "<h2>Claims</h2><div class='tw'><table><tr><th>id</th><th>claim</th><th>experiment</th><th>rule</th><th>measured</th><th>verdict</th></tr>",
    ]
    for c in claims:
        h.append(f"<tr><td>{c['id']}</td><td>{html.escape(c['claim'])}</td><td><code>{html.escape(c['experiment'])}</code></td>"
                 f"<td>{html.escape(c['rule'])}</td><td>{html.escape(c['measured'])}</td>"
                 f"<td class='v' style='background:{_COLORS.get(c['verdict'], '#fff')}'>{html.escape(c['verdict'])}</td></tr>")
    h.append("</table></div>")
    h.append("<h2>Runs</h2><div class='tw'><table><tr><th>experiment</th><th>status</th><th>quick</th><th>config hash</th>"
             "<th>git commit</th><th>dirty</th><th>seed</th><th>ran (UTC)</th><th>inputs</th></tr>")
    md: list[str] = ["# privalign: reproduction report", "", f"Generated {utc_now()}. Verdicts are computed from "
                     "each run's `results.jsonl` with the stated rule (2-standard-error margins).", "",
                     "## Claims", "", "| id | claim | experiment | rule | measured | verdict |", "|---|---|---|---|---|---|"]
    for c in claims:
        cells = [c["id"], c["claim"], f"`{c['experiment']}`", c["rule"], c["measured"], f"**{c['verdict']}**"]
        md.append("| " + " | ".join(x.replace("|", "\\|").replace("\n", " ") for x in cells) + " |")
    md += ["", "## Runs", "", "| experiment | status | quick | config hash | git commit | dirty | inputs |", "|---|---|---|---|---|---|---|"]
    for name, run in runs.items():
        m = run["manifest"]
        git = m.get("git") or {}
        inp = m.get("inputs") or {}
        inputs_cell = _json_cell(inp, ", ".join(inp) if isinstance(inp, dict) and inp else None) if inp else "—"
        h.append(f"<tr><td>{html.escape(name)}</td><td>{html.escape(str(m.get('status')))}</td><td>{m.get('quick')}</td>"
                 f"<td><code>{str(m.get('config_hash'))[:12]}</code></td><td><code>{str(git.get('commit'))[:10]}</code></td>"
                 f"<td>{git.get('dirty')}</td><td>{m.get('seed_entropy')}</td>"
                 f"<td class='nw' title='{html.escape(str(m.get('started_at')))} to {html.escape(str(m.get('ended_at')))}'>"
                 f"{_span(m.get('started_at'), m.get('ended_at'))}</td>"
                 f"<td>{inputs_cell}</td></tr>")
        inputs_md = ", ".join(str(k) for k in inp) if isinstance(inp, dict) else str(inp)
        md.append(f"| {name} | {m.get('status')} | {m.get('quick')} | `{str(m.get('config_hash'))[:12]}` | "
                  f"`{str(git.get('commit'))[:10]}` | {git.get('dirty')} | {inputs_md.replace('|', '/') or '—'} |")
    h.append("</table></div>")
    for name, run in runs.items():
        summ = run["summary"]
        h.append(f"<h2 id='{html.escape(name)}'>{html.escape(name)}: {html.escape(summ.get('title', ''))}</h2>")
        md += ["", f"## {name}: {summ.get('title', '')}", ""]
        items = _scalar_items(summ)
        if items:
            h.append("<div class='tw'><table>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{_fmt(v)}</td></tr>" for k, v in items)
                     + "</table></div>")
            md += [f"- {k}: {_fmt_md(v)}" for k, v in items]
        table = summ.get("table")
        if isinstance(table, list) and table and isinstance(table[0], dict):
            cols = list(table[0])
            h.append("<div class='tw'><table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr>" + "".join(
                "<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in cols) + "</tr>" for r in table) + "</table></div>")
            md += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            md += ["| " + " | ".join(_fmt_md(r.get(c)) for c in cols) + " |" for r in table]
        for png in sorted((Path(run["dir"]) / "figures").glob("*.png")):
            h.append(_img_tag(png, f"{name}: {png.stem}"))
            dest = out / "figures" / f"{name}__{png.name}"
            shutil.copyfile(png, dest)
            md += ["", f"![{name}: {png.stem}](figures/{dest.name})"]
    h.append("</body></html>")
    (out / "report.html").write_text("\n".join(h), encoding="utf-8")
    (out / "report.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    return out / "report.html"
