"""Sessions under a budget: reserve → settle, refusal before any score is read, no overshoot."""

import math

import numpy as np
import pytest

from privalign.accounting.filters import ExPostFilter, PureDPFilter
from privalign.alignment import PrivBoN, PrivITP
from privalign.alignment.session import privbon_zcdp_comparison, run_session
from privalign.alignment.synthetic import make_synthetic_pool
from privalign.errors import PrivacyParameterError


class CountingSelector:
    """Wraps a selector and counts how often scores were handed to it."""

    def __init__(self, inner):
        self.inner, self.calls, self.name = inner, 0, inner.name

    def worst_case_event(self, n):
        return self.inner.worst_case_event(n)

    def select(self, *a, **k):
        self.calls += 1
        return self.inner.select(*a, **k)


def test_privitp_session_respects_budget_and_beats_basic_composition(rng):
    pool = make_synthetic_pool(300, 40, random_state=1)
    sel = CountingSelector(PrivITP(0.05, sigma_x=2.0, sigma_z=2.0))
    f = ExPostFilter(100.0, 1e-2)
    rep = run_session(pool, sel, f, "u", rng, n=16)
    assert sel.calls == rep.prompts_served  # refused prompts never reached the selector
    assert rep.prompts_served + rep.prompts_refused == 300 and rep.prompts_refused > 0
    assert rep.realized_epsilon <= 100.0 and f.spent("u")["epsilon"] <= 100.0
    assert rep.spent["outstanding_epsilon"] == 0.0
    assert rep.basic_composition_count == math.floor(100.0 / sel.inner.epsilon_max(16))
    assert rep.prompts_served >= rep.basic_composition_count  # realized ≤ worst case per prompt
    # the next reservation would not fit: the filter refused with less than ε_max left
    assert f.remaining("u")["epsilon"] < rep.epsilon_max
    assert all(r["epsilon_realized"] <= rep.epsilon_max for r in rep.per_prompt)


def test_fallback_is_charged_n_ell1(rng):
    pool = make_synthetic_pool(30, 40, random_state=2)
    pool.proxy[:] = 0.0  # nothing is ever above threshold → frequent fallbacks
    m = PrivITP(0.05, sigma_x=2.0, sigma_z=0.05)
    rep = run_session(pool, m, ExPostFilter(1e6, 0.5), "u", rng, n=8)
    fb = [r for r in rep.per_prompt if r["fallback"]]
    assert fb
    for r in fb:
        expect = m.accountant.epsilon1 + float(m.accountant.epsilon2(-1, 8, r["lambda_tilde"]))
        assert r["epsilon_realized"] == pytest.approx(min(expect, m.epsilon_max(8)), rel=1e-12)


def test_privbon_pure_and_zcdp_reported():
    pool = make_synthetic_pool(400, 16, random_state=3)
    out = privbon_zcdp_comparison(pool, PrivBoN(0.5), budget_epsilon=10.0, delta=1e-6, n=16, rng=0)
    assert out["pure"]["prompts_served"] == 20  # 10 / 0.5
    assert out["zcdp"]["prompts_served"] > out["pure"]["prompts_served"]
    assert out["zcdp"]["epsilon_at_delta"] <= 10.0 + 1e-9
    assert out["zcdp"]["spent"]["rho"] <= out["zcdp"]["rho_budget"]


def test_short_pool_refused_before_reserving(rng):
    pool = make_synthetic_pool(3, 20, random_state=0)
    f = PureDPFilter(10.0)
    with pytest.raises(PrivacyParameterError, match="fewer than 33"):
        run_session(pool, PrivITP(0.05, sigma_x=1, sigma_z=1), f, "u", rng, n=16)
    assert f.spent("u")["epsilon"] == 0.0


def test_crash_after_reserve_stays_charged(rng):
    pool = make_synthetic_pool(5, 20, random_state=0)
    pool.proxy[0, :] = 2.0  # out of the public range → the selector raises after the reservation
    f = PureDPFilter(10.0)
    with pytest.raises(PrivacyParameterError):
        run_session(pool, PrivBoN(1.0), f, "u", rng, n=8)
    assert f.spent("u")["epsilon"] == pytest.approx(1.0)  # fail closed
    assert np.isfinite(f.remaining("u")["epsilon"])


@pytest.mark.parametrize(
    "method,options,params",
    [
        ("privitp", ["--budget-epsilon", "60", "--shuffle-seed", "3"], {}),
        ("privbon", ["--budget-epsilon", "3", "--epsilon", "2"], {"epsilon": 2.0}),
        ("privitp", ["--budget-epsilon", "0.5"], {}),  # nothing fits: the note says so
    ],
)
def test_run_pool_session_writes_what_the_cli_writes(tmp_path, capsys, method, options, params):
    """``privalign session`` is the library's :func:`run_pool_session` plus printing: the same session.json,
    the same --json summary and the same notes."""
    import json

    from _util import write_scored_pool
    from privalign._json import to_jsonable
    from privalign.alignment.selectors import SelectorSpec
    from privalign.alignment.session import PoolSessionOptions, run_pool_session
    from privalign.cli import main

    pool = write_scored_pool(tmp_path / "pool.jsonl", prompts=4, candidates=24)
    argv = ["session", "--pool", str(pool), "--method", method, "--out", str(tmp_path / "cli"), "--json"]
    assert main([*argv, "--no-progress", *options]) == 0
    cap = capsys.readouterr()
    kw = dict(zip([o[2:].replace("-", "_") for o in options[::2]], options[1::2]))
    defaults = {"privitp": {"beta": 0.05, "L": 3.0, "delta": 1e-6}, "privbon": {"epsilon": 1.0}}[method]
    spec = SelectorSpec.of(method, **{**defaults, **params})
    opts = PoolSessionOptions(
        pool=str(pool),
        budget_epsilon=float(kw["budget_epsilon"]),
        shuffle_seed=int(kw["shuffle_seed"]) if "shuffle_seed" in kw else None,
        progress=False,
    )
    notes: list[str] = []
    session = run_pool_session(opts, spec, note=notes.append)
    session.write(tmp_path / "lib")
    assert (tmp_path / "lib" / "session.json").read_text() == (tmp_path / "cli" / "session.json").read_text()
    assert json.loads(cap.out) == to_jsonable(session.summary())
    said = [ln.removeprefix("privalign session: note: ") for ln in cap.err.splitlines() if ln.strip()]
    assert said == notes + session.notes()
    if kw["budget_epsilon"] == "0.5":
        assert session.notes() and session.notes()[0].startswith("no prompt was served:"), session.notes()
    assert session.options.r_max == 1.0  # the default range [0, 1]
    assert session.options.n == (11 if method == "privitp" else 16)  # the largest n ≤ 16 that fits 24
