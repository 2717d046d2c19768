"""Adding a selection method touches one module: a toy selector class, registered here, runs through
``privalign simulate``, ``privalign select`` and ``/v1/select`` with no other module edited.

The toy is ``RankOfN``: it serves the candidate with the ``rank``-th lowest score (non-private, one pool),
its one parameter given as ``--param rank=...`` on the command line. Everything the front ends need (the
name, whether it is private, its parameters, its candidate layout, its exact law for the simulation engine)
is declared on the class.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from test_service_http import _cfg

from conftest import serve_in_thread
from privalign.accounting.events import NonPrivateEvent
from privalign.alignment.base import BatchSelection, MethodBase, Param, Selection, SelectionLaw
from privalign.alignment.selectors import methods, register, unregister
from privalign.cli import main


class RankOfN(MethodBase):
    """Toy: the candidate with the ``rank``-th lowest score (0 = the lowest). Not private."""

    name = "rankofn"
    label = "RankOfN"
    params = (Param("rank", "which lowest score to serve (0 = the lowest)", default=0.0),)

    def __init__(self, rank: float = 0.0) -> None:
        self.rank = int(rank)

    @classmethod
    def from_params(cls, params, *, r_max=1.0, sensitivity=None, clip=False) -> RankOfN:
        return cls(params.get("rank", 0.0))

    def worst_case_event(self, n=None) -> NonPrivateEvent:
        return NonPrivateEvent()

    def _index(self, r: np.ndarray) -> int:
        return int(np.argsort(r, kind="stable")[min(self.rank, r.size - 1)])

    def select(self, scores, *, rng=None, pool_b_scores=None) -> Selection:
        r = np.asarray(scores, dtype=np.float64)
        return Selection(self._index(r), NonPrivateEvent(), NonPrivateEvent(), {"n": r.size})

    def select_batch(self, scores, *, rng=None, pool_b_scores=None) -> BatchSelection:
        r = np.atleast_2d(np.asarray(scores, dtype=np.float64))
        ev = NonPrivateEvent()
        return BatchSelection(np.array([self._index(x) for x in r]), [ev] * r.shape[0], ev, {})

    def law(self, scores, *, pool_b_scores=None) -> SelectionLaw:
        r = np.asarray(scores, dtype=np.float64)
        p = np.zeros(r.size)
        p[self._index(r)] = 1.0
        return SelectionLaw(p)


@pytest.fixture
def toy():
    register(RankOfN)
    try:
        yield RankOfN
    finally:
        unregister(RankOfN.name)
    assert RankOfN.name not in methods()


def test_select_cli_runs_the_toy(toy, capsys):
    assert (
        main(["select", "--method", "rankofn", "--scores", "0.3,0.1,0.9,0.5", "--seed", "0", "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["index"] == 1  # the lowest
    assert main(["select", "--method", "rankofn", "--scores", "0.3,0.1,0.9,0.5", "--param", "rank=2"]) == 0
    assert "candidate 3" in capsys.readouterr().out  # the third lowest: 0.5
    # its options are checked like any method's: one it does not read is refused
    assert main(["select", "--method", "rankofn", "--scores", "0.3,0.1", "--epsilon", "1"]) == 2
    assert "argument --epsilon: not used by --method rankofn" in capsys.readouterr().err


def test_simulate_cli_runs_the_toy_through_its_exact_law(toy, tmp_path, capsys):
    argv = ["simulate", "--synthetic", "4,32", "--methods", "bon,rankofn", "--param", "rank=0,1"]
    argv += ["--replicates", "3", "--out", str(tmp_path / "o"), "--no-progress", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    names = [m["name"] for m in summary["methods"]]
    assert names == ["BoN", "RankOfN rank=0", "RankOfN rank=1"]
    lift = {m["name"]: m["true_lift_at_max_n"] for m in summary["methods"]}
    # serving the lowest proxy score does worse than the base policy, best-of-N better
    assert lift["RankOfN rank=0"] < 0 < lift["BoN"]
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert res["methods"][1]["spec"]["params"] == {"rank": 0.0}
    assert res["methods"][1]["privacy"] == {"guarantee": "none", "epsilon": "inf"}


def test_v1_select_serves_the_toy(toy, tmp_path, reward_model):
    from privalign.service.app import create_app
    from privalign.service.keys import create_key

    cfg = _cfg(tmp_path, reward_model, allowed_methods=["privbon", "rankofn"], allow_non_private=True)
    app = create_app(cfg)
    _, token = create_key(app.state.service.engine, budget_epsilon=5.0, budget_delta=1e-3)
    h = {"Authorization": f"Bearer {token}"}
    cands = ["a fine answer", "an awful answer", "a good answer"]
    with serve_in_thread(app) as url:
        r = httpx.post(
            url + "/v1/select",
            headers=h,
            json={"prompt": "p", "candidates": cands, "privacy": {"method": "rankofn"}},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["privacy"]["method"] == "rankofn" and body["privacy"]["private"] is False
        assert 0 <= body["index"] < len(cands) and body["text"] == cands[body["index"]]
        # a parameter the toy does not take is refused, naming it
        r = httpx.post(
            url + "/v1/select",
            headers=h,
            json={"prompt": "p", "candidates": cands, "privacy": {"method": "rankofn", "beta": 0.1}},
        )
        assert r.status_code == 400 and "privacy.beta" in r.text
        budget = httpx.get(url + "/v1/budget", headers=h).json()
    assert budget["spent"]["epsilon"] == 0.0  # not private: nothing reserved or charged
