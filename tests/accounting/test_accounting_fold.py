"""``fold_event``: the one walk over composed events that every accountant's cost uses."""

from fractions import Fraction

import pytest

from privalign.accounting.accountant import approx_cost, pure_cost, zcdp_cost
from privalign.accounting.events import (
    ComposedEvent,
    GaussianEvent,
    LaplaceEvent,
    ParallelComposedEvent,
    PureDPEvent,
    SelfComposedEvent,
    fold_event,
)
from privalign.errors import UnsupportedEventError


def _count_leaves(event):
    seen = []

    def leaf(e, path):
        seen.append(path)
        return 1

    total = fold_event(
        event,
        leaf,
        zero=0,
        add=lambda a, b: a + b,
        times=lambda k, c: k * c,
        worst=lambda p, *_: max(p, default=0),
    )
    return total, seen


def test_rules_and_paths():
    a, b = PureDPEvent(epsilon=1.0), PureDPEvent(epsilon=2.0)
    ev = ComposedEvent(
        events=(
            a,
            SelfComposedEvent(event=b, count=3),
            ParallelComposedEvent(events=(a, ComposedEvent(events=(a, b)))),
        )
    )
    total, seen = _count_leaves(ev)
    assert total == 1 + 3 + 2  # sum, count ×, max over the parallel parts
    assert seen == [
        "event.events[0]",
        "event.events[1].event",
        "event.events[2].events[0]",
        "event.events[2].events[1].events[0]",
        "event.events[2].events[1].events[1]",
    ]


def test_empty_composites_cost_zero():
    assert _count_leaves(ComposedEvent(events=()))[0] == 0
    assert _count_leaves(ParallelComposedEvent(events=()))[0] == 0
    assert _count_leaves(SelfComposedEvent(event=PureDPEvent(epsilon=1.0), count=0))[0] == 0


def test_costs_through_the_fold():
    lap = LaplaceEvent(noise_multiplier=2.0)
    ev = ComposedEvent(
        events=(SelfComposedEvent(event=lap, count=4), ParallelComposedEvent(events=(lap, lap)))
    )
    assert pure_cost(ev) == Fraction(5, 2)
    assert zcdp_cost(ev) == 5 * Fraction(1, 8)
    assert approx_cost(ev) == (Fraction(5, 2), 0)


def test_unsupported_leaf_is_named_by_its_path():
    ev = ComposedEvent(
        events=(
            PureDPEvent(epsilon=1.0),
            SelfComposedEvent(event=GaussianEvent(noise_multiplier=1.0), count=2),
        )
    )
    with pytest.raises(UnsupportedEventError, match=r"at event\.events\[1\]\.event"):
        pure_cost(ev)
