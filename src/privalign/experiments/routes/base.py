"""What a route of the ``beyond-frontier`` experiment is: :class:`Route` (its family, methods, privacy kind
per method, seeds key and the configuration keys that change its records), its two shapes —
:class:`PolicyRoute` (fits a policy and hands the frontier each checkpoint to evaluate) and
:class:`SelectorRoute` (fits a reward model and hands the frontier a selection law over the reference
samples) — and :class:`Bench`, the services the frontier lends a route (the private pairs, the reference
samples, the base policy, seeds, record reuse). The frontier evaluates (gold, KL) and decides the verdict; a
route fits.

A route module imports this module and lower layers only, never the frontier (the frontier passes a
:class:`Bench` in), so the import graph has no cycle and a new route is one module plus its tests.

Privacy:
  This module fits nothing. Each route class states its guarantee, privacy unit and neighbouring relation in
  its docstring and in the ``guarantee`` its records carry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import numpy as np

__all__ = ["KIND_UNITS", "Bench", "PolicyRoute", "Route", "Selection", "SelectorRoute"]

#: The privacy kinds a route method may have, and how a record and a legend say them.
KIND_UNITS = {
    "non-private": "non-private",
    "label-DP": "ε-label-DP (unit: one pair's label; texts public)",
    "sample-DP": "(ε, δ)-DP (unit: one pair)",
    "per-answer": "ε-DP PER ANSWER (unit: one pair; k answers cost kε)",
}


class Bench(Protocol):
    """What the frontier lends a route for one (route, seed) cell. ``cell`` holds ``route``, ``family``,
    ``method``, ``epsilon`` and ``seed_index``; ``cfg`` the run's configuration; ``cache`` the run's cache
    (shared between cells: fitted reward models live there)."""

    cell: dict[str, Any]
    cfg: dict[str, Any]
    cache: dict[str, Any]
    run_dir: Any

    def pairs(self) -> dict[str, Any]:
        """The private pairs (``pairs``: prompts, chosen, rejected, prompt_ids), the prompt slices (``eval``,
        ``grpo``, ``*_info``), the pairs file ``path`` and the public ``data_identity``."""
        ...

    def reference(self) -> dict[str, Any]:
        """The base policy's reference samples of the eval prompts: ``texts`` (P × m), ``gold`` (P × m)."""
        ...

    def base(self) -> tuple[Any, Any, str]:
        """The base policy: (model, tokenizer, model id)."""
        ...

    def seed(self, key: str, k: int | None = None) -> np.random.SeedSequence:
        """The seed of ``key`` (a route or a reward model) and seed index ``k`` (the cell's if None), from the
        root seed and the name only."""
        ...

    def pending(self, what: str) -> None:
        """Raise the frontier's *pending* signal under ``records_only`` (where a cell would fit or train)."""
        ...

    def records_dir(self) -> Any:
        """The cell's record directory."""
        ...

    def progress(self, total: int) -> Callable[[int], None]:
        """A per-step progress printer with an ETA."""
        ...


class Route:
    """One family of private alignment routes (``FAMILY:METHOD[@EPS]``).

    Class attributes (declared by each route class):
      family: the ``FAMILY`` of the spec.
      methods: ``{method: privacy kind}`` with kinds in :data:`KIND_UNITS`; a non-private method takes no ε.
      order: place in the run order (cheap first).
      line: the figure's line style.
      trained: whether the route trains a policy (its points are checkpoints) or selects at inference.
      seeds_key: the configuration key of its number of seeds.
      keys: the configuration keys (beyond the frontier's common ones) that change its records' identities.
      fields: configuration keys the route adds to the experiment's schema (``{name: Field}``).
      rm_methods: methods that fit a reward model which later cells may reuse (the frontier keeps those
        fits cached).
    """

    family: ClassVar[str] = ""
    methods: ClassVar[dict[str, str]] = {}
    order: ClassVar[int] = 5
    line: ClassVar[str] = "-"
    trained: ClassVar[bool] = True
    seeds_key: ClassVar[str] = ""
    keys: ClassVar[tuple[str, ...]] = ()
    fields: ClassVar[dict[str, Any]] = {}
    rm_methods: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def label(cls, method: str) -> str:
        """A short name for a person (``"label-DP DPO"``)."""
        return f"{method} {cls.family}"

    @classmethod
    def kind(cls, method: str) -> str:
        return cls.methods[method]

    @classmethod
    def backbone(cls, method: str) -> str | None:
        """The pretrained text encoder the method's reward model (or policy) scores with; ``None``: none
        that a labeller or judge could share (:mod:`privalign.experiments.routes.labellers`). Default:
        ``None``."""
        return None

    @classmethod
    def check(cls, cell: dict[str, Any], cfg: dict[str, Any]) -> str | None:
        """A configuration problem of this route (``None`` if none): the frontier's preflight raises it."""
        return None

    @classmethod
    def reuses_rm(cls, cell: dict[str, Any]) -> str | None:
        """The cache key of the reward-model fit this cell uses (``None`` if none)."""
        return None


class PolicyRoute(Route):
    """A route that trains a policy. The frontier computes the checkpoints' record identities, reuses the
    records that exist, and otherwise calls :meth:`train` with ``on_step(t, policy)``, its evaluator (which
    must leave the policy unchanged and draw no randomness of the route's)."""

    trained = True

    def steps(self, bench: Bench) -> list[int]:
        """The checkpoint steps evaluated (public: a function of the configuration and n)."""
        raise NotImplementedError

    def train(self, bench: Bench, on_step: Callable[[int, Any], None]) -> dict[str, Any]:
        """Fit from the private pairs at the cell's ε, calling ``on_step`` after every step; returns the
        privacy record's payload (public facts only: the privacy event and the guarantee)."""
        raise NotImplementedError

    def privacy_without_training(self, bench: Bench) -> dict[str, Any] | None:
        """The privacy record's payload where every checkpoint has a record but the privacy record does not
        (``None``: leave it absent). Default: ``None``."""
        return None

    def privacy_first(self) -> bool:
        """Whether the privacy record is written before training (GRPO: the reward model is fitted first)."""
        return False

    def guarantee(
        self, bench: Bench, payload: dict[str, Any] | None
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """``(privacy event, facts)`` of the record's guarantee, from the privacy record's payload (None if
        absent); the facts are added to (or override) the frontier's statement."""
        raise NotImplementedError


class Selection(Protocol):
    """A selection law over each eval prompt's reference samples, for each x of the route's curve."""

    def expected(self, values: np.ndarray, x: int) -> np.ndarray:
        """Per prompt, the expected value of ``values`` (P × m) under the law at ``x``."""
        ...

    def kl(self, x: int) -> float:
        """KL(law at x ‖ uniform over the m reference samples), averaged over prompts [nats]."""
        ...


class SelectorRoute(Route):
    """A route that selects among the reference samples at inference (best-of-n, PrivBoN). The frontier
    computes the expected gold and the KL of the law :meth:`selection` returns, at every ``x`` of
    :meth:`xs`."""

    trained = False

    def xs(self, bench: Bench) -> list[int]:
        return [int(n) for n in bench.cfg["bon_ns"]]

    def selection(self, bench: Bench) -> Selection:
        raise NotImplementedError

    def guarantee(self, bench: Bench) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """``(privacy event, extra facts)`` of the record's guarantee."""
        raise NotImplementedError
