"""Config validation and the admin CLI (`privalign keys ...`, `privalign serve --check/--print-openapi`)."""

from __future__ import annotations

import json

import pytest

from conftest import write_config
from privalign.cli import main
from privalign.errors import PrivacyParameterError
from privalign.service.config import config_from_dict, load_config


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"privacy": {"allowed_methods": ["privbon", "bon"]}}, "allow_non_private"),
        ({"privacy": {"allowed_methods": ["greedy"]}}, "privacy.allowed_methods"),
        ({"limits": {"max_n": 0}}, "limits.max_n"),
        ({"privacy": {"sensitivity": -1.0}}, "privacy.sensitivity"),
        ({"privacy": {"default_epsilon": 20.0}}, "privacy.default_epsilon"),
        ({"privacy": {"reconcile_after_s": 1.0}}, "privacy.reconcile_after_s"),
        ({"privacy": {"privitp": {"sigma": 1.0}}}, "privacy.privitp"),
        ({"limits": {"max_nn": 3}}, "max_nn"),
        ({"admin": {}}, "admin"),
        ({"reward_model": {"kind": "oracle"}}, "reward_model.kind"),
        ({"database": {"sync": "off"}}, "database.sync"),
        ({"privacy": {"pad_selection_s": -1.0}}, "privacy.pad_selection_s"),
    ],
)
def test_invalid_configs_name_the_key(data, needle):
    with pytest.raises(PrivacyParameterError, match=needle.replace(".", r"\.")):
        config_from_dict(data)


def test_example_config_loads():
    from pathlib import Path

    cfg = load_config(Path(__file__).parents[2] / "configs" / "serve.example.toml")
    assert cfg.privacy.allowed_methods == ("privbon",) and not cfg.privacy.allow_non_private
    assert cfg.server.cors_origins == () and cfg.server.host == "127.0.0.1"


