"""Each claim's one-line reading in plain words (privalign.experiments.plain), on constructed results for
each of "holds", "does not hold" and "inconclusive": the reading follows the verdict, carries the numbers the
rule measured (it changes when they change: nothing is typed in), and a claim without a reader still gets
one. The demo's terminal table and the top of report.md show the readings in full."""

from __future__ import annotations

import re

import pytest
from test_verdict_rules import (
    BON_DEGRADES,
    BON_RISES,
    FRONTIER_CLOSE,
    FRONTIER_TIE,
    FRONTIER_WINS,
    LOSS,
    RATE_CLAIMS,
    REAL,
    WIN,
    _audit,
    _budget,
    _curve,
    _epsstar,
    _fixed,
    _frontier,
    _policies,
    _rates,
    _replicated,
    _sweep,
    _tvi,
    _winrate,
)

from privalign.experiments import report as R
from privalign.experiments.plain import num, reading

CTRL = _curve("BoN", BON_DEGRADES)
HACKS = {"p1-scaling": {"manifest": {"status": "complete", "config": {"syn_hack_rate": 0.01}}}}
GROWS = [1, 1.2, 2, 4, 10, 30]


def _user_attack(per_label: list[tuple[float, bool]], user: list[tuple[float, bool]]) -> list[dict]:
    rows = [("per-label", s, b, v) for s, (b, v) in enumerate(per_label)]
    rows += [("user", s, b, v) for s, (b, v) in enumerate(user)]
    return [
        {
            "kind": "attack",
            "variant": w,
            "seed": s,
            "stated_epsilon": 1.0,
            "eps_lower_bound": b,
            "violation": v,
        }
        for w, s, b, v in rows
    ]


def _user_utility(diffs: list[float]) -> list[dict]:
    out = []
    for s, d in enumerate(diffs):
        for variant, k, acc in (("group", None, 0.55), ("user", 10, 0.55 + d)):
            out.append(
                {
                    "kind": "utility",
                    "seed": s,
                    "method": "rr",
                    "epsilon": 1.0,
                    "variant": variant,
                    "k": k,
                    "accuracy": acc,
                    "k_public": 10,
                }
            )
    return out


