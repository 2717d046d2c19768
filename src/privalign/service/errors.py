"""Error answers of the service (OpenAI-style bodies, never a stack trace)."""

from __future__ import annotations

from typing import Any

__all__ = ["ApiError", "error_body"]


class ApiError(Exception):
    """An error answer: status, OpenAI-style ``type``, message, extra body fields.

    ``charged``: the request's reservation stays charged (the private reward model ran): the answer
    carries ``x-should-retry: false`` so that clients with automatic retries (the official ``openai``
    client retries 5xx twice by default) do not pay again. ``retry``: ``False`` also for uncharged
    errors a retry cannot fix (429: the budget is exhausted).
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
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status, self.type, self.message, self.extra = status, type_, message, extra
        self.charged = charged
        self.headers = dict(headers or {})
        if charged or retry is False:
            self.headers["x-should-retry"] = "false"
        if charged:
            self.extra.setdefault("charged", True)


def error_body(type_: str, message: str, **extra: Any) -> dict:
    return {"error": {"type": type_, "message": message, **extra}}