def test_keys_cli_roundtrip(tmp_path, capsys, reward_model):
    url = f"sqlite:///{tmp_path / 'k.db'}"
    assert (
        main(
            [
                "keys",
                "create",
                "--budget-epsilon",
                "2",
                "--accounting",
                "pure",
                "--name",
                "alice",
                "--db",
                url,
                "--json",
            ]
        )
        == 0
    )
    created = json.loads(capsys.readouterr().out)
    assert created["token"].startswith(f"pa_{created['key_id']}_")
    assert (
        main(
            [
                "keys",
                "create",
                "--budget-epsilon",
                "1",
                "--budget-delta",
                "1e-6",
                "--accounting",
                "zcdp",
                "--db",
                url,
                "--json",
            ]
        )
        == 0
    )
    z = json.loads(capsys.readouterr().out)
    assert main(["keys", "top-up", created["key_id"], "--epsilon", "0.5", "--db", url]) == 0
    assert main(["keys", "top-up", z["key_id"], "--epsilon", "1", "--db", url]) == 0
    assert main(["keys", "list", "--db", url, "--json"]) == 0
    rows = {r["key_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[created["key_id"]]["limit"] == [2.5, 0.0] and rows[created["key_id"]]["name"] == "alice"
    assert rows[z["key_id"]]["accounting"] == "zcdp" and 0 < rows[z["key_id"]]["limit"][0] < 1  # ρ, not ε
    # The secret is never stored: neither the token nor its secret part appears in the database file.
    raw = (tmp_path / "k.db").read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("k.db-*"))
    assert created["token"].split("_", 2)[2].encode() not in raw
    assert main(["keys", "revoke", created["key_id"], "--db", url]) == 0
    assert main(["keys", "list", "--db", url, "--json"]) == 0
    assert {r["key_id"]: r["revoked"] for r in json.loads(capsys.readouterr().out)}[created["key_id"]] is True
    # Bad input: clear errors, exit code 2, nothing written.
    assert main(["keys", "create", "--budget-epsilon", "-1", "--db", url]) == 2
    assert (
        main(["keys", "create", "--budget-epsilon", "1", "--accounting", "zcdp", "--db", url]) == 2
    )  # zcdp needs δ > 0
    assert main(["keys", "top-up", "nope", "--epsilon", "1", "--db", url]) == 2
    assert main(["keys", "top-up", created["key_id"], "--epsilon", "1", "--db", url]) == 2  # revoked
    err = capsys.readouterr().err
    assert "--budget-epsilon" in err and "key_id" in err  # errors name the flag
    assert main(["keys", "list", "--db", url, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2


def test_serve_check_and_openapi(tmp_path, capsys, reward_model):
    cfg = write_config(
        tmp_path / "s.toml",
        {"database": {"url": "sqlite:///s.db"}, "reward_model": {"kind": "linear", "path": "reward.json"}},
    )
    assert main(["serve", "--config", str(cfg), "--check"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["database"] == "sqlite" and summary["methods"] == ["privbon"]
    assert main(["serve", "--config", str(cfg), "--print-openapi"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert "/v1/select" in spec["paths"] and "privacy" in json.dumps(spec["components"])


@pytest.mark.parametrize(
    "value, needle",
    [
        (-0.1, "range"),
        (61.0, "range"),
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        ("0.5", "real number"),
    ],
)
def test_pad_selection_s_bad_values_are_refused(tmp_path, capsys, value, needle):
    # In memory: without a generator the default request_timeout_s is 60, so the pad must lie in [0, 60].
    with pytest.raises(PrivacyParameterError, match=r"'privacy\.pad_selection_s'") as ei:
        config_from_dict({"privacy": {"pad_selection_s": value}, "generator": {"kind": "none"}})
    assert needle in str(ei.value)
    # From a TOML file through the CLI: a clear one-line error naming the key, exit code 2, no traceback.
    cfg = write_config(
        tmp_path / "pad.toml",
        {
            "database": {"url": "sqlite:///pad.db"},
            "privacy": {"pad_selection_s": value},
            "generator": {"kind": "none"},
        },
    )
    assert main(["serve", "--config", str(cfg), "--check"]) == 2
    err = capsys.readouterr().err
    assert "privacy.pad_selection_s" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["inf", "nan", "1e400"])
@pytest.mark.parametrize(
    "section, key",
    [
        ("limits", "max_epsilon"),
        ("limits", "min_epsilon"),
        ("privacy", "default_epsilon"),
        ("privacy", "delta"),
        ("privacy.privitp", "sigma_x"),
        ("privacy.privitp", "beta"),
    ],
)
def test_non_finite_privacy_settings_are_refused(tmp_path, capsys, section, key, value):
    """Issue 24: no ε, δ or noise setting of the service may be infinite (ε = ∞ is no privacy; the
    non-private method is named: allowed_methods = ["bon"] with allow_non_private = true). TOML's inf/nan and
    a literal that overflows (1e400) alike: exit 2, one line naming the key."""
    cfg = tmp_path / "s.toml"
    cfg.write_text(
        f'[database]\nurl = "sqlite:///s.db"\n[generator]\nkind = "none"\n[{section}]\n{key} = {value}\n'
    )
    assert main(["serve", "--config", str(cfg), "--check"]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"'{section}.{key}'" in lines[0] and "finite" in lines[0], lines[0]


def test_pad_selection_s_may_equal_the_request_timeout(tmp_path):
    cfg = config_from_dict({"limits": {"request_timeout_s": 2.0}, "privacy": {"pad_selection_s": 2.0}})
    assert cfg.privacy.pad_selection_s == 2.0
    with pytest.raises(PrivacyParameterError, match=r"pad_selection_s.*\[0, 2\]"):
        config_from_dict({"limits": {"request_timeout_s": 2.0}, "privacy": {"pad_selection_s": 2.5}})


def test_default_request_timeout_is_sized_to_the_generator():
    """A CPU transformers generator gets minutes, an upstream one its own timeout plus a margin; an
    explicit value wins; reconciliation waits at least twice the request timeout."""
    t = config_from_dict({})
    assert t.generator.kind == "transformers" and t.limits.request_timeout_s == 900.0
    assert t.privacy.reconcile_after_s >= 2 * 900.0
    up = config_from_dict({"generator": {"kind": "upstream", "base_url": "http://x/v1", "timeout_s": 45.0}})
    assert up.limits.request_timeout_s == 75.0
    assert config_from_dict({"generator": {"kind": "none"}}).limits.request_timeout_s == 60.0
    assert config_from_dict({"generator": {"kind": "ctranslate2"}}).limits.request_timeout_s == 900.0
    assert config_from_dict({"limits": {"request_timeout_s": 5.0}}).limits.request_timeout_s == 5.0


def test_ctranslate2_generator_kind_builds_lazily_and_unknown_kinds_name_it():
    """generator.kind = "ctranslate2" builds the local generator on the CTranslate2 backend without loading
    the model (that happens on the first request); an unknown backend or kind is refused, naming the
    choices."""
    pytest.importorskip("ctranslate2", reason="needs privalign[fast-cpu]")
    from privalign.service.components import LocalTransformersGenerator, build_generator
    from privalign.service.config import ComponentConfig

    g = build_generator(ComponentConfig(kind="ctranslate2", options={"max_new_tokens": 4}))
    assert isinstance(g, LocalTransformersGenerator) and g.backend == "ctranslate2" and not g._gens
    with pytest.raises(PrivacyParameterError, match="ctranslate2"):
        build_generator(ComponentConfig(kind="ct2"))
    with pytest.raises(PrivacyParameterError, match="'backend'"):
        LocalTransformersGenerator(backend="llama")
    with pytest.raises(PrivacyParameterError, match="ctranslate2"):
        config_from_dict({"generator": {"kind": "ct2"}})


def test_ctranslate2_generator_without_the_package_names_the_extra(monkeypatch):
    """Checked when the service is built (serve --check, start-up), not on the first request."""
    import sys

    from privalign.errors import MissingDependencyError
    from privalign.service.components import LocalTransformersGenerator

    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 -> ImportError
    with pytest.raises(MissingDependencyError, match=r"fast-cpu"):
        LocalTransformersGenerator(backend="ctranslate2")


def test_serve_generator_flag_overrides_the_kind(tmp_path, monkeypatch, capsys):
    """--generator switches [generator].kind (serve --check reports it); sampling options survive a switch
    between the two local kinds, and an upstream section's options are dropped."""
    pytest.importorskip("fastapi", reason="needs privalign[serve]")
    from privalign.service.config import config_with_overrides

    monkeypatch.setenv("PRIVALIGN_HOME", str(tmp_path / "ph"))
    assert main(["serve", "--check", "--generator", "ctranslate2"]) == 0
    assert json.loads(capsys.readouterr().out)["generator"] == "ctranslate2"
    cfg_file = tmp_path / "s.toml"
    cfg_file.write_text('[generator]\nkind = "transformers"\nmax_new_tokens = 7\n')
    cfg = config_with_overrides(str(cfg_file), generator="ctranslate2")
    assert cfg.generator.kind == "ctranslate2" and cfg.generator.options == {"max_new_tokens": 7}
    cfg_file.write_text('[generator]\nkind = "upstream"\nbase_url = "http://127.0.0.1:1/v1"\n')
    cfg = config_with_overrides(str(cfg_file), generator="transformers")
    assert cfg.generator.kind == "transformers" and cfg.generator.options == {}