def _cases():
    """claim id → {verdict: (records by experiment, runs)}."""
    c: dict[str, dict] = {
        "P1-1": {
            "holds": ({"p1-scaling": CTRL}, None),
            "does not hold": ({"p1-scaling": _curve("BoN", BON_RISES, noise=0.2)}, HACKS),
            "inconclusive": ({"p1-scaling": _curve("BoN", BON_RISES, pool=REAL)}, None),
        },
        "P1-5": {
            "holds": ({"p1-privacy-sweep": _sweep(+1.0)}, None),
            "does not hold": ({"p1-privacy-sweep": _sweep(-10.0)}, None),
            "inconclusive": ({"p1-privacy-sweep": _sweep(-1.0, noise=40.0)}, None),
        },
        "P1-6": {
            "holds": ({"p1-budget": _budget(20, 5, [0.3, 0.35, 0.28, 0.31, 0.33])}, None),
            "does not hold": ({"p1-budget": _budget(5, 5, [0.3, 0.35, 0.28])}, None),
            "inconclusive": ({"p1-budget": _budget(20, 5, [0.3, -0.3, 0.1, -0.2])}, None),
        },
        "P1-7": {
            "holds": ({"p1-epsilon-star": _epsstar(0.0, 0.3)}, None),
            "does not hold": ({"p1-epsilon-star": _epsstar(0.2, 0.3)}, None),
            "inconclusive": ({"p1-epsilon-star": _epsstar(0.0, 0.0)}, None),
        },
        "P1-8": {
            "holds": ({"p1-scaling": _fixed(GROWS, [0.5] * 6)}, None),
            "does not hold": ({"p1-scaling": _fixed(GROWS, [0.8 * g for g in GROWS])}, None),
            "inconclusive": ({"p1-scaling": _fixed(GROWS, [0.5, 0.5, 0.5, 0.5, 4, 8])}, None),
        },
        "P2-4": {
            "holds": ({"p2-accuracy": _replicated(WIN)}, None),
            "does not hold": ({"p2-accuracy": _replicated(LOSS)}, None),
            "inconclusive": ({"p2-accuracy": _replicated([(22, 18)] * 5)}, None),
        },
        "P2-5": {
            "holds": (
                {
                    "p2-winrate": _winrate(
                        {"RRIHT": 0.8, "SampleDPIHT": 0.7, "DenseRR": 0.6, "DPSGDLinear": 0.5}
                    )
                },
                None,
            ),
            "does not hold": (
                {
                    "p2-winrate": _winrate(
                        {"RRIHT": 0.6, "SampleDPIHT": 0.7, "DenseRR": 0.6, "DPSGDLinear": 0.5}
                    )
                },
                None,
            ),
            "inconclusive": (
                {
                    "p2-winrate": _winrate(
                        {"RRIHT": 0.7, "SampleDPIHT": 0.7, "DenseRR": 0.6, "DPSGDLinear": 0.5}
                    )
                },
                None,
            ),
        },
        "P2-6": {
            "holds": ({"p2-rlhf": _policies(0.05, 0.05)}, None),
            "does not hold": ({"p2-rlhf": _policies(0.05, -4.0 * 0.1 / 200**0.5)}, None),
            "inconclusive": ({"p2-rlhf": _policies(0.05, -2.1 * 0.1 / 200**0.5)}, None),
        },
        "B-1": {
            "holds": ({"beyond-train-vs-inference": _tvi({1: -0.1, 10: 0.0, 100: 0.1, 10_000: 0.2})}, None),
            "does not hold": (
                {"beyond-train-vs-inference": _tvi({1: -0.2, 10: -0.1, 100: -0.1, 10_000: -0.1})},
                None,
            ),
            "inconclusive": (
                {"beyond-train-vs-inference": _tvi({1: 0.0, 10: 0.005, 100: 0.0, 10_000: 0.005})},
                None,
            ),
        },
        "B-3": {
            "holds": ({"beyond-frontier": _frontier(FRONTIER_WINS)}, None),
            "does not hold": ({"beyond-frontier": _frontier(FRONTIER_TIE, P=3000, noise=0.02)}, None),
            "inconclusive": ({"beyond-frontier": _frontier(FRONTIER_CLOSE, P=8, noise=0.3, seeds=2)}, None),
        },
        "U-1": {
            "holds": ({"beyond-user-level": _user_attack([(3.0, True)] * 5, [(0.1, False)] * 5)}, None),
            "does not hold": (
                {"beyond-user-level": _user_attack([(3.0, True)] * 5, [(0.1, False)] * 4 + [(1.4, True)])},
                None,
            ),
            "inconclusive": (
                {"beyond-user-level": _user_attack([(3.0, True)] * 4 + [(0.8, False)], [(0.1, False)] * 5)},
                None,
            ),
        },
        "U-2": {
            "holds": ({"beyond-user-level": _user_utility([0.05, 0.06, 0.055, 0.052, 0.058])}, None),
            "does not hold": (
                {"beyond-user-level": _user_utility([-0.05, -0.06, -0.055, -0.05, -0.057])},
                None,
            ),
            "inconclusive": ({"beyond-user-level": _user_utility([0.1, -0.05, 0.12, -0.04, 0.08])}, None),
        },
        "B-2": {
            "holds": ({"beyond-membership": _audit(1.5, {2.0: 0.4, 8.0: 3.0})}, None),
            "does not hold": ({"beyond-membership": _audit(1.5, {2.0: 0.4, 8.0: 8.5})}, None),
            "inconclusive": ({"beyond-membership": _audit(0.0, {2.0: 0.4})}, None),
        },
    }
    for cid, method in (("P1-2", "PrivBoN"), ("P1-4", "ITP")):
        c[cid] = {
            "holds": ({"p1-scaling": CTRL + _curve(method, [0, 10, 20, 25, 25, 25], seed=1)}, None),
            "does not hold": ({"p1-scaling": CTRL + _curve(method, [0, 10, 20, 25, 15, 5], seed=1)}, None),
            "inconclusive": (
                {"p1-scaling": CTRL + _curve(method, [0, 10, 20, 25, 23, 21], noise=60.0, seed=1)},
                None,
            ),
        }
    for cid, sweep, method, values, inside, outside, edge in RATE_CLAIMS:
        c[cid] = {
            "holds": ({"p2-rates": _rates(sweep, method, values, inside)}, None),
            "does not hold": ({"p2-rates": _rates(sweep, method, values, outside)}, None),
            "inconclusive": ({"p2-rates": _rates(sweep, method, values, edge, noise=0.05)}, None),
        }
    return c


CASES = _cases()


def _claim(cid, records, runs=None):
    return {c["id"]: c for c in R.evaluate_claims(records, runs)}[cid]


