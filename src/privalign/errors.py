"""Named exceptions and warnings of privalign.

Every error message names the parameter, the constraint and the offending value, and, where there is
one, the remedy. Errors are raised *before* any state changes (budgets, ledgers, files).
"""

from __future__ import annotations

__all__ = [
    "PrivalignError",
    "PrivacyParameterError",
    "BudgetExhaustedError",
    "ReservationError",
    "UnsupportedEventError",
    "DataFormatError",
    "MissingDependencyError",
    "PrivacyWarning",
    "UtilityWarning",
]


class PrivalignError(Exception):
    """Base class of all privalign errors."""


class PrivacyParameterError(PrivalignError, ValueError):
    """A parameter has an invalid value (e.g. ε ≤ 0, δ outside (0, 1), NaN scores, s > d)."""


class BudgetExhaustedError(PrivalignError):
    """A reservation would push a privacy filter past its budget. Nothing was charged.

    Attributes:
      remaining: what is left of the budget (a dict, e.g. ``{"epsilon": 0.3}``), when known.
    """

    def __init__(self, message: str, *, remaining: dict | None = None) -> None:
        super().__init__(message)
        self.remaining = remaining or {}


class ReservationError(PrivalignError):
    """Misuse of a reservation: settled twice, realized cost above the reservation, unknown id."""


class UnsupportedEventError(PrivalignError, TypeError):
    """An accountant was given an event (or a nested sub-event) that it cannot account.

    Accountants fail closed: nothing is composed when this is raised.
    """


class DataFormatError(PrivalignError, ValueError):
    """A data file or record is malformed; the message names the file, line and field."""


class MissingDependencyError(PrivalignError, ImportError):
    """An optional dependency or data file is missing; the message gives the install command."""


class PrivacyWarning(UserWarning):
    """A non-fatal privacy risk: a large ε, a non-secure noise source used in a serving context, ..."""


class UtilityWarning(UserWarning):
    """A private run whose configuration leaves its output no room to carry signal (e.g. DP-SGD noise that
    swamps every step): the guarantee holds, but the result is expected to be no better than its start."""
