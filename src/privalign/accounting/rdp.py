"""RDP / PLD accountant: an adapter over Google's ``dp_accounting`` for Gaussian-family events.

The adapter does **not** hand privalign events to one ``dp_accounting`` accountant. It flattens each
event into *atoms* (one leaf mechanism at fixed parameters) with exact integer counts and keeps a
multiset ``atom → total count``. Guarantees are computed from that canonical multiset, so
``compose(e, k)``, ``compose(SelfComposedEvent(e, k))`` and ``k`` single composes give identical
results. This also side-steps two pitfalls of driving ``dp_accounting`` directly:

* an accountant there has *one* neighbouring relation, while privalign events carry their own; for an
  un-sampled Gaussian/Laplace event privalign's ``noise_multiplier`` is already relative to the
  sensitivity *under the event's relation*, so the atom is analysed as a plain shift by 1 noise
  multiplier (dp_accounting's ``ADD_OR_REMOVE_ONE`` form), whatever the relation; randomized response
  is analysed under ``REPLACE_ONE`` (the only relation under which a local randomizer of one bit is
  meaningful) and refused under ``add_remove_one``;
* some RDP accountants ignore ``count`` for exponential-mechanism events; here NoisyArgmax is handled by
  privalign itself (RDP curve min(α·ε²/8, ε) — bounded range, Cesar & Rogers 2021, arXiv 2004.07223).

Poisson sampling: for ``PoissonSampledEvent(q, GaussianEvent(nm))`` the inner ``noise_multiplier`` is
σ/C with C the bound on one record's contribution (the add/remove sensitivity, Opacus' and
dp_accounting's convention); the *outer* event's ``relation`` picks the analysis (``add_remove_one``:
both methods; ``replace_one``: PLD only — dp_accounting's RDP refuses it).

References:
  Mironov 2017, "Rényi Differential Privacy", arXiv 1702.07476v3 (Prop. 1 composition, Prop. 6 Laplace,
  Prop. 3 conversion); Mironov, Talwar & Zhang 2019, arXiv 1908.10530 (sampled Gaussian);
  Canonne, Kamath & Steinke 2020, arXiv 2004.00010 (Prop. 12 in v4: RDP → (ε, δ), used by
  ``dp_accounting.rdp.compute_epsilon``); Meiser & Mohammadi 2018 / Koskela et al. 2020 / Doroshenko et
  al. 2022 (PLD accounting as implemented by ``dp_accounting.pld``, pessimistic discretisation).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Literal

import numpy as np

from privalign._validation import check_choice, check_real
from privalign.accounting.accountant import Accountant
from privalign.accounting.events import (
    ApproxDPEvent,
    ExPostEvent,
    GaussianEvent,
    LaplaceEvent,
    NoisyArgmaxEvent,
    NonPrivateEvent,
    ParallelComposedEvent,
    PeelingEvent,
    PoissonSampledEvent,
    PrivacyEvent,
    PureDPEvent,
    RandomizedResponseEvent,
    ZCDPEvent,
    fold_event,
)
from privalign.errors import UnsupportedEventError

__all__ = ["RDPAccountant"]

Atom = tuple  # ("gaussian", nm) | ("laplace", nm) | ("rr", eps) | ("pure", eps) | ("br", eps) | ...


def _err(event: PrivacyEvent, path: str, method: str, hint: str = "") -> UnsupportedEventError:
    where = "" if path == "event" else f" at {path}"
    msg = (
        f"Cannot account {event!r}{where} in RDPAccountant(method={method!r}): unsupported event kind "
        f"{event.kind!r}."
    )
    return UnsupportedEventError(msg + (" " + hint if hint else ""))


# Per-process cache of RDP curves of leaf atoms, keyed by (orders, atom); curves are pure functions of both.
_RDP_CACHE: dict[tuple[bytes, Atom], np.ndarray] = {}
_RDP_CACHE_MAX = 4096


def _canon(counter: Counter) -> tuple:
    return tuple(sorted(counter.items(), key=repr))


class RDPAccountant(Accountant):
    """Rényi-DP (``method="rdp"``) or privacy-loss-distribution (``method="pld"``) accounting.

    Supported events: Gaussian, Laplace, RandomizedResponse (replace_one), NoisyArgmax, PureDP,
    ApproxDP/ExPost with δ = 0 (as pure ε / ε_max), Peeling (s pure rounds at 2/nm plus s Laplace
    coordinates at nm), ZCDP (RDP only), PoissonSampled of Gaussian (both methods; nested Composed /
    SelfComposed of Gaussians allowed) or of Laplace (PLD only), Composed, SelfComposed,
    ParallelComposed (RDP: order-wise max of the parts' curves; PLD: only when all parts are identical),
    NonPrivate (→ ∞).

    Pure ε-DP atoms use, for RDP, the curve min(α·ε²/2, ε) (Bun & Steinke 2016, Prop. 1.4 and the trivial
    bound D_α ≤ ε) and, for PLD, the PLD of binary randomized response with parameter ε, which dominates
    every ε-DP mechanism (Kairouz, Oh & Viswanath 2015, arXiv 1311.0776 — *theorem number unverified*).

    Args:
      method: ``"rdp"`` or ``"pld"``.
      orders: RDP orders (``method="rdp"``); default: dp_accounting's ``DEFAULT_RDP_ORDERS``.
      value_discretization_interval: PLD discretisation (``method="pld"``), default 1e-4.

    Raises:
      MissingDependencyError: ``dp_accounting`` is not installed.
    """

    currency = "RDP/PLD"

    def __init__(
        self,
        method: Literal["rdp", "pld"] = "rdp",
        *,
        orders: Any = None,
        value_discretization_interval: float = 1e-4,
    ) -> None:
        super().__init__()
        self.method = check_choice(method, "method", ("rdp", "pld"))
        self.value_discretization_interval = check_real(
            value_discretization_interval, "value_discretization_interval", low=0.0, closed="neither"
        )
        from privalign.errors import MissingDependencyError

        try:
            from dp_accounting.rdp import rdp_privacy_accountant as _rdp
        except ImportError as exc:  # pragma: no cover - dependency is mandatory in pyproject
            raise MissingDependencyError(
                "RDPAccountant needs dp-accounting: pip install dp-accounting"
            ) from exc
        if orders is None:
            orders = _rdp.DEFAULT_RDP_ORDERS
        arr = np.asarray(orders, dtype=np.float64)
        if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 1.0):
            from privalign.errors import PrivacyParameterError

            raise PrivacyParameterError(
                f"The 'orders' parameter must be a non-empty 1-D array of finite orders > 1. Got {orders!r} "
                "instead."
            )
        self._orders = arr
        self._atoms: Counter = Counter()
        self._cache: dict[str, Any] = {}

    # -- flattening -----------------------------------------------------------------------------------
    def _flatten(self, event: PrivacyEvent, path: str) -> Counter:
        """The event as a multiset of atoms (mechanism, parameters) → count."""
        return fold_event(
            event,
            self._atoms_of_leaf,
            zero=Counter(),
            add=lambda a, b: a + b,
            times=lambda k, c: Counter({a: v * k for a, v in c.items() if v * k}),
            worst=self._parallel,
            path=path,
        )

    def _atoms_of_leaf(self, event: PrivacyEvent, path: str) -> Counter:
        m = self.method
        if isinstance(event, NonPrivateEvent):
            return Counter({("nonprivate",): 1})
        if isinstance(event, GaussianEvent):
            return Counter({("gaussian", float(event.noise_multiplier)): 1})
        if isinstance(event, LaplaceEvent):
            return Counter({("laplace", float(event.noise_multiplier)): 1})
        if isinstance(event, RandomizedResponseEvent):
            if event.relation != "replace_one":
                raise _err(
                    event, path, m, "Randomized response is accounted under relation='replace_one' only."
                )
            return Counter({("rr", float(event.epsilon)): 1})
        if isinstance(event, NoisyArgmaxEvent):
            return Counter({("br", float(event.epsilon)): 1})
        if isinstance(event, PureDPEvent) or (isinstance(event, ApproxDPEvent) and event.delta == 0.0):
            return Counter({("pure", float(event.epsilon)): 1}) if event.epsilon > 0 else Counter()
        if isinstance(event, ExPostEvent) and event.delta == 0.0:
            return Counter({("pure", float(event.epsilon_max)): 1}) if event.epsilon_max > 0 else Counter()
        if isinstance(event, PeelingEvent):
            nm = float(event.noise_multiplier)
            s = int(event.sparsity)
            return Counter({("pure", 2.0 / nm): s, ("laplace", nm): s})
        if isinstance(event, ZCDPEvent):
            if m == "pld":
                raise _err(event, path, m, "A zCDP event has no privacy loss distribution; use method='rdp'.")
            return Counter({("zcdp", float(event.rho)): 1}) if event.rho > 0 else Counter()
        if isinstance(event, PoissonSampledEvent):
            return Counter({self._poisson_atom(event, path): 1})
        hint = ""
        if isinstance(event, ApproxDPEvent | ExPostEvent):
            hint = "Events with δ > 0 have no RDP/PLD curve; use ApproxDPAccountant."
        raise _err(event, path, m, hint)

    def _parallel(self, parts: list[Counter], event: ParallelComposedEvent, path: str) -> Counter:
        """Disjoint parts: identical parts cost one part; different ones their worst case (RDP only)."""
        parts = [p for p in parts if p]
        if not parts:
            return Counter()
        canon = sorted({_canon(p) for p in parts}, key=repr)
        if len(canon) == 1:
            return Counter(dict(canon[0]))
        if self.method == "pld":
            raise _err(
                event,
                path,
                self.method,
                "PLD accounting cannot take the worst case over different parallel parts; use method='rdp'.",
            )
        return Counter({("parallel", tuple(canon)): 1})

    def _poisson_atom(self, event: PoissonSampledEvent, path: str) -> Atom:
        m = self.method
        q = float(event.sampling_probability)
        inner = event.event
        rel = event.relation
        if isinstance(inner, LaplaceEvent):
            if m != "pld" or rel != "add_remove_one":
                raise _err(
                    event,
                    path,
                    m,
                    "Poisson-sampled Laplace is supported with method='pld' and relation='add_remove_one' "
                    "only.",
                )
            return ("poisson_laplace", q, float(inner.noise_multiplier))
        # Gaussian, possibly nested in Composed/SelfComposed: effective nm = (Σ k_i / nm_i²)^(-1/2).
        flat: Counter = Counter()
        try:
            flat = self._flatten(inner, f"{path}.event")
        except UnsupportedEventError:
            flat = Counter({("unsupported",): 1})
        if not flat or any(a[0] != "gaussian" for a in flat):
            raise _err(
                event,
                path,
                m,
                f"The sub-event at {path}.event must be a GaussianEvent (or Composed/SelfComposed of them); "
                f"got {inner!r}.",
            )
        inv = math.fsum(k / (a[1] ** 2) for a, k in flat.items())
        nm_eff = 1.0 / math.sqrt(inv)
        if m == "rdp" and rel != "add_remove_one":
            raise _err(
                event,
                path,
                m,
                "dp_accounting's RDP analysis of Poisson sampling needs relation='add_remove_one'; "
                "use method='pld' for replace_one.",
            )
        return ("poisson_gaussian", q, nm_eff, rel)

    # -- Accountant hooks ------------------------------------------------------------------------------
    def _increment(self, event: PrivacyEvent) -> Counter:
        return self._flatten(event, "event")

    def _commit(self, increment: Counter, count: int) -> None:
        if count == 0 or not increment:
            return
        for atom, k in increment.items():
            self._atoms[atom] += k * count
        self._cache.clear()

    @property
    def atoms(self) -> dict:
        """The canonical multiset ``atom → count`` the guarantees are computed from (a copy)."""
        return dict(self._atoms)

    # -- RDP -----------------------------------------------------------------------------------------------
    def _rdp_vector(self, atom: Atom) -> np.ndarray:
        key = (self._orders.tobytes(), atom)
        if key in _RDP_CACHE:
            return _RDP_CACHE[key]
        from dp_accounting import dp_event as dpe
        from dp_accounting.privacy_accountant import NeighboringRelation as NR
        from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

        a = self._orders
        kind = atom[0]
        if kind == "nonprivate":
            v = np.full_like(a, np.inf)
        elif kind == "gaussian":
            v = a / (2.0 * atom[1] ** 2)
        elif kind == "zcdp":
            v = atom[1] * a
        elif kind == "pure":
            e = atom[1]
            v = np.minimum(a * e * e / 2.0, e)
        elif kind == "br":
            e = atom[1]
            v = np.minimum(a * e * e / 8.0, e)
        elif kind == "laplace":
            v = RdpAccountant(list(a), NR.ADD_OR_REMOVE_ONE).compose(dpe.LaplaceDpEvent(atom[1])).rdp
        elif kind == "rr":
            p = 2.0 / (1.0 + math.exp(atom[1]))
            v = RdpAccountant(list(a), NR.REPLACE_ONE).compose(dpe.RandomizedResponseDpEvent(p, 2)).rdp
        elif kind == "poisson_gaussian":
            ev = dpe.PoissonSampledDpEvent(atom[1], dpe.GaussianDpEvent(atom[2]))
            v = RdpAccountant(list(a), NR.ADD_OR_REMOVE_ONE).compose(ev).rdp
        elif kind == "parallel":
            v = np.zeros_like(a)
            for part in atom[1]:
                pv = np.zeros_like(a)
                for sub, k in part:
                    pv = pv + k * self._rdp_vector(sub)
                v = np.maximum(v, pv)
        else:  # pragma: no cover - flatten never produces other atoms for rdp
            raise AssertionError(atom)
        v = np.asarray(v, dtype=np.float64)
        v.setflags(write=False)
        if len(_RDP_CACHE) < _RDP_CACHE_MAX:
            _RDP_CACHE[key] = v
        return v

    def get_rdp(self) -> np.ndarray:
        """The total RDP curve at :attr:`orders` (``method="rdp"`` only)."""
        if self.method != "rdp":
            raise UnsupportedEventError("get_rdp() is only available with method='rdp'.")
        if "rdp" not in self._cache:
            total = np.zeros_like(self._orders)
            for atom, k in sorted(self._atoms.items(), key=lambda kv: repr(kv[0])):
                total = total + k * self._rdp_vector(atom)
            # Round the float sums up by a relative 1e-12 (more than their accumulated rounding error).
            self._cache["rdp"] = total * (1.0 + 1e-12)
        return self._cache["rdp"]

    @property
    def orders(self) -> np.ndarray:
        return self._orders.copy()

    # -- PLD -----------------------------------------------------------------------------------------------
    def _pld(self):
        if "pld" in self._cache:
            return self._cache["pld"]
        from dp_accounting.pld import privacy_loss_distribution as pldm
        from dp_accounting.privacy_accountant import NeighboringRelation as NR

        vdi = self.value_discretization_interval
        out = None
        nonprivate = False
        for atom, k in sorted(self._atoms.items(), key=lambda kv: repr(kv[0])):
            kind = atom[0]
            if kind == "nonprivate":
                nonprivate = True
                continue
            if kind == "gaussian":
                p = pldm.from_gaussian_mechanism(atom[1] / math.sqrt(k), value_discretization_interval=vdi)
            elif kind == "laplace":
                p = pldm.from_laplace_mechanism(atom[1], value_discretization_interval=vdi).self_compose(k)
            elif kind in ("rr", "pure", "br"):
                noise = 2.0 / (1.0 + math.exp(atom[1]))
                p = pldm.from_randomized_response(
                    noise, 2, value_discretization_interval=vdi, neighboring_relation=NR.REPLACE_ONE
                ).self_compose(k)
            elif kind == "poisson_gaussian":
                rel = NR.ADD_OR_REMOVE_ONE if atom[3] == "add_remove_one" else NR.REPLACE_ONE
                p = pldm.from_gaussian_mechanism(
                    atom[2],
                    value_discretization_interval=vdi,
                    sampling_prob=atom[1],
                    neighboring_relation=rel,
                ).self_compose(k)
            elif kind == "poisson_laplace":
                p = pldm.from_laplace_mechanism(
                    atom[2], value_discretization_interval=vdi, sampling_prob=atom[1]
                ).self_compose(k)
            else:  # pragma: no cover
                raise AssertionError(atom)
            out = p if out is None else out.compose(p)
        self._cache["pld"] = (out, nonprivate)
        return self._cache["pld"]

    # -- getters -------------------------------------------------------------------------------------------
    def get_epsilon(self, delta: float = 0.0) -> float:
        """Smallest certified ε at ``delta`` (rounded up; ∞ at δ = 0 unless nothing was spent)."""
        delta = check_real(delta, "delta", low=0.0, high=1.0, closed="left")
        if not self._atoms:
            return 0.0
        if ("nonprivate",) in self._atoms:
            return math.inf
        if self.method == "rdp":
            from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

            eps = float(compute_epsilon(self._orders, self.get_rdp(), delta)[0])
        else:
            pld, _ = self._pld()
            if delta == 0.0:
                return math.inf
            eps = float(pld.get_epsilon_for_delta(delta))
        if math.isinf(eps):
            return eps
        return math.nextafter(max(eps, 0.0) * (1.0 + 1e-12), math.inf)

    def get_delta(self, epsilon: float) -> float:
        """Smallest certified δ at ``epsilon`` (rounded up)."""
        epsilon = check_real(epsilon, "epsilon", low=0.0, closed="left")
        if not self._atoms:
            return 0.0
        if ("nonprivate",) in self._atoms:
            return 1.0
        if self.method == "rdp":
            from dp_accounting.rdp.rdp_privacy_accountant import compute_delta

            d = float(compute_delta(self._orders, self.get_rdp(), epsilon)[0])
        else:
            pld, _ = self._pld()
            d = float(pld.get_delta_for_epsilon(epsilon))
        return min(1.0, max(d, 0.0) * (1.0 + 1e-12) + 1e-300)

    def __repr__(self) -> str:
        return f"RDPAccountant(method={self.method!r}, events={len(self._ledger)})"