@pytest.mark.parametrize("cid", sorted(CASES))
def test_each_claim_reads_in_plain_words_for_each_verdict(cid):
    text = {c.id: c.text for c in R.CLAIMS}[cid]
    seen = {}
    for verdict, (records, runs) in CASES[cid].items():
        row = _claim(cid, records, runs)
        assert row["verdict"] == verdict, (cid, verdict, row["measured"][:300])
        line = row["plain"]
        assert "\n" not in line and 20 < len(line) <= 300, line
        assert line == reading(text, verdict, R_facts(cid, records, runs), R.READERS[cid])
        # the claim's own reader wrote it (not the fallback that restates the claim)
        assert not line.startswith(("Supported by this run", "Contradicted by this run")), line
        undecided = "could not tell" in line.lower()
        assert undecided == (verdict == "inconclusive"), line
        if verdict == "inconclusive":
            assert "significant)" not in line and "(significant" not in line
        seen[verdict] = line
    assert len(set(seen.values())) == 3, seen


def R_facts(cid, records, runs):
    """The facts the claim's rule returned (recomputed: the reading is a function of them)."""
    claim = {c.id: c for c in R.CLAIMS}[cid]
    full = {e: records.get(e, []) for e in (claim.experiment, *claim.also) if e}
    full.update(records)
    from privalign.experiments.verdicts import facts_of

    return facts_of(claim.evaluate(full, runs))


def test_p1_5_says_which_method_won_at_equal_privacy_with_its_epsilons_and_numbers():
    row = _claim("P1-5", {"p1-privacy-sweep": _sweep(-10.0)})
    line = row["plain"]
    assert line.startswith("PrivBoN gave higher true reward than PrivITP at equal privacy (ε = 1, 10)")
    assert "significant" in line
    gap = float(re.search(r"by up to ([0-9.]+)", line).group(1))
    assert gap == pytest.approx(10.0, rel=0.1)  # the constructed gap, read from the numbers
    # a larger gap reads as a larger number: the sentence is filled from the measurement
    line2 = _claim("P1-5", {"p1-privacy-sweep": _sweep(-20.0)})["plain"]
    assert float(re.search(r"by up to ([0-9.]+)", line2).group(1)) == pytest.approx(20.0, rel=0.1)
    inc = _claim("P1-5", {"p1-privacy-sweep": _sweep(-1.0, noise=40.0)})["plain"]
    assert inc.startswith("Could not tell PrivITP and PrivBoN apart") and "underpowered" in inc


def test_monotone_reading_says_why_it_is_undecided():
    no_ctrl = _claim(
        "P1-2", {"p1-scaling": _curve("BoN", BON_RISES) + _curve("PrivBoN", [0, 10, 20, 25, 25, 25])}
    )
    assert "BoN did not over-optimise here either" in no_ctrl["plain"]
    too_small = _claim("P1-2", {"p1-scaling": CTRL[:3] + _curve("PrivBoN", [0, 10, 20, 25, 25, 25])[:3]})
    assert too_small["verdict"] == "inconclusive" and "N too small" in too_small["plain"]


def test_a_claim_decided_on_two_pools_reads_pool_by_pool():
    syn = _curve("BoN", BON_DEGRADES) + _curve("ITP", [0, 10, 20, 25, 25, 25], seed=1)
    real = _curve("BoN", BON_RISES, pool=REAL) + _curve("ITP", [0, 10, 20, 25, 25, 25], seed=1, pool=REAL)
    line = _claim("P1-1", {"p1-scaling": syn, "p1-scaling-imdb": real})["plain"]
    first, second = line.split(" Real pool imdb-smollm2: ")
    assert first.startswith("Synthetic pool: BoN over-optimised") and second.startswith("Could not tell")


def test_not_run_and_not_testable_say_so():
    rows = {c["id"]: c for c in R.evaluate_claims({})}
    assert rows["P1-5"]["plain"].startswith("Not run in this report (no run directory of p1-privacy-sweep")
    assert rows["P1-9"]["plain"].startswith("Not tested here: asymptotic statements")


