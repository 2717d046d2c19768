"""Private hyper-parameter tuning: candidates fitted on a training split, one chosen on a validation split.

The protocol (``docs/estimation.md``, "Tuning protocol"):

1. The data handed to :meth:`PrivateGridSearch.fit` (the *training* data of the experiment; the test
   split is never passed in) is split, data-independently, into a fitting part A and a validation part
   B (``validation_fraction`` of the pairs by row position, or of the prompts when ``groups`` is given;
   ``groups`` is refused for sample-level estimators, whose unit includes the prompt, because a split by
   private prompts is not data-independent: ``docs/privacy/release.md``).
2. Each of the K candidates of ``param_grid`` is fitted on A.
3. One candidate is selected by its validation preference accuracy on B, either with the exponential
   mechanism (``selection="exponential"``: Gumbel noisy argmax at sensitivity 1/|B|, ε_sel-DP with
   respect to the pairs of B) or, when the data passed in is *public* (``selection="public"``), by the
   plain argmax, in which case nothing about it is private and the result says so.
4. The selected candidate (fitted on A) is the result; ``refit=True`` refits it on A ∪ B.

Privacy accounting (``selection="exponential"``), under replace-one of one pair (or one label):
a pair in A influences the K candidate fits (sequential composition: Σ ε_k, Σ δ_k), while the selection
is post-processing of those fits and of B; a pair in B influences only the selection (ε_sel). A and B
are disjoint and chosen independently of the data, so by parallel composition the search is
``(max(Σ_k ε_k, ε_sel), Σ_k δ_k)``-DP; ``refit=True`` adds the refit's (ε, δ) by sequential composition.
With ``epsilon`` given, the budget is split so the total is exactly (``epsilon``, ``delta``): every
candidate runs at (ε/K, δ/K) and the selection at ε. Label-DP randomized-response estimators
(:class:`RRIHT`, :class:`DenseRR`) whose grid does not vary ε share one randomized-response draw (the
same seed), so all K candidates are post-processing of one ε-label-DP release and run at the full ε.

References:
  McSherry & Talwar, FOCS 2007, Thm. 6 (exponential mechanism); Dwork & Roth 2014, Thm. 3.16 (basic
  composition), Prop. 2.1 (post-processing); McSherry, SIGMOD 2009, Thm. 4 (parallel composition);
  Liu & Talwar, "Private Selection from Private Candidates", STOC 2019, arXiv:1811.07971 (why selecting
  among private candidates must pay for all of them unless a random-stopping scheme is used).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from privalign._validation import check_choice, check_probability, check_real
from privalign.accounting.events import (
    ComposedEvent,
    NonPrivateEvent,
    ParallelComposedEvent,
    PrivacyEvent,
)
from privalign.errors import PrivacyParameterError
from privalign.estimation.base import RewardEstimator, check_Xy
from privalign.rng import as_generator

__all__ = [
    "PrivateGridSearch",
    "tune",
    "expand_grid",
    "split_validation",
    "validation_groups",
    "default_param_grid",
    "experiment_param_grid",
    "make_experiment_estimator",
    "EXPERIMENT_CANDIDATES",
]


def expand_grid(param_grid: Any, estimator: Any = None) -> list[dict[str, Any]]:
    """The candidate list of a grid: a dict ``name → non-empty list`` (Cartesian product) or a non-empty
    list of such dicts (their union, as scikit-learn's ``ParameterGrid``).

    Raises:
      PrivacyParameterError: an empty grid, an empty value list, or (given ``estimator``) an unknown name.
    """
    grids = [param_grid] if isinstance(param_grid, dict) else param_grid
    if not isinstance(grids, list | tuple) or len(grids) == 0:
        raise PrivacyParameterError(
            f"The 'param_grid' parameter must be a non-empty dict of parameter lists (or a non-empty list of "
            f"such dicts). Got {param_grid!r} instead."
        )
    valid = set(estimator.get_params()) if estimator is not None else None
    out: list[dict[str, Any]] = []
    for g in grids:
        if not isinstance(g, dict) or len(g) == 0:
            raise PrivacyParameterError(
                f"The 'param_grid' parameter must contain non-empty dicts of parameter lists. Got {g!r} "
                "instead."
            )
        for k, v in g.items():
            if isinstance(v, str) or not hasattr(v, "__len__") or len(v) == 0:
                raise PrivacyParameterError(
                    f"The 'param_grid' parameter must map each name to a non-empty list of values. "
                    f"Got {k!r}: {v!r} instead."
                )
            if valid is not None and k not in valid:
                raise PrivacyParameterError(
                    f"The 'param_grid' parameter names {k!r}, which is not a parameter of "
                    f"{type(estimator).__name__} (valid: {sorted(valid)})."
                )
        keys = sorted(g)
        out.extend(dict(zip(keys, vals)) for vals in itertools.product(*(list(g[k]) for k in keys)))
    return out


def split_validation(
    n: int, validation_fraction: float, rng: np.random.Generator, groups: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """Data-independent split of ``n`` rows into (fit, validation) index arrays.

    With ``groups`` (e.g. prompt ids) whole groups go to one side; otherwise single rows. Both sides are
    non-empty.

    Raises:
      PrivacyParameterError: ``validation_fraction`` outside (0, 1), or too few rows/groups for two sides.
    """
    frac = check_real(validation_fraction, "validation_fraction", low=0.0, high=1.0, closed="neither")
    if groups is None:
        inverse = np.arange(n)
        n_units = n
    else:
        g = np.asarray(groups)
        if g.shape != (n,):
            raise PrivacyParameterError(
                f"The 'groups' parameter must have shape ({n},). Got {g.shape} instead."
            )
        _, inverse = np.unique(g.astype(str) if g.dtype == object else g, return_inverse=True)
        n_units = int(inverse.max()) + 1
    if n_units < 2:
        raise PrivacyParameterError(
            f"The 'X' parameter must hold at least two {'groups' if groups is not None else 'pairs'} to "
            f"split off a validation part. Got {n_units}."
        )
    n_val = min(max(1, int(round(frac * n_units))), n_units - 1)
    perm = rng.permutation(n_units)
    is_val = np.zeros(n_units, dtype=bool)
    is_val[perm[:n_val]] = True
    mask = is_val[inverse]
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def _min_pairs(est: Any) -> tuple[int, str] | None:
    """The fewest training pairs a candidate needs (its batch count), with the parameter that sets it."""
    params = est.get_params()
    if params.get("variant") == "disjoint" and params.get("n_iter") is not None:
        return int(params["n_iter"]), f"n_iter={params['n_iter']} (one disjoint batch per iteration)"
    if params.get("batch_size") is not None and "clip_norm" in params:
        return int(params["batch_size"]), f"batch_size={params['batch_size']}"
    return None


def validation_groups(estimator: Any, prompt_ids: Any) -> Any:
    """The ``groups`` a search over ``estimator`` may split by: the prompt ids when prompts are public to
    its privacy unit (label-level estimators), ``None`` (split by row position) for sample-level ones."""
    base = getattr(estimator, "estimator", estimator)  # a PrivateGridSearch: its base estimator
    return prompt_ids if _privacy_unit(base) == "label" else None


def _privacy_unit(est: Any) -> str:
    from privalign.estimation.baselines import DenseRR
    from privalign.estimation.iht import RRIHT

    return "label" if isinstance(est, RRIHT | DenseRR) else "sample"


def _is_private(params: dict[str, Any]) -> bool:
    eps = params.get("epsilon")
    return eps is not None and not (isinstance(eps, float | int) and math.isinf(float(eps)))


class PrivateGridSearch(RewardEstimator):
    """Choose hyper-parameters of a reward estimator on a validation split, with the choice accounted.

    Args:
      estimator: a reward estimator (its parameters are the defaults of every candidate).
      param_grid: dict ``name → non-empty list`` or a non-empty list of such dicts.
      validation_fraction: share of the pairs (of the groups, with ``groups``) held out for selection,
        in (0, 1).
      selection: ``"exponential"`` (default; ε_sel-DP exponential mechanism on validation accuracy, the
        cost composed into ``privacy_event_``) or ``"public"`` (plain argmax; only for data that is
        public: then ``privacy_event_`` is ``NonPrivateEvent`` and ``tuning_privacy_`` says so).
      epsilon: total ε of the search (``None``: candidates keep their own ε and the total is reported).
        Candidates then run at ε/K (or ε for a shared randomized-response draw) and the selection at ε.
      delta: total δ (used with ``epsilon`` for sample-DP estimators: each candidate gets δ/K).
      selection_epsilon: ε_sel of the exponential mechanism when ``epsilon`` is ``None`` (default 1).
      refit: refit the selected parameters on all the data passed in (costs one more fit).
      random_state: seed of the split, the candidates' seeds and the selection noise.

    Attributes:
      best_params_, best_index_, best_estimator_, candidates_ (list of dicts with params and
      ``validation_accuracy``), n_fit_, n_validation_, coef_, privacy_event_, privacy_budget_
      (``{"epsilon", "delta", "composition"}``: the total guarantee by basic + parallel composition of the
      candidates' targets), tuning_privacy_ (``"accounted"`` or ``"public data: not private"``).

    Raises:
      PrivacyParameterError: empty grid or value list, unknown parameter, ``validation_fraction`` outside
        (0, 1), a split that leaves fewer fitting pairs than a candidate's batches (``n_iter`` disjoint
        batches, DP-SGD ``batch_size``), invalid ε/δ, or ``selection`` not in the list.

    Privacy:
      Unit: the estimator's (``"sample"``: one comparison; ``"label"``: one label, features public).
      Relation: replace-one. Sensitivity of the selection score (validation accuracy, ties ½): 1/|B|.
      Guarantee: see the module docstring: ``(max(Σ_k ε_k, ε_sel), Σ_k δ_k)``-DP (plus the refit).
      Event: ``ParallelComposedEvent([ComposedEvent(candidate events), NoisyArgmaxEvent(ε_sel)])``,
      wrapped in ``ComposedEvent([..., refit event])`` with ``refit=True``.
    """

    def __init__(
        self,
        estimator: Any = None,
        param_grid: Any = None,
        *,
        validation_fraction: float = 0.2,
        selection: str = "exponential",
        epsilon: float | None = None,
        delta: float = 1e-5,
        selection_epsilon: float = 1.0,
        refit: bool = False,
        random_state: Any = None,
    ) -> None:
        self.estimator = estimator
        self.param_grid = param_grid
        self.validation_fraction = validation_fraction
        self.selection = selection
        self.epsilon = epsilon
        self.delta = delta
        self.selection_epsilon = selection_epsilon
        self.refit = refit
        self.random_state = random_state

    def fit(self, X: Any, y: Any, groups: Any = None) -> PrivateGridSearch:
        """Run the protocol on ``(X, y)`` (the training data only); ``groups`` keeps groups on one side
        (label-level estimators, or ``selection="public"``, only: groups must be public)."""
        from privalign.mechanisms.selection import NoisyArgmax

        if self.estimator is None or not hasattr(self.estimator, "get_params"):
            raise PrivacyParameterError(
                f"The 'estimator' parameter must be a reward estimator. Got {self.estimator!r} instead."
            )
        base = self.estimator
        cands = expand_grid(self.param_grid, base)
        selection = check_choice(self.selection, "selection", ("exponential", "public"))
        frac = check_real(
            self.validation_fraction, "validation_fraction", low=0.0, high=1.0, closed="neither"
        )
        total_eps = (
            None if self.epsilon is None else check_real(self.epsilon, "epsilon", low=0.0, closed="neither")
        )
        total_delta = check_probability(self.delta, "delta")
        sel_eps = (
            total_eps
            if total_eps is not None
            else check_real(
                self.selection_epsilon, "selection_epsilon", low=0.0, closed="neither", allow_inf=True
            )
        )
        if total_eps is not None and any("epsilon" in c or "delta" in c for c in cands):
            raise PrivacyParameterError(
                f"The 'param_grid' parameter must not vary epsilon/delta when the total 'epsilon' "
                f"({total_eps!r}) is given: the search splits it over the candidates itself."
            )
        n = X.shape[0] if getattr(X, "shape", None) else len(X)
        Xv, yv = check_Xy(X, y, check_values=False)
        rng = as_generator(self.random_state)
        unit = _privacy_unit(base)
        if groups is not None and unit == "sample" and selection == "exponential":
            raise PrivacyParameterError(
                "The 'groups' parameter must be None for a sample-level estimator "
                f"({type(base).__name__}): the unit (one comparison) includes its prompt, so a split by "
                "prompt groups depends on the private data (replacing one record's prompt moves other "
                "records across the split) and the parallel composition of fitting and selection no "
                "longer holds. "
                "Split by row position (groups=None), or declare the data public with selection='public'."
            )
        fit_idx, val_idx = split_validation(n, frac, rng, groups)
        K = len(cands)
        shared_rr = unit == "label" and not any("epsilon" in c or "random_state" in c for c in cands)
        rr_seed = int(rng.integers(2**63 - 1))
        built = []
        for c in cands:
            est = _clone(base).set_params(**c)
            params = est.get_params()
            if total_eps is not None and "epsilon" in params:
                est.set_params(epsilon=total_eps if shared_rr else total_eps / K)
                if "delta" in params:
                    est.set_params(delta=total_delta / K)
            if "random_state" in params and "random_state" not in c:
                est.set_params(random_state=rr_seed if shared_rr else int(rng.integers(2**63 - 1)))
            need = _min_pairs(est)
            if need is not None and fit_idx.shape[0] < need[0]:
                raise PrivacyParameterError(
                    f"The 'validation_fraction' parameter ({frac!r}) leaves {fit_idx.shape[0]} fitting "
                    f"pairs, fewer than the candidate's {need[1]}: lower validation_fraction or the batch "
                    "count."
                )
            built.append(est)
        XA, yA, XB, yB = Xv[fit_idx], yv[fit_idx], Xv[val_idx], yv[val_idx]
        scores = []
        for est in built:
            est.fit(XA, yA)
            scores.append(float(est.score(XB, yB)))
        n_val = int(val_idx.shape[0])
        if selection == "exponential":
            mech = NoisyArgmax(sel_eps, 1.0 / n_val, unit=unit, relation="replace_one")
            best = int(mech(np.asarray(scores), rng=rng))
            sel_event = mech.event
        else:
            best = int(np.argmax(scores))
            sel_event = NonPrivateEvent(unit=unit, relation="replace_one")
        cand_events = [e.privacy_event_ for e in built]
        private = selection == "exponential" and all(_is_private(e.get_params()) for e in built)
        if shared_rr:
            a_event = cand_events[0]
            a_eps, a_delta = float(built[0].epsilon), 0.0
        else:
            a_event = ComposedEvent(events=tuple(cand_events), unit=unit, relation="replace_one")
            a_eps = sum(float(e.get_params().get("epsilon", math.inf)) for e in built)
            a_delta = sum(float(e.get_params().get("delta", 0.0)) if unit == "sample" else 0.0 for e in built)
        event: PrivacyEvent = ParallelComposedEvent(
            events=(a_event, sel_event), unit=unit, relation="replace_one"
        )
        eps_total = max(a_eps, float(sel_eps)) if private else math.inf
        delta_total = a_delta
        chosen = built[best]
        if self.refit:
            chosen = _clone(chosen).set_params(
                **(
                    {"random_state": int(rng.integers(2**63 - 1))}
                    if "random_state" in chosen.get_params()
                    else {}
                )
            )
            chosen.fit(Xv, yv)
            event = ComposedEvent(events=(event, chosen.privacy_event_), unit=unit, relation="replace_one")
            if private:
                eps_total += float(chosen.get_params()["epsilon"])
                delta_total += float(chosen.get_params().get("delta", 0.0)) if unit == "sample" else 0.0
        if selection == "public":
            event = NonPrivateEvent(unit=unit, relation="replace_one")
        self.candidates_ = [{"params": c, "validation_accuracy": s} for c, s in zip(cands, scores)]
        self.best_index_ = best
        self.best_params_ = dict(cands[best])
        self.best_estimator_ = chosen
        self.n_fit_ = int(fit_idx.shape[0])
        self.n_validation_ = n_val
        self.shared_label_noise_ = bool(shared_rr)
        self.tuning_privacy_ = "accounted" if selection == "exponential" else "public data: not private"
        self.privacy_budget_ = {
            "epsilon": eps_total,
            "delta": delta_total,
            "composition": (
                "parallel over (fit part, validation part) of basic composition of the candidates; "
                "exponential-mechanism selection"
            )
            + ("; plus the refit" if self.refit else ""),
        }
        self.privacy_event_ = event
        self.coef_ = chosen.coef_
        self.n_features_in_ = int(Xv.shape[1])
        return self


def _clone(est: Any) -> Any:
    """A fresh, unfitted copy with the same parameters (scikit-learn's ``clone`` when available)."""
    return type(est)(**est.get_params(deep=False))


def tune(
    estimator: Any, param_grid: Any, X: Any, y: Any, *, groups: Any = None, **kwargs: Any
) -> PrivateGridSearch:
    """Fit a :class:`PrivateGridSearch` (keyword arguments as its constructor) and return it."""
    return PrivateGridSearch(estimator, param_grid, **kwargs).fit(X, y, groups=groups)


def default_param_grid(method: str, *, sparsity: int = 32) -> dict[str, list[Any]]:
    """The grid ``fit-reward --tune`` searches for a method name of
    :data:`privalign.estimation.rates.METHODS`."""
    s = [max(1, sparsity // 4), sparsity, sparsity * 4]
    grids: dict[str, dict[str, list[Any]]] = {
        "mle": {"alpha": [1e-4, 1e-3, 1e-2]},
        "iht": {"sparsity": s, "step_size": [2.0, 4.0, 8.0]},
        "dp-iht": {"sparsity": s, "step_size": [2.0, 4.0, 8.0]},
        "rr-iht": {"sparsity": s, "step_size": [2.0, 4.0, 8.0]},
        "rr": {"alpha": [1e-4, 1e-3, 1e-2, 1e-1]},
        "dp-sgd": {"clip_norm": [1.0, 4.0], "learning_rate": [0.5, 2.0], "epochs": [5.0, 10.0]},
    }
    if method not in grids:
        raise PrivacyParameterError(
            f"The 'method' parameter must be one of {sorted(grids)}. Got {method!r} instead."
        )
    return grids[method]


#: Candidates per method in the experiments' ``tune = true`` mode: the same for every method, so every
#: compared pair splits its budget alike (a sample-DP candidate runs at (ε/K, δ/K)).
EXPERIMENT_CANDIDATES = 2


def experiment_param_grid(estimator_name: str, *, sparsity: int = 64) -> dict[str, list[Any]]:
    """The grid of the experiments' ``tune = true`` mode, by estimator class name: **every method gets
    :data:`EXPERIMENT_CANDIDATES` (2) candidates**, so the search splits every method's budget the same way
    (sample-DP candidates at (ε/2, δ/2); label-DP candidates share one randomized-response draw at ε) and the
    selection costs the same ε on the validation part. With 4 DP-SGD candidates at ε/4 against 2
    Sample-DP IHT candidates at ε/2, a single-seed "sparse wins" at ε = 4 was an artefact of the protocol.

    Sample-DP IHT searches only small s, ``{s/16, s/4}``: Peeling's noise multiplier grows like √s, its
    selection threshold like √s·log d, and the privacy error like s² (spec-reward-estimation §5), so at the n
    of the real-data experiments (≈ 1,500 fitting pairs) a candidate with s ≥ 64 cannot select signal
    coordinates (``iht.peeling_snr`` gives the numbers). DP-SGD searches its learning rate at the
    configured clip norm (with every per-example gradient clipped, C and η only scale each other). The
    grids are fixed in advance from public quantities (s, ε, δ, d); nothing in them depends on the data.
    """
    grids: dict[str, dict[str, list[Any]]] = {
        "IHT": {"sparsity": [sparsity, sparsity * 4]},
        "MLE": {"alpha": [1e-3, 1e-1]},
        "SampleDPIHT": {"sparsity": [max(1, sparsity // 16), max(2, sparsity // 4)]},
        "RRIHT": {"sparsity": [sparsity, sparsity * 4]},
        "DenseRR": {"alpha": [1e-3, 1e-1]},
        "DPSGDLinear": {"learning_rate": [0.5, 2.0]},
    }
    if estimator_name not in grids:
        raise PrivacyParameterError(
            f"The 'estimator_name' parameter must be one of {sorted(grids)}. Got {estimator_name!r} instead."
        )
    return grids[estimator_name]


def make_experiment_estimator(
    name: str,
    *,
    epsilon: float,
    delta: float,
    sparsity: int,
    feature_bound: float,
    random_state,
    cfg: dict,
    n_train: int,
):
    """The estimator ``name`` (any spelling) with an experiment's hyper-parameters
    (:func:`privalign.estimation.registry.experiment_estimator` on the validated config ``cfg``; DP-SGD's
    expected batch is capped at the training-set size n, a public quantity).

    With ``cfg["tune"]`` true the estimator is wrapped in :class:`PrivateGridSearch` over
    :func:`experiment_param_grid`: a validation split of the training pairs and an exponential-mechanism
    selection, the whole search costing the cell's (ε, δ) (candidates are fitted on ≈ 80% of the pairs, so
    DP-SGD's batch is capped at 3/4 of n).
    """
    from privalign.estimation.registry import experiment_estimator, privacy_kind

    tuned = bool(cfg.get("tune", False))
    est = experiment_estimator(
        name,
        cfg,
        n_train=max(1, (3 * n_train) // 4) if tuned else n_train,
        epsilon=epsilon,
        delta=delta,
        sparsity=sparsity,
        feature_bound=feature_bound,
        clip=True,
        random_state=random_state,
    )
    if not tuned:
        return est
    private = privacy_kind(name) != "none" and math.isfinite(epsilon)
    return PrivateGridSearch(
        est,
        experiment_param_grid(name, sparsity=sparsity),
        epsilon=epsilon if private else None,
        delta=delta,
        selection_epsilon=1.0 if private else math.inf,
        random_state=random_state,
    )
