"""Service configuration: one TOML file (``privalign serve --config FILE``), validated on load.

Sections (every key optional; defaults are the secure ones):

.. code-block:: toml

    [database]
    url = "sqlite:///privalign-service.db"   # or postgresql+psycopg://user@host:5432/db
    schema = ""                              # PostgreSQL schema (search_path); "" = default
    sync = "full"                            # full: each reservation is flushed to disk before any score
                                             # is computed (settles are not: a lost settle is reconciled at
                                             # the reserved cost); normal: no flush waits (survives process
                                             # crashes, not power loss)
    group_commit = true                      # with sync = "full": reservations are committed at once and
                                             # flushed together in the background; an answer (or an error
                                             # after scoring) is released only once its reservation is on
                                             # disk. false: each reserve waits for its own flush

    [server]
    host = "127.0.0.1"
    port = 8000
    cors_origins = []                         # CORS off unless origins are listed
    header_timeout_s = 10.0                   # a request's headers must arrive within this long of the
                                              # connection opening or the previous response, else closed
    body_timeout_s = 30.0                     # its body within this long of its headers, else closed
    keep_alive_s = 5.0                        # idle keep-alive connections are closed after this long
    max_connections = 4096                    # open connections in total (lowered to the file limit);
                                              # beyond: the oldest idle connection is closed
    max_connections_per_ip = 128              # per client address, same rule; 0 = no cap
    max_in_flight = 256                       # requests running (503 beyond; /healthz, /readyz and
                                              # /metrics exempt); 0 = no cap
    max_in_flight_per_ip = 64                 # per client address (429 beyond); 0 = no cap
                                              # (a request counts in flight once its body is complete)
    in_flight_reserved_for_keys = 64          # of max_in_flight, kept for tokens of keys this process
                                              # has authenticated (others: 503 beyond the rest)
    max_body_waiting = 256                    # requests whose body is still arriving: beyond, the
                                              # oldest is closed (nothing reserved); 0 = no cap
    max_body_waiting_per_ip = 16              # per client address, same rule; 0 = no cap
    min_body_bytes_per_s = 1024.0             # after 1 s, a slower body closes its connection; 0 = off
    connection_rate_per_ip = 64.0             # new connections per second per address (2 s burst);
                                              # beyond, dropped at once (nothing evicted); 0 = no limit

    [limits]
    max_n = 64                                # candidates generated / brought per request, for every
                                              # method (PrivITP's 2n + 1 included)
    max_text_chars = 8000                     # prompt and each candidate, generated ones included
    max_body_bytes = 1000000
    max_epsilon = 10.0                        # per request
    min_epsilon = 1e-6                        # per request: smaller ε is refused (400); ≥ 1e-9,
                                              # the ledger unit
    max_tokens = 512
    request_timeout_s = 60.0                  # generation + scoring wall-clock limit; default sized to the
                                              # generator: transformers 900, upstream timeout_s + 30, else 60
    idempotency_ttl_s = 86400.0               # stored answers of Idempotency-Key requests expire after this
    key_concurrency = 8                       # requests of one key in flight per process (429 beyond)
    key_units_per_s = 2000.0                  # work units one key may use per second (429 beyond); a
                                              # request costs 1 + ceil(Σ (prompt + candidate chars) / 1000)
    key_burst_units = 4000.0                  # the most one key may use at once; 0 (either) = no limit

    [privacy]
    allowed_methods = ["privbon"]             # privbon | privitp | bon
    allow_non_private = false                 # "bon" is refused unless true AND listed
    require_privacy = true                    # a request must state privacy.epsilon (400 otherwise): no
                                              # request spends a server default. false: default_epsilon
                                              # applies (echoed in the answer and in GET /v1/budget)
    sensitivity = 1.0                         # Δ_r: ℓ∞ change of any score between neighbours (public)
    reward_max = 1.0                          # R_max: scores are clipped to [0, R_max]
    default_epsilon = 1.0                     # only with require_privacy = false
    default_n = 8                             # privacy.n when a request omits it
    delta = 1e-6                              # δ of PrivITP's phase 1
    reconcile_after_s = 300.0                 # open reservations older than this are charged
    pad_selection_s = 0.0                     # pad scoring + selection to at least this long (timing channel)

    [privacy.privitp]
    beta = 0.05
    sigma_x = 1.0
    sigma_z = 1.0
    envelope_l = 3.0

    [reward_model]
    kind = "linear"                           # linear (JSON weights over hashed n-grams) | python
    path = "reward.json"
    # kind = "python"; target = "package.module:factory"; options = {...}

    [generator]                               # default: kind = "transformers" (SmolLM2-135M, loaded lazily)
    kind = "upstream"                         # upstream (OpenAI-compatible, e.g. vLLM) | transformers |
                                              # ctranslate2 (extra fast-cpu) | python | none
    base_url = "http://127.0.0.1:8001/v1"
    model = "served-model"
    timeout_s = 30.0                          # per attempt
    max_retries = 2                           # openai SDK retries (connection errors, timeouts,
                                              # 408/409/429/5xx)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from privalign._validation import EPS_MAX, EPS_MIN, check_choice, check_int, check_real
from privalign.alignment.selectors import check_method, method_class, methods, pool_size
from privalign.errors import PrivacyParameterError

__all__ = [
    "DatabaseConfig",
    "ServerConfig",
    "LimitsConfig",
    "PrivacyConfig",
    "ComponentConfig",
    "ServiceConfig",
    "config_with_overrides",
    "load_config",
    "default_config",
    "user_data_dir",
    "DEFAULT_REWARD_MODEL",
    "DATABASE_SCHEMES",
    "check_database_url",
]


# The reward model shipped with privalign (``privalign serve`` without a config serves it): RR-IHT, label-DP
# ε = 4, fit on the HH-RLHF harmless pairs by
# ``privalign fit-reward --data hh-rlhf --method rr-iht --epsilon 4 --seed 0``
# (held-out preference accuracy 0.616 on 463 pairs). See README "Serve".
DEFAULT_REWARD_MODEL = (
    Path(__file__).resolve().parents[1] / "models" / "reward_models" / "hh-rlhf-harmless-rr-iht.json"
)


def user_data_dir() -> Path:
    """Where ``privalign serve`` keeps its default SQLite ledger: ``$PRIVALIGN_HOME``, else
    ``$XDG_DATA_HOME/privalign``, else ``~/.local/share/privalign``."""
    import os

    if os.environ.get("PRIVALIGN_HOME"):
        return Path(os.environ["PRIVALIGN_HOME"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "privalign"


#: The databases the ledger supports (``scheme://`` of the URL): SQLite and PostgreSQL through psycopg 3.
DATABASE_SCHEMES = ("sqlite", "postgresql+psycopg")


def check_database_url(url: Any, name: str) -> None:
    """A database URL of a supported kind (:data:`DATABASE_SCHEMES`; ``postgresql://`` too where SQLAlchemy's
    default driver for it is psycopg 3); another database (``mysql://``) or driver (psycopg2) failed at
    start-up as a missing module.

    A string without ``://`` is left to SQLAlchemy's URL parser (the CLI words its error with an example
    URL for the path).

    Raises:
      PrivacyParameterError: ``The 'NAME' parameter must be ...``, naming the supported kinds and the value.
    """
    if not isinstance(url, str) or "://" not in url:
        return
    scheme = url.split("://", 1)[0].lower()
    if scheme in (*DATABASE_SCHEMES, "sqlite+pysqlite"):
        return
    if scheme == "postgresql" and _default_postgresql_driver() == "psycopg":  # SQLAlchemy >= 2.1
        return
    hint = (
        " (for PostgreSQL write postgresql+psycopg://: the driver is psycopg 3)"
        if scheme.startswith("postgres")
        else f" (scheme {scheme!r}: not supported)"
    )
    raise PrivacyParameterError(
        f"The '{name}' parameter must be a sqlite:///FILE or postgresql+psycopg://USER@HOST:PORT/DB URL (the "
        f"supported databases: SQLite, PostgreSQL). Got {url!r}{hint}."
    )


def _default_postgresql_driver() -> str | None:
    """The driver SQLAlchemy uses for a plain ``postgresql://`` URL (psycopg 3 from SQLAlchemy 2.1 on,
    psycopg2 before), or ``None`` without SQLAlchemy."""
    try:
        from sqlalchemy.dialects import registry

        return str(registry.load("postgresql").driver)
    except ImportError:
        return None


@dataclass(frozen=True)
class DatabaseConfig:
    url: str = "sqlite:///privalign-service.db"
    schema: str = ""
    sync: str = "full"
    group_commit: bool = True


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    cors_origins: tuple[str, ...] = ()
    log_level: str = "warning"
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    max_connections: int = 4096
    max_connections_per_ip: int = 128
    max_in_flight: int = 256
    max_in_flight_per_ip: int = 64
    in_flight_reserved_for_keys: int = 64
    max_body_waiting: int = 256
    max_body_waiting_per_ip: int = 16
    min_body_bytes_per_s: float = 1024.0
    connection_rate_per_ip: float = 64.0


@dataclass(frozen=True)
class LimitsConfig:
    max_n: int = 64
    max_text_chars: int = 8000
    max_body_bytes: int = 1_000_000
    max_epsilon: float = 10.0
    min_epsilon: float = 1e-6
    max_tokens: int = 512
    request_timeout_s: float = 60.0
    idempotency_ttl_s: float = 86400.0
    key_concurrency: int = 8
    key_units_per_s: float = 2000.0
    key_burst_units: float = 4000.0


@dataclass(frozen=True)
class PrivacyConfig:
    allowed_methods: tuple[str, ...] = ("privbon",)
    allow_non_private: bool = False
    require_privacy: bool = True
    sensitivity: float = 1.0
    reward_max: float = 1.0
    default_epsilon: float = 1.0
    default_n: int = 8
    delta: float = 1e-6
    reconcile_after_s: float = 300.0
    pad_selection_s: float = 0.0
    privitp: dict[str, float] = field(
        default_factory=lambda: {"beta": 0.05, "sigma_x": 1.0, "sigma_z": 1.0, "envelope_l": 3.0}
    )

    def params_for(self, method: str) -> dict[str, Any]:
        """The server's defaults for ``method``'s declared parameters: its ``[privacy.<method>]`` table
        (``envelope_l`` is the parameter ``L``) and ``delta``."""
        declared = {p.name for p in method_class(method).params}
        table = getattr(self, method, None)
        out = (
            {("L" if k == "envelope_l" else k): v for k, v in table.items()}
            if isinstance(table, dict)
            else {}
        )
        if "delta" in declared:
            out["delta"] = self.delta
        return {k: v for k, v in out.items() if k in declared}


@dataclass(frozen=True)
class ComponentConfig:
    """A pluggable component (reward model or generator): its ``kind`` and its options."""

    kind: str = "none"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ServiceConfig:
    database: DatabaseConfig = DatabaseConfig()
    server: ServerConfig = ServerConfig()
    limits: LimitsConfig = LimitsConfig()
    privacy: PrivacyConfig = PrivacyConfig()
    reward_model: ComponentConfig = ComponentConfig()
    generator: ComponentConfig = ComponentConfig(kind="transformers")
    source: str = ""

    def validate(self) -> ServiceConfig:
        """Check every value; returns ``self``.

        Raises:
          PrivacyParameterError: naming the section.key, the constraint and the value (a value of the
            wrong type, e.g. a string where a number belongs, included).
        """
        try:
            return self._validate()
        except TypeError as exc:  # check_real/check_int name the key; one exception type for the CLI
            raise PrivacyParameterError(str(exc)) from None

    def _validate(self) -> ServiceConfig:
        lim, pv = self.limits, self.privacy
        check_database_url(self.database.url, "database.url")
        check_choice(self.database.sync, "database.sync", ("full", "normal"))
        if not isinstance(self.database.group_commit, bool):
            raise PrivacyParameterError(
                "The 'database.group_commit' parameter must be true or false. "
                f"Got {self.database.group_commit!r} instead."
            )
        check_int(lim.max_n, "limits.max_n", low=1, high=10_000)
        check_int(lim.max_text_chars, "limits.max_text_chars", low=1)
        check_int(lim.max_body_bytes, "limits.max_body_bytes", low=1024)
        # the library's one ε rule bounds both (privalign._validation: EPS_MIN = 1e-9, EPS_MAX = 700)
        check_real(lim.max_epsilon, "limits.max_epsilon", low=EPS_MIN, high=EPS_MAX, closed="both")
        check_real(lim.min_epsilon, "limits.min_epsilon", low=EPS_MIN, high=lim.max_epsilon, closed="both")
        check_real(lim.idempotency_ttl_s, "limits.idempotency_ttl_s", low=0.0)
        check_int(lim.max_tokens, "limits.max_tokens", low=1)
        check_real(lim.request_timeout_s, "limits.request_timeout_s", low=0.0)
        for m in pv.allowed_methods:
            check_method(m, "privacy.allowed_methods")  # unknown names: the library's one error
            if not method_class(m).served:
                raise PrivacyParameterError(
                    f"The 'privacy.allowed_methods' parameter lists {m!r}, which the service does not serve "
                    f"(it serves {[x for x in methods() if method_class(x).served]})."
                )
        _check_bools(pv)
        open_ = [m for m in pv.allowed_methods if not method_class(m).private]
        if open_ and not pv.allow_non_private:
            raise PrivacyParameterError(
                f"The 'privacy.allowed_methods' parameter lists {open_[0]!r} (no privacy) but "
                "'privacy.allow_non_private' is false. "
                f"Set allow_non_private = true to deploy a non-private service, or remove {open_[0]!r}."
            )
        check_real(pv.sensitivity, "privacy.sensitivity", low=0.0)
        check_real(pv.reward_max, "privacy.reward_max", low=0.0)
        check_real(
            pv.default_epsilon, "privacy.default_epsilon", low=0.0, high=lim.max_epsilon, closed="right"
        )
        check_int(pv.default_n, "privacy.default_n", low=1, high=lim.max_n)
        _check_default_pool(pv, lim)
        check_real(pv.delta, "privacy.delta", low=0.0, high=1.0)
        check_real(
            pv.reconcile_after_s, "privacy.reconcile_after_s", low=lim.request_timeout_s, closed="left"
        )
        check_real(
            pv.pad_selection_s, "privacy.pad_selection_s", low=0.0, high=lim.request_timeout_s, closed="both"
        )
        unknown = set(pv.privitp) - {"beta", "sigma_x", "sigma_z", "envelope_l"}
        if unknown:
            raise PrivacyParameterError(
                f"Unknown key(s) {sorted(unknown)} in config section [privacy.privitp]; "
                "expected beta, sigma_x, sigma_z, envelope_l."
            )
        for k in ("beta", "sigma_x", "sigma_z"):
            check_real(pv.privitp[k], f"privacy.privitp.{k}", low=0.0)
        check_real(pv.privitp["envelope_l"], "privacy.privitp.envelope_l", low=0.0, closed="left")
        check_int(self.server.port, "server.port", low=0, high=65535)
        self._validate_overload()
        check_choice(self.reward_model.kind, "reward_model.kind", ("linear", "python", "none"))
        check_choice(
            self.generator.kind,
            "generator.kind",
            ("upstream", "transformers", "ctranslate2", "python", "none"),
        )
        return self

    def _validate_overload(self) -> None:
        srv, lim = self.server, self.limits
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s"):
            check_real(getattr(srv, name), f"server.{name}", low=0.0, high=3600.0, closed="right")
        for name in (
            "max_connections",
            "max_connections_per_ip",
            "max_in_flight",
            "max_in_flight_per_ip",
            "in_flight_reserved_for_keys",
            "max_body_waiting",
            "max_body_waiting_per_ip",
        ):
            check_int(getattr(srv, name), f"server.{name}", low=0, high=1_000_000)
        for name in ("min_body_bytes_per_s", "connection_rate_per_ip"):
            check_real(getattr(srv, name), f"server.{name}", low=0.0, high=1e12, closed="both")
        check_int(lim.key_concurrency, "limits.key_concurrency", low=0, high=1_000_000)
        check_real(lim.key_units_per_s, "limits.key_units_per_s", low=0.0, high=1e12, closed="both")
        check_real(lim.key_burst_units, "limits.key_burst_units", low=0.0, high=1e12, closed="both")


def _check_bools(pv: PrivacyConfig) -> None:
    for name in ("allow_non_private", "require_privacy"):
        v = getattr(pv, name)
        if not isinstance(v, bool):
            raise PrivacyParameterError(
                f"The 'privacy.{name}' parameter must be true or false. Got {v!r} instead."
            )


def _check_default_pool(pv: PrivacyConfig, lim: LimitsConfig) -> None:
    """``limits.max_n`` caps the candidates of every method (PrivITP: ``2n + 1``), ``default_n`` included."""
    for m in pv.allowed_methods:
        need = pool_size(m, pv.default_n)
        if need > lim.max_n:
            raise PrivacyParameterError(
                f"The 'privacy.default_n' parameter {pv.default_n} makes {m} (in privacy.allowed_methods) "
                f"use {need} candidates, above limits.max_n = {lim.max_n}: lower default_n or raise max_n."
            )


def _section(cls: type, data: dict[str, Any], name: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise PrivacyParameterError(
            f"Unknown key(s) {sorted(unknown)} in config section [{name}]; expected some of {sorted(known)}."
        )
    kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items()}
    return cls(**kwargs)


def config_from_dict(data: dict[str, Any], *, source: str = "") -> ServiceConfig:
    """Build and validate a :class:`ServiceConfig` from a parsed TOML dict."""
    known = {"database", "server", "limits", "privacy", "reward_model", "generator"}
    unknown = set(data) - known
    if unknown:
        raise PrivacyParameterError(
            f"Unknown config section(s) {sorted(unknown)}; expected some of {sorted(known)}."
        )
    priv = dict(data.get("privacy", {}))
    itp = {**PrivacyConfig().privitp, **priv.pop("privitp", {})}
    limits = dict(data.get("limits", {}))
    gen = data.get("generator", {"kind": "transformers"})
    if "request_timeout_s" not in limits:  # sized to the configured generator
        kind = gen.get("kind", "none") if isinstance(gen, dict) else "none"
        t = gen.get("timeout_s", 30.0) if isinstance(gen, dict) else 30.0
        limits["request_timeout_s"] = (
            900.0
            if kind in ("transformers", "ctranslate2")
            else float(t) + 30.0
            if kind == "upstream" and isinstance(t, int | float)
            else 60.0
        )
        if "reconcile_after_s" not in priv:
            priv["reconcile_after_s"] = max(
                PrivacyConfig().reconcile_after_s, 2.0 * limits["request_timeout_s"]
            )
    cfg = ServiceConfig(
        database=_section(DatabaseConfig, data.get("database", {}), "database"),
        server=_section(ServerConfig, data.get("server", {}), "server"),
        limits=_section(LimitsConfig, limits, "limits"),
        privacy=replace(_section(PrivacyConfig, priv, "privacy"), privitp=itp),
        reward_model=_component(data.get("reward_model", {})),
        generator=_component(data.get("generator", {"kind": "transformers"})),
        source=source,
    )
    return cfg.validate()


def _component(data: dict[str, Any]) -> ComponentConfig:
    data = dict(data)
    kind = data.pop("kind", "none")
    return ComponentConfig(kind=kind, options=data)


def default_config() -> ServiceConfig:
    """The embedded defaults of ``privalign serve`` without ``--config``: the SQLite ledger
    ``user_data_dir()/service.db``, the shipped reward model (:data:`DEFAULT_REWARD_MODEL`) and the local
    SmolLM2 generator (loaded on the first generating request)."""
    db = user_data_dir() / "service.db"
    return config_from_dict(
        {
            "database": {"url": f"sqlite:///{db}"},
            "reward_model": {"kind": "linear", "path": str(DEFAULT_REWARD_MODEL)},
            "generator": {"kind": "transformers"},
        },
        source="(embedded defaults)",
    )


def load_config(path: str | Path) -> ServiceConfig:
    """Read and validate a TOML config file.

    Raises:
      FileNotFoundError: no such file.
      PrivacyParameterError: unknown sections/keys or invalid values.
    """
    p = Path(path)
    with p.open("rb") as fh:
        data = tomllib.load(fh)
    cfg = config_from_dict(data, source=str(p))
    # A relative SQLite path or reward-model path is relative to the config file.
    if cfg.database.url.startswith("sqlite:///") and not cfg.database.url.startswith("sqlite:////"):
        rel = cfg.database.url[len("sqlite:///") :]
        if rel and rel != ":memory:":
            cfg = replace(cfg, database=replace(cfg.database, url=f"sqlite:///{(p.parent / rel).resolve()}"))
    rm_path = cfg.reward_model.options.get("path")
    if rm_path and not Path(rm_path).is_absolute():
        cfg = replace(
            cfg,
            reward_model=replace(
                cfg.reward_model,
                options={**cfg.reward_model.options, "path": str((p.parent / rm_path).resolve())},
            ),
        )
    return cfg


def config_with_overrides(
    config: str | Path | None = None,
    *,
    reward_model: str | Path | None = None,
    db: str | None = None,
    generator: str | None = None,
    host: str | None = None,
    port: int | None = None,
) -> ServiceConfig:
    """The validated config ``privalign serve`` runs: the TOML file ``config`` (default: the embedded
    defaults) with its command-line overrides (each ``None`` keeps the file's value).

    ``reward_model`` serves that linear reward-model file; ``generator`` changes the kind and keeps the
    section's sampling options only between the two local kinds (``transformers``, ``ctranslate2``).

    Raises:
      FileNotFoundError, ValueError: a missing file or invalid TOML (``argument --config: ...``,
        ``argument --reward-model: ...``).
      PrivacyParameterError: an invalid value (named).
    """
    if config and not Path(config).is_file():
        raise FileNotFoundError(f"argument --config: no such file: {config}")
    try:
        cfg = load_config(config) if config else default_config()
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"argument --config: {config} is not valid TOML: {exc}") from None
    if reward_model is not None:
        path = Path(reward_model).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"argument --reward-model: no such file: {reward_model}")
        cfg = replace(
            cfg, reward_model=replace(cfg.reward_model, kind="linear", options={"path": str(path.resolve())})
        )
    if generator is not None:
        local = ("transformers", "ctranslate2")
        keep = cfg.generator.kind in local and generator in local
        options = dict(cfg.generator.options) if keep else {}
        cfg = replace(cfg, generator=replace(cfg.generator, kind=generator, options=options))
    if db is not None:
        check_database_url(db, "db")  # named as the option (--db), not as the file's key
        cfg = replace(cfg, database=replace(cfg.database, url=db))
    if port is not None:
        cfg = replace(cfg, server=replace(cfg.server, port=port))
    if host is not None:
        cfg = replace(cfg, server=replace(cfg.server, host=host))
    return cfg.validate()
