"""Experiment configurations: TOML files checked against a per-experiment schema.

Every experiment declares a schema (a ``dict`` of :class:`Field`). A configuration file is a flat TOML
table whose keys must all be in the schema; missing keys take the schema default. Unknown keys and values
of the wrong type are errors that name the key and the file. Each key in the shipped files carries a
comment saying where its value comes from: ``[paper]``, ``[authors' code]`` (the public reference
scripts) or ``[our choice]``.

Example::

    seed = 42            # [authors' code] default seed of the public scripts
    n_max_log2 = 12      # [authors' code] N grid 2^0..2^12
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from privalign.errors import DataFormatError

__all__ = [
    "Field",
    "ConfigError",
    "load_config",
    "validate_config",
    "config_hash",
    "estimator_fields",
    "packaged_config_path",
    "SOURCE_TAGS",
]

SOURCE_TAGS = ("[paper]", "[authors' code]", "[our choice]", "[spec]")

_TYPES = ("int", "float", "str", "bool", "list[int]", "list[float]", "list[str]")


class ConfigError(DataFormatError):
    """A configuration file has an unknown key, a value of the wrong type, or is not valid TOML."""


@dataclass(frozen=True)
class Field:
    """One configuration key.

    Args:
      type: One of ``int``, ``float``, ``str``, ``bool``, ``list[int]``, ``list[float]``, ``list[str]``.
      default: The value used when the file omits the key.
      help: What the key means (units included).
      choices: Allowed values for ``str`` keys (``None`` = any).
      low: Smallest allowed value for numbers (and for each element of number lists).
    """

    type: str
    default: Any
    help: str
    choices: tuple | None = None
    low: float | None = None

    def __post_init__(self) -> None:
        if self.type not in _TYPES:  # pragma: no cover - programming error
            raise ValueError(f"unknown field type {self.type!r}")


def _type_ok(ftype: str, value: Any) -> bool:
    if ftype == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if ftype == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if ftype == "str":
        return isinstance(value, str)
    if ftype == "bool":
        return isinstance(value, bool)
    if ftype.startswith("list["):
        inner = ftype[5:-1]
        return isinstance(value, list) and len(value) > 0 and all(_type_ok(inner, v) for v in value)
    return False  # pragma: no cover


def _describe(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def validate_config(raw: dict[str, Any], schema: dict[str, Field], *, source: str) -> dict[str, Any]:
    """Check ``raw`` against ``schema`` and return the resolved configuration (defaults filled in).

    Args:
      raw: The parsed TOML table.
      schema: The experiment's schema.
      source: The file name (or ``"<overrides>"``), used in error messages.

    Returns:
      A new dict with every schema key; floats are ``float`` even when written as integers.

    Raises:
      ConfigError: unknown key, wrong type, value outside the allowed set or range. The message names
        the key and ``source``.
    """
    unknown = sorted(set(raw) - set(schema))
    if unknown:
        raise ConfigError(
            f"{source}: unknown configuration key {unknown[0]!r}"
            + (f" (and {len(unknown) - 1} more: {unknown[1:]})" if len(unknown) > 1 else "")
            + f". Known keys: {sorted(schema)}."
        )
    out: dict[str, Any] = {}
    for key, field in schema.items():
        value = raw.get(key, field.default)
        if not _type_ok(field.type, value):
            raise ConfigError(
                f"{source}: key {key!r} must be of type {field.type}"
                + (" (a non-empty list)" if field.type.startswith("list") else "")
                + f". Got {_describe(value)} instead."
            )
        if field.type == "float":
            value = float(value)
        elif field.type == "list[float]":
            value = [float(v) for v in value]
        if field.type in ("float", "list[float]"):
            vals = value if isinstance(value, list) else [value]
            if any(math.isnan(v) for v in vals):
                raise ConfigError(f"{source}: key {key!r} must not be NaN. Got {value!r} instead.")
            # No key takes ±inf (TOML's inf, or a literal such as 1e400 that overflows): ε = inf is no
            # privacy (a non-private curve is asked for by name, e.g. BoN); an infinite range, σ or δ is
            # meaningless.
            if any(math.isinf(v) for v in vals):
                why = (
                    " (ε = inf is no privacy; a non-private reference is a method named as such, e.g. BoN)"
                    if "eps" in key
                    else ""
                )
                raise ConfigError(f"{source}: key {key!r} must be finite{why}. Got {value!r} instead.")
        if field.choices is not None:
            vals = value if isinstance(value, list) else [value]
            bad = [v for v in vals if v not in field.choices]
            if bad:
                raise ConfigError(
                    f"{source}: key {key!r} must be one of {list(field.choices)}. Got {bad[0]!r} instead."
                )
        if field.low is not None and field.type in ("int", "float", "list[int]", "list[float]"):
            vals = value if isinstance(value, list) else [value]
            bad = [v for v in vals if v < field.low]
            if bad:
                raise ConfigError(f"{source}: key {key!r} must be >= {field.low:g}. Got {bad[0]!r} instead.")
        out[key] = value
    return out


#: The order in which the published configurations list the shared estimator keys (a key an estimator
#: declares beyond these follows them).
_ESTIMATOR_KEY_ORDER = (
    "seed",
    "methods",
    "delta",
    "step_size",
    "radius",
    "alpha",
    "tune",
    "dpsgd_epochs",
    "dpsgd_batch",
    "dpsgd_clip",
    "dpsgd_lr",
)


def estimator_fields() -> dict[str, Field]:
    """The schema keys every experiment that fits reward estimators shares: ``seed``, ``methods`` (any
    spelling of the registered estimators; default their names, the non-private references first and sparse
    before dense), ``delta``, ``tune`` and each estimator's
    declared experiment parameters (:func:`privalign.estimation.registry.experiment_params`)."""
    from privalign.estimation import registry

    def order(name: str) -> tuple[bool, bool]:
        return registry.privacy_kind(name) != "none", not registry.estimator_class(name).sparse

    fields = {
        "seed": Field("int", 42, "root seed", low=0),
        "methods": Field(
            "list[str]", sorted(registry.names(), key=order), "estimators", choices=registry.spellings()
        ),
        "delta": Field("float", 1e-5, "δ of the sample-DP methods", low=1e-300),
        "tune": Field(
            "bool", False, "choose hyper-parameters by the accounted validation protocol", low=None
        ),
    }
    for key, p in registry.experiment_params().items():
        fields[key] = Field(p.type, p.default, p.help, low=p.low)
    ordered = {k: fields[k] for k in _ESTIMATOR_KEY_ORDER if k in fields}
    return ordered | {k: v for k, v in fields.items() if k not in ordered}


def packaged_config_path(name: str) -> Path:
    """Path of a configuration shipped with privalign (``experiments/configs/<name>.toml``)."""
    return Path(str(resources.files("privalign.experiments").joinpath("configs", f"{name}.toml")))


def load_config(path: str | Path, schema: dict[str, Field]) -> dict[str, Any]:
    """Read a TOML configuration file and validate it against ``schema``.

    Raises:
      FileNotFoundError: the file does not exist.
      ConfigError: a directory, invalid TOML, unknown key or wrong type (the message names the key and the
        file).
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not a configuration file (a TOML file was expected)")
    if not path.is_file():
        raise FileNotFoundError(f"Configuration file not found: {path}")
    try:
        with path.open("rb") as fh:
            raw = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    out = validate_config(raw, schema, source=str(path))
    # A relative pool path is relative to the configuration file (as in service configs), not to the cwd. Keys
    # documented as repository-relative (win-rate *_pool) are config-relative only when the file is there.
    for key, value in out.items():
        if key not in raw or not isinstance(value, str) or value in ("", "synthetic", "shipped"):
            continue
        if key == "pool" or key.endswith("_pool"):
            p = Path(value).expanduser()
            if not p.is_absolute() and (key == "pool" or (path.parent / p).is_file()):
                out[key] = str((path.parent / p).resolve())
    return out


def config_hash(experiment: str, config: dict[str, Any]) -> str:
    """SHA-256 of the experiment name and the resolved configuration (canonical JSON)."""
    blob = json.dumps({"experiment": experiment, "config": config}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()
