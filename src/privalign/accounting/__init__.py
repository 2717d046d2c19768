"""Privacy accounting: events, accountants, privacy filters. Pure, deterministic, no I/O, no RNG."""

from privalign.accounting.events import *  # noqa: F403
from privalign.accounting.events import __all__ as _events_all

__all__ = list(_events_all)