def test_a_new_claim_plugs_in_with_its_own_reader_or_none(monkeypatch):
    """The mechanism is generic: a claim names a reader (``plain=``), or gets the claim restated with its
    verdict (and its rule's ``why``, when the rule returns facts)."""
    from privalign.experiments.verdicts import Outcome

    def rule(records, runs=None):
        x = records["p1-budget"][0]["served"]
        return Outcome("holds" if x > 10 else "inconclusive", f"x={x}", {"x": x, "why": "x too small"})

    mine = R.Claim(
        "X-1",
        "Beyond",
        "Things get better. [ours]",
        "p1-budget",
        "x > 10",
        rule,
        plain=lambda v, f: f"x was {num(f['x'])} ({v}).",
    )
    bare = R.Claim(
        "X-2",
        "Beyond",
        "Things get better. [ours]",
        "p1-budget",
        "x > 10",
        lambda rec, runs=None: ("does not hold", "m"),
    )
    nofacts = R.Claim("X-3", "Beyond", "Things get better. [ours]", "p1-budget", "x > 10", rule)
    monkeypatch.setattr(R, "CLAIMS", [mine, bare, nofacts])
    rows = {c["id"]: c for c in R.evaluate_claims({"p1-budget": [{"served": 12}]})}
    assert rows["X-1"]["plain"] == "x was 12 (holds)."
    assert rows["X-2"]["plain"] == "Contradicted by this run: Things get better."
    assert rows["X-3"]["plain"] == "Supported by this run: Things get better."
    rows = {c["id"]: c for c in R.evaluate_claims({"p1-budget": [{"served": 3}]})}
    assert rows["X-3"]["plain"] == "Could not tell whether things get better (x too small)."


def test_demo_terminal_table_shows_each_reading_in_full():
    from privalign.cli.demo import claims_table

    rows = [_claim(cid, *CASES[cid]["does not hold"]) for cid in ("P1-2", "P1-5", "P2-4")]
    rows.append(_claim("P1-4", *CASES["P1-4"]["holds"]))
    table = claims_table(rows, width=100)
    lines = table.splitlines()
    assert all(len(line) <= 100 for line in lines), lines
    assert "..." not in table
    flat = " ".join(x.strip() for x in lines)
    for r in rows:
        assert r["plain"] in flat  # wrapped, never cut
    # the rows that were identical truncated cells (P1-2/3/4) now differ
    assert len({r["plain"] for r in rows}) == len(rows)


def test_report_starts_with_the_key_findings_in_plain_words(tmp_path):
    """report.md and report.html put the plain-words section before the statistics (the browser test checks
    that it is visible on top)."""
    from privalign._json import write_json_atomic

    run = tmp_path / "p1-privacy-sweep"
    run.mkdir()
    write_json_atomic(
        run / "manifest.json", {"experiment": "p1-privacy-sweep", "status": "complete", "quick": True}
    )
    (run / "results.jsonl").write_text("\n".join(__import__("json").dumps(r) for r in _sweep(-10.0)) + "\n")
    write_json_atomic(run / "summary.json", {"title": "sweep"})
    html_path = R.write_report([run], tmp_path / "rep")
    page = html_path.read_text()
    md = (tmp_path / "rep" / "report.md").read_text()
    line = _claim("P1-5", {"p1-privacy-sweep": _sweep(-10.0)})["plain"]
    assert page.index("Key findings in plain words") < page.index("<h2>Claims</h2>")
    assert page.index(line.split(" (")[0]) < page.index("<h2>Claims</h2>")
    assert md.index("## Key findings in plain words") < md.index("## Claims") and line in md
    assert "quick configuration" in page


def test_p1_2_across_epsilon_reads_where_it_holds_and_where_not():
    """P1-2 decided at each ε of a privacy sweep reads which ε it holds at, not one blanket verdict."""
    from privalign.experiments.plain import monotone
    from privalign.experiments.verdicts import monotone_across_epsilon

    line = monotone(
        "does not hold",
        {"method": "PrivBoN", "across_epsilon": {"holds": [1.0, 2.0, 20.0], "does not hold": [50.0, 100.0]}},
    )
    expected = "Across the privacy sweep, PrivBoN resisted over-optimisation at ε = 1, 2, 20; "
    assert line == expected + "PrivBoN over-optimised at ε = 50, 100."
    out = monotone_across_epsilon([], "PrivBoN")
    assert out[0] == "inconclusive"


def test_p1_2_across_epsilon_reads_an_undecided_epsilon_in_plain_words():
    from privalign.experiments.plain import monotone

    line = monotone("inconclusive", {"method": "PrivBoN", "across_epsilon": {"inconclusive": [1.0, 2.0]}})
    assert line == "Across the privacy sweep, the data could not tell at ε = 1, 2."
