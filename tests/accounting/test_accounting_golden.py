"""Serialisation: every event kind round-trips, and the format is pinned by ``tests/golden/events.json``."""

from __future__ import annotations

import json

import pytest
from make_golden_events import GOLDEN, golden_events

from privalign.accounting.events import _REGISTRY, PrivacyEvent, event_from_dict
from privalign.errors import PrivacyParameterError


def test_golden_covers_every_kind():
    kinds = {d["kind"] for d in json.loads(GOLDEN.read_text())}
    assert kinds == set(_REGISTRY)


def test_golden_file_matches_current_serialisation():
    pinned = json.loads(GOLDEN.read_text())
    assert [e.to_dict() for e in golden_events()] == pinned


@pytest.mark.parametrize("i", range(len(golden_events())))
def test_round_trip(i):
    data = json.loads(GOLDEN.read_text())[i]
    event = event_from_dict(data)
    assert event == golden_events()[i]
    assert event.to_dict() == data
    assert PrivacyEvent.from_dict(json.loads(json.dumps(event.to_dict()))) == event


def test_from_dict_rejects_bad_input():
    with pytest.raises(PrivacyParameterError, match="'kind'"):
        event_from_dict({"epsilon": 1.0})
    with pytest.raises(PrivacyParameterError, match="'bogus'"):
        event_from_dict({"kind": "bogus"})
    with pytest.raises(PrivacyParameterError, match=r"'epsilon'.*-1"):
        event_from_dict({"kind": "pure_dp", "epsilon": -1.0})
