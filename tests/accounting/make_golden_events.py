"""Writes ``tests/golden/events.json`` once: one event of every kind (nested ones included).

Run ``python tests/accounting/make_golden_events.py`` only when a *new* kind is added; the meaning of an
existing kind or field never changes (events.py compatibility contract), so existing entries must not be
rewritten. ``test_accounting_golden.py`` compares the current serialisation with the pinned file.
"""

from __future__ import annotations

import json
from pathlib import Path

from privalign.accounting.events import (
    ApproxDPEvent,
    ComposedEvent,
    ExPostEvent,
    GaussianEvent,
    LaplaceEvent,
    NoisyArgmaxEvent,
    NonPrivateEvent,
    ParallelComposedEvent,
    PeelingEvent,
    PoissonSampledEvent,
    PureDPEvent,
    RandomizedResponseEvent,
    SelfComposedEvent,
    ZCDPEvent,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "events.json"


def golden_events() -> list:
    return [
        NonPrivateEvent(),
        PureDPEvent(epsilon=0.5),
        ApproxDPEvent(epsilon=1.25, delta=1e-6, unit="user"),
        ZCDPEvent(rho=0.125),
        ExPostEvent(epsilon_realized=0.25, epsilon_max=2.0, delta=1e-7, details={"stopping_time": 3}),
        NoisyArgmaxEvent(epsilon=1.0),
        GaussianEvent(noise_multiplier=1.5),
        LaplaceEvent(noise_multiplier=4.0),
        RandomizedResponseEvent(epsilon=2.0, unit="label"),
        PeelingEvent(
            sparsity=16, noise_multiplier=30.5, target_epsilon=1.0, target_delta=1e-5, unit="sample"
        ),
        PoissonSampledEvent(
            sampling_probability=0.01, event=GaussianEvent(noise_multiplier=1.1), relation="add_remove_one"
        ),
        ComposedEvent(events=[NoisyArgmaxEvent(epsilon=0.1), LaplaceEvent(noise_multiplier=2.0)]),
        SelfComposedEvent(event=NoisyArgmaxEvent(epsilon=0.1), count=100),
        ParallelComposedEvent(
            events=[
                PeelingEvent(sparsity=4, noise_multiplier=10.0),
                PeelingEvent(sparsity=4, noise_multiplier=12.0),
            ],
            unit="sample",
        ),
    ]


def main() -> None:
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps([e.to_dict() for e in golden_events()], indent=2, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
