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

**User level** (``max_pairs_per_user=K`` and ``fit(X, y, users=...)``; issue 39): the unit is one user (all of
their ≤ K pairs, or their labels for the label-DP estimators). The split is by user (the roster of user ids
is public at this unit), so every user falls wholly in A or in B; each candidate is fitted at user level on A
(label-DP: each label at ε/K, :func:`privalign.estimation.users.user_level_label_fit`; sample-DP: the
estimator's own user-level fit, ``fit(X, y, users=...)``), and the validation score is the *per-user*
accuracy averaged over B's users (each user's accuracy on their own pairs, ties ½), whose sensitivity to
replacing one user is 1/|B_users| whatever the number of pairs each user holds (a mean over B's pairs would
move by up to K/|B| and divide by a private count). The accounting below then holds with "one user" for "one
pair"; ``n_fit_`` and ``n_validation_`` count users.

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
from collections.abc import Sequence
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
from privalign.estimation.base import Matrix, RewardEstimator, check_Xy
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
    "per_user_accuracy",
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
      max_pairs_per_user: K ≥ 1 for **user-level** tuning (``fit(X, y, users=...)``; module docstring): split
        by user, candidates fitted at user level, the validation score averaged per user. A sample-DP base
        estimator must carry the same ``max_pairs_per_user``. ``None`` (default): record level.
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
        max_pairs_per_user: int | None = None,
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
        self.max_pairs_per_user = max_pairs_per_user
        self.random_state = random_state

    def fit(
        self, X: Any, y: Any, groups: Any = None, users: Sequence[object] | np.ndarray | None = None
    ) -> PrivateGridSearch:
        """Run the protocol on ``(X, y)`` (the training data only); ``groups`` keeps groups on one side
        (label-level estimators, or ``selection="public"``, only: groups must be public); ``users`` (each
        row's user, with ``max_pairs_per_user``) makes the search user-level."""
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
        route = unit  # how a candidate protects its unit: "label" (RR) or "sample"
        codes = self._user_codes(base, users, n, groups)
        if codes is not None:
            unit, groups = "user", codes
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
        shared_rr = route == "label" and not any("epsilon" in c or "random_state" in c for c in cands)
        n_fit_units = int(fit_idx.shape[0]) if codes is None else len(np.unique(codes[fit_idx]))
        built = self._build(cands, base, total_eps, total_delta, shared_rr, rng, (frac, n_fit_units, codes))
        # each candidate's (ε, δ) before fitting (a user-level label fit rewrites its ε to ε/K per label)
        costs = [_cost(est, route) for est in built]
        scores = [self._fit_and_score(est, Xv, yv, (fit_idx, val_idx), codes, route) for est in built]
        n_val = int(val_idx.shape[0]) if codes is None else len(np.unique(codes[val_idx]))
        if selection == "exponential":
            mech = NoisyArgmax(sel_eps, 1.0 / n_val, unit=unit, relation="replace_one")
            best = int(mech(np.asarray(scores), rng=rng))
            sel_event = mech.event
        else:
            best = int(np.argmax(scores))
            sel_event = NonPrivateEvent(unit=unit, relation="replace_one")
        cand_events = [e.privacy_event_ for e in built]
        private = selection == "exponential" and all(math.isfinite(c[0]) for c in costs)
        if shared_rr:
            a_event: PrivacyEvent = cand_events[0]
            a_eps, a_delta = costs[0][0], 0.0
        else:
            a_event = ComposedEvent(events=tuple(cand_events), unit=unit, relation="replace_one")
            a_eps, a_delta = sum(c[0] for c in costs), sum(c[1] for c in costs)
        event: PrivacyEvent = ParallelComposedEvent(
            events=(a_event, sel_event), unit=unit, relation="replace_one"
        )
        eps_total = max(a_eps, float(sel_eps)) if private else math.inf
        delta_total = a_delta
        chosen = built[best]
        if self.refit:
            again: dict[str, float | int] = {}
            if "random_state" in chosen.get_params():
                again["random_state"] = int(rng.integers(2**63 - 1))
            if codes is not None and route == "label":  # its fit rewrote ε to ε/K per label: the user's again
                again["epsilon"] = costs[best][0]
            chosen = _clone(built[best]).set_params(**again)
            refit_cost = _cost(chosen, route)
            everything = np.arange(Xv.shape[0])
            self._fit_and_score(chosen, Xv, yv, (everything, None), codes, route)
            event = ComposedEvent(events=(event, chosen.privacy_event_), unit=unit, relation="replace_one")
            if private:
                eps_total += refit_cost[0]
                delta_total += refit_cost[1]
        if selection == "public":
            event = NonPrivateEvent(unit=unit, relation="replace_one")
        self.candidates_ = [{"params": c, "validation_accuracy": s} for c, s in zip(cands, scores)]
        self.best_index_ = best
        self.best_params_ = dict(cands[best])
        self.best_estimator_ = chosen
        self.n_fit_ = n_fit_units
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

    def _build(
        self,
        cands: list[dict[str, object]],
        base: RewardEstimator,
        total_eps: float | None,
        total_delta: float,
        shared_rr: bool,
        rng: np.random.Generator,
        split: tuple[float, int, np.ndarray | None],
    ) -> list[RewardEstimator]:
        """The unfitted candidates, at (ε/K, δ/K) each (or ε for a shared randomized-response draw) when the
        total ε is given; refuses a split leaving fewer fitting pairs (users) than a candidate's batches."""
        frac, n_fit_units, codes = split
        K = len(cands)
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
            if need is not None and n_fit_units < need[0]:
                what = "pairs" if codes is None else "users"
                raise PrivacyParameterError(
                    f"The 'validation_fraction' parameter ({frac!r}) leaves {n_fit_units} fitting "
                    f"{what}, fewer than the candidate's {need[1]}: lower validation_fraction or the batch "
                    "count."
                )
            built.append(est)
        return built

    def _fit_and_score(
        self,
        est: RewardEstimator,
        X: Matrix,
        y: np.ndarray,
        split: tuple[np.ndarray, np.ndarray | None],
        codes: np.ndarray | None,
        route: str,
    ) -> float:
        """Fit ``est`` on the rows ``split[0]`` and return its validation score on ``split[1]`` (``nan``
        without one): the preference accuracy, or at user level the per-user accuracy averaged over the
        validation users (:func:`per_user_accuracy`)."""
        fit_idx, val_idx = split
        if codes is None:
            est.fit(X[fit_idx], y[fit_idx])
            return math.nan if val_idx is None else float(est.score(X[val_idx], y[val_idx]))
        if route == "label":  # each label at ε/K: the candidate's ε is the user's
            from privalign.estimation.users import user_level_label_fit

            k = int(self.max_pairs_per_user or 1)
            user_level_label_fit(est, X[fit_idx], y[fit_idx], epsilon=float(est.epsilon), max_per_user=k)
        else:
            est.fit(X[fit_idx], y[fit_idx], users=codes[fit_idx])
        if val_idx is None:
            return math.nan
        return per_user_accuracy(est.predict_reward(X[val_idx]), y[val_idx], codes[val_idx])

    def _user_codes(
        self, base: RewardEstimator, users: Sequence[object] | np.ndarray | None, n: int, groups: object
    ) -> np.ndarray | None:
        """Each row's user index at user level (``max_pairs_per_user`` set), ``None`` at record level; refuses
        ``users`` without the bound (or the reverse), ``groups`` with ``users``, a user above K rows and a
        sample-DP base estimator not bounded to the same K."""
        from privalign.estimation.users import user_groups

        k = self.max_pairs_per_user
        if k is None:
            if users is not None:
                raise PrivacyParameterError(
                    "The 'users' parameter is used only with 'max_pairs_per_user' (user-level tuning). Got "
                    f"{type(users).__name__} without it."
                )
            return None
        if groups is not None:
            raise PrivacyParameterError(
                "The 'groups' parameter must be None at user level: the split is by user. Got groups."
            )
        codes, _ = user_groups(users, n, k)
        if _privacy_unit(base) == "sample" and base.get_params().get("max_pairs_per_user") != k:
            raise PrivacyParameterError(
                f"The 'estimator' parameter must be a user-level estimator with max_pairs_per_user={k} (the "
                f"search's K). Got {type(base).__name__} with "
                f"{base.get_params().get('max_pairs_per_user')!r}."
            )
        return codes


