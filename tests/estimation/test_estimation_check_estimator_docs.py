"""docs/estimation.md says exactly which scikit-learn ``check_estimator`` checks the IHT estimators fail at
their default parameters, and why (it said "four", which holds only with ``sparsity=1, clip=True``)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
from sklearn.utils.estimator_checks import check_estimator

from privalign.estimation import IHT, RRIHT, SampleDPIHT

DOC = Path(__file__).resolve().parents[2] / "docs" / "estimation.md"
#: The four checks every estimator fails by design (labels other than the preference bit).
LABEL_CHECKS = {
    "check_estimators_dtypes",
    "check_classifier_data_not_an_array",
    "check_classifiers_classes",
    "check_fit2d_1feature",
}


def _failed(est):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = check_estimator(est, on_fail=None)
    return res, [r for r in res if r["status"] == "failed"]


def _messages(exc: BaseException) -> str:
    out = []
    while exc is not None:
        out.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return " ".join(out)


@pytest.mark.parametrize("cls", [SampleDPIHT, IHT, RRIHT], ids=lambda c: c.__name__)
def test_the_docs_state_the_default_failures_and_their_one_cause(cls):
    doc = " ".join(DOC.read_text(encoding="utf-8").split())
    res, failed = _failed(cls())
    names = {r["check_name"] for r in failed}
    assert f"fail {len(failed)} of {len(res)}" in doc  # the count the docs state (sklearn's current checks)
    # every failure beyond the label checks is the one refusal the docs give as the cause: s > d
    for r in failed:
        if r["check_name"] not in LABEL_CHECKS:
            assert re.search(
                r"'sparsity' parameter must be at most the number of features", _messages(r["exception"])
            )
    assert LABEL_CHECKS <= names
    for name in names - LABEL_CHECKS:
        assert f"`{name}`" in doc, name  # each one listed by name
