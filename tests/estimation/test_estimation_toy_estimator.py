"""Adding an estimator touches one module: a toy class declared and registered here (nothing else edited) is
accepted by ``fit-reward`` (both spellings; saved and loaded back), by the rates scans and by the p2-rates
experiment through its configuration, whose records, summary and figure carry it (issue 38 item 1)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from privalign.accounting.events import NonPrivateEvent
from privalign.estimation import registry
from privalign.estimation.base import EstimatorParam, RewardEstimator, check_Xy


class ToyRidge(RewardEstimator):
    """Non-private ridge regression of the ±1 labels on the features (a toy reference method).

    Privacy: none (``NonPrivateEvent``): every label and feature enters the coefficients exactly.
    """

    name = "ToyRidge"
    aliases = ("toy",)
    privacy_kind = "none"
    title = "toy ridge"
    params = (EstimatorParam("alpha", "toy_alpha", "float", 1.0, "toy ridge α", low=0.0),)

    def __init__(self, *, alpha: float = 1.0, feature_bound: float | None = None, clip: bool = False) -> None:
        self.alpha = alpha
        self.feature_bound = feature_bound
        self.clip = clip

    def fit(self, X: Any, y: Any) -> ToyRidge:
        X, y = check_Xy(X, y, feature_bound=self.feature_bound, clip=self.clip)
        X = X.toarray() if hasattr(X, "toarray") else np.asarray(X, dtype=np.float64)
        d = X.shape[1]
        self.coef_ = np.linalg.solve(X.T @ X + self.alpha * np.eye(d), X.T @ (2.0 * y - 1.0))
        self.privacy_event_ = NonPrivateEvent(unit="sample", relation="replace_one")
        return self


@pytest.fixture
def toy():
    registry.register(ToyRidge)
    yield ToyRidge
    registry.unregister("ToyRidge")


def _pairs_file(path, n=120):
    rng = np.random.default_rng(0)
    words = ["good", "great", "fine", "bad", "awful", "poor", "okay", "nice"]
    rows = []
    for i in range(n):
        good = " ".join(rng.choice(words[:3], 4))
        bad = " ".join(rng.choice(words[3:6], 4))
        rows.append(json.dumps({"prompt": f"p{i}", "chosen": good, "rejected": bad}))
    path.write_text("\n".join(rows))
    return path


def test_the_registry_knows_the_toy_by_both_spellings(toy):
    assert registry.estimator_class("toy") is toy and registry.canonical("toy") == "ToyRidge"
    assert "ToyRidge" in registry.names(kind="none") and "toy_alpha" in registry.experiment_params()
    assert registry.make_estimator("toy", epsilon=1.0, alpha=2.0).alpha == 2.0
    registry.unregister("ToyRidge")
    with pytest.raises(Exception, match="'method' parameter must be one of"):
        registry.make_estimator("toy")


@pytest.mark.parametrize("spelling", ["toy", "ToyRidge"])
def test_fit_reward_fits_saves_and_loads_the_toy(toy, tmp_path, capsys, spelling):
    from privalign.cli import main
    from privalign.estimation.persistence import load_model

    model = tmp_path / "m.json"
    argv = ["fit-reward", "--data", str(_pairs_file(tmp_path / "p.jsonl")), "--method", spelling]
    rc = main([*argv, "--n-features", "256", "--out", str(model), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["privacy_unit"] == "none" and out["privacy_event"]["kind"] == "non_private"
    est, _, _ = load_model(model)
    assert type(est) is toy
    # an option the toy does not read is refused, not ignored (asked of the class, not of its name)
    assert main([*argv, "--epsilon", "2"]) == 2
    assert "--epsilon: not used by --method" in capsys.readouterr().err


def test_rates_scan_and_p2_rates_config_carry_the_toy(toy, tmp_path):
    from privalign.cli import main
    from privalign.estimation.rates import run_rates

    grid = {
        "base": {"n": 300, "d": 10, "s_star": 2, "epsilon": 4.0},
        "n": [150, 300],
        "d": [10],
        "s_star": [2],
        "epsilon": [4.0],
        "reps": 1,
        "d_scan_n": 150,
    }
    res = run_rates(tmp_path / "r", methods=("toy", "iht"), entropy=1, grid=grid, progress=False)
    assert {r["method"] for r in res["rows"]} == {"toy", "iht"}
    assert {r["unit"] for r in res["rows"] if r["method"] == "toy"} == {"none"}

    cfg = tmp_path / "p2.toml"
    cfg.write_text(
        'methods = ["IHT", "ToyRidge"]\ntoy_alpha = 0.5\nbase_n = 200\nbase_d = 20\nbase_s = 2\n'
        "n_grid = [100, 200]\nd_grid = [10, 20]\ns_grid = [2]\neps_grid = [4.0]\nreplicates = 2\n"
    )
    out = tmp_path / "p2"
    assert main(["reproduce", "p2-rates", "--config", str(cfg), "--out", str(out), "--no-progress"]) == 0
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    toy_recs = [r for r in recs if r.get("method") == "ToyRidge"]
    assert toy_recs and all(r["unit"] == "non-private" for r in toy_recs)
    table = json.loads((out / "summary.json").read_text())["table"]
    assert {(r["sweep"], r["method"]) for r in table} >= {("n", "ToyRidge"), ("d", "ToyRidge")}
    man = json.loads((out / "manifest.json").read_text())
    assert man["config"]["toy_alpha"] == 0.5 and man["figures"]