def per_user_accuracy(rewards: np.ndarray, y: np.ndarray, users: np.ndarray) -> float:
    """The validation score at user level: each user's preference accuracy on their own pairs (ties ½),
    averaged over the users. Replacing all of one user's pairs (1..K of them) moves it by at most 1/U.

    >>> r, y = np.array([1.0, -1.0, 2.0, 0.0]), np.array([1.0, 1.0, 1.0, 0.0])
    >>> per_user_accuracy(r, y, np.array([0, 0, 1, 1]))  # user 0: ½, user 1: (1 + ½)/2
    0.625
    """
    r = np.asarray(rewards, dtype=np.float64)
    pred = np.where(r > 0, 1.0, np.where(r < 0, 0.0, 0.5))
    agree = np.where(pred == 0.5, 0.5, (pred == np.asarray(y, dtype=np.float64)).astype(np.float64))
    _, inverse = np.unique(np.asarray(users), return_inverse=True)
    sums = np.bincount(inverse.reshape(-1), weights=agree)
    counts = np.bincount(inverse.reshape(-1))
    return float(np.mean(sums / counts))


def _cost(est: RewardEstimator, route: str) -> tuple[float, float]:
    """A candidate's (ε, δ) as configured (before its fit): per record, or per user at user level."""
    params = est.get_params()
    eps = params.get("epsilon")
    eps_f = math.inf if not _is_private(params) else float(eps)
    return eps_f, float(params.get("delta", 0.0)) if route == "sample" else 0.0


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
