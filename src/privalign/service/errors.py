"""Error answers of the service: OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``, never a
stack trace. ``code`` is never ``null``: the raising site names it, else it is the default of the error's
``type`` (:data:`DEFAULT_CODES`); every code is listed in ``docs/service.md``, *Errors*."""

from __future__ import annotations

from typing import Any

__all__ = ["ApiError", "error_body", "default_code", "validation_code", "DEFAULT_CODES"]

#: The ``code`` of an error whose raising site names none, by ``type``.
DEFAULT_CODES = {
    "invalid_request_error": "invalid_value",
    "authentication_error": "invalid_api_key",
    "budget_exhausted": "budget_exhausted",
    "rate_limit_error": "rate_limit_exceeded",
    "service_unavailable": "service_unavailable",
    "upstream_error": "upstream_error",
    "upstream_timeout": "upstream_timeout",
    "timeout": "timeout",
    "internal_error": "internal_error",
}


def default_code(type_: str) -> str:
    """The ``code`` for an error of ``type_`` whose raising site names none (never ``None``)."""
    return DEFAULT_CODES.get(type_, type_)


def validation_code(pydantic_type: str) -> str:
    """The ``code`` of a schema refusal, from pydantic's error type: ``missing_required_parameter``,
    ``unknown_parameter`` (a field a strict object does not have), ``invalid_type`` (a value of the wrong
    JSON type, e.g. ``true`` for a number), ``invalid_json`` (a body that is not JSON), else
    ``invalid_value`` (out of range, too long, not encodable …)."""
    if pydantic_type == "missing":
        return "missing_required_parameter"
    if pydantic_type == "extra_forbidden":
        return "unknown_parameter"
    if pydantic_type == "json_invalid":
        return "invalid_json"
    if pydantic_type.endswith(("_type", "_parsing")) or pydantic_type == "int_from_float":
        return "invalid_type"
    return "invalid_value"


class ApiError(Exception):
    """An error answer: status, OpenAI-style ``type``, message, ``param``, ``code``, extra body fields.

    ``charged``: the request's reservation stays charged (the private reward model ran): the answer
    carries ``x-should-retry: false`` so that clients with automatic retries (the official ``openai``
    client retries 5xx twice by default) do not pay again. ``retry``: ``False`` also for uncharged
    errors a retry cannot fix (429: the budget is exhausted); ``True``: ``x-should-retry: true`` (a retry
    is expected to succeed, e.g. after ``Retry-After``). ``code``: ``None`` is the ``type``'s default.
    """

    def __init__(
        self,
        status: int,
        type_: str,
        message: str,
        *,
        charged: bool = False,
        retry: bool | None = None,
        headers: dict[str, str] | None = None,
        param: str | None = None,
        code: str | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status, self.type, self.message = status, type_, message
        self.extra: dict[str, Any] = {"param": param, "code": code or default_code(type_), **extra}
        self.charged = charged
        self.headers = dict(headers or {})
        if charged or retry is False:
            self.headers["x-should-retry"] = "false"
        elif retry is True:
            self.headers.setdefault("x-should-retry", "true")
        if charged:
            self.extra.setdefault("charged", True)

    @property
    def code(self) -> str:
        return str(self.extra["code"])

    def body(self) -> dict:
        """The JSON body of this error."""
        return error_body(self.type, self.message, **self.extra)


def error_body(
    type_: str, message: str, *, param: str | None = None, code: str | None = None, **extra: Any
) -> dict:
    """``{"error": {"message", "type", "param", "code", …extra}}``; ``code=None`` is the ``type``'s
    default (:func:`default_code`)."""
    return {
        "error": {
            "message": message,
            "type": type_,
            "param": param,
            "code": code or default_code(type_),
            **extra,
        }
    }
