"""``privalign audit`` end to end, in-process."""

from __future__ import annotations

import json

import pytest

from privalign.cli import main


def _run(capsys, *argv):
    rc = main(["audit", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.statistical
def test_cli_audit_prints_json_with_claim_bound_alpha_and_verdict(capsys):
    rc, out, _ = _run(
        capsys, "--mechanism", "randomized_response", "--epsilon", "1.0", "--seed", "3", "--json"
    )
    assert rc == 0
    rep = json.loads(out)
    assert rep["mechanism"] == "randomized_response" and rep["pair"] == "bit 0 vs bit 1"
    assert rep["claimed_epsilon"] == 1.0 and rep["alpha"] == 1e-3 and rep["samples"] == [10_000, 10_000]
    # False-positive probability of "violation" ≤ α = 1e-3.
    assert 0.0 <= rep["epsilon_lower_bound"] <= 1.0 and rep["verdict"] == "consistent"


@pytest.mark.statistical
def test_cli_audit_catches_a_broken_variant_and_can_fail(capsys):
    rc, out, _ = _run(
        capsys,
        "--mechanism",
        "noisy_argmax",
        "--epsilon",
        "1",
        "--seed",
        "5",
        "--broken",
        "sensitivity_ignored",
        "--json",
        "--fail-on-violation",
    )
    rep = json.loads(out)
    assert rep["verdict"] == "violation" and rep["epsilon_lower_bound"] > 1.0 and rc == 1
    assert rep["broken"] == "sensitivity_ignored" and "(1,0,…,0) vs (0,1,…,1)" in rep["pair"]


def test_cli_audit_gaussian_needs_delta_and_reports_it(capsys):
    rc, _, err = _run(capsys, "--mechanism", "gaussian", "--epsilon", "1")
    assert rc == 2 and "'--delta'" in err  # the flag, not the Python parameter
    rc, out, _ = _run(
        capsys,
        "--mechanism",
        "gaussian",
        "--epsilon",
        "1",
        "--delta",
        "0.01",
        "--samples",
        "2000",
        "--seed",
        "1",
        "--json",
    )
    rep = json.loads(out)
    assert rc == 0 and rep["delta"] == 0.01 and rep["parameters"]["sigma"] > 0


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--mechanism", "laplace", "--epsilon", "-1"], "argument --epsilon"),
        (["--mechanism", "laplace", "--epsilon", "1", "--alpha", "2"], "'--alpha'"),
        (["--mechanism", "laplace", "--epsilon", "1", "--samples", "0"], "'--samples'"),
        (["--mechanism", "laplace", "--epsilon", "1", "--broken", "wrong_flip"], "'--broken'"),
    ],
)
def test_cli_audit_bad_input_exits_2_with_a_named_message(capsys, argv, needle):
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and needle in err and out == ""
