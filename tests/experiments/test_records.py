"""Experiments select their result records by a method's registered name; the label compared is the one
the selector class owns."""

import pytest

from privalign.alignment.base import MethodBase
from privalign.alignment.selectors import label, register, unregister
from privalign.errors import PrivacyParameterError
from privalign.experiments.records import is_method, of_method

RECS = [
    {"method": "BoN", "N": 4},
    {"method": "PrivITP", "N": 4, "privacy_match": "worst"},
    {"method": "PrivITP", "N": 8, "privacy_match": "sigma"},
    {"method": "PrivBoN", "N": 4, "service": "PrivBoN"},
    {"method": "PrivITP-fixed", "N": 4},
]


def test_label_is_the_class_attribute():
    from privalign.alignment.priv_itp import PrivITP

    assert label("privitp") == PrivITP.label == "PrivITP"
    assert [label(m) for m in ("bon", "itp", "privbon")] == ["BoN", "ITP", "PrivBoN"]


def test_of_method_filters_by_label_and_fields():
    assert of_method(RECS, "privitp") == RECS[1:3]
    assert of_method(RECS, "privitp", privacy_match="sigma", N=8) == [RECS[2]]
    assert of_method(RECS, "privitp", privacy_match="expected") == []
    assert of_method(RECS, "privbon", key="service") == [RECS[3]]
    assert of_method(RECS, "itp") == []


def test_is_method_takes_several_methods():
    assert [is_method(r, "bon", "itp") for r in RECS] == [True, False, False, False, False]
    assert is_method(RECS[3], "privbon", key="service")
    assert not is_method({"N": 1}, "bon")


def test_a_registered_method_is_selected_by_its_own_label():
    class Toy(MethodBase):
        name = "toy-records"
        label = "Toy"

    register(Toy)
    try:
        assert of_method([{"method": "Toy"}, {"method": "toy-records"}], "toy-records") == [{"method": "Toy"}]
    finally:
        unregister("toy-records")


def test_an_unknown_method_is_refused():
    with pytest.raises(PrivacyParameterError, match="'method' parameter"):
        of_method(RECS, "nope")
