"""One JSON convention: ``privalign._json``. ∞ → "inf", NaN → null, numpy → Python, strict JSON;
the CLI's ``--json`` output, ``simulate``'s results.json and the old names use it."""

import json
import math

import numpy as np
import pytest

from privalign._json import dumps, from_jsonable, to_jsonable, write_json_atomic


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (math.inf, "inf"),
        (-math.inf, "-inf"),
        (math.nan, None),
        (np.float64(np.inf), "inf"),
        (np.float32(-np.inf), "-inf"),
        (np.float32(np.nan), None),
        (np.int64(7), 7),
        (np.bool_(True), True),
        (1.5, 1.5),
        ("inf", "inf"),
        (None, None),
    ],
)
def test_scalars(value, want):
    got = to_jsonable(value)
    assert got == want and type(got) is type(want)


def test_nested_containers_and_arrays():
    obj = {"a": (1, np.array([1.0, np.inf, np.nan])), "b": [{"c": np.float32(0.5)}]}
    assert to_jsonable(obj) == {"a": [1, [1.0, "inf", None]], "b": [{"c": 0.5}]}


def test_round_trip_of_infinities():
    obj = {"eps": math.inf, "xs": [-math.inf, 2.0]}
    assert from_jsonable(json.loads(dumps(obj))) == obj


def test_output_is_strict_json():
    text = dumps({"x": [math.inf, math.nan, np.float32(np.inf)]})
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text) == {"x": ["inf", None, "inf"]}


def test_write_json_atomic_refuses_non_finite_and_leaves_no_file(tmp_path):
    p = tmp_path / "m.json"
    write_json_atomic(p, {"b": 1, "a": 2})
    assert p.read_text().startswith('{\n  "a": 2')
    with pytest.raises(ValueError):
        write_json_atomic(tmp_path / "bad.json", {"x": math.inf})
    assert not (tmp_path / "bad.json").exists()


def test_the_cli_uses_the_one_policy(capsys):
    from privalign.cli._args import emit_json

    obj = {"eps": math.inf, "mean": math.nan, "t": (1, -math.inf)}
    emit_json(obj)
    assert (
        json.loads(capsys.readouterr().out)
        == to_jsonable(obj)
        == {"eps": "inf", "mean": None, "t": [1, "-inf"]}
    )
