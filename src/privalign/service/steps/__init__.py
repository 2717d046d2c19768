"""The steps of the request path, one module each (composed by :func:`privalign.service.pipeline.run`):

* :mod:`.reserve` — reserve the worst case (429 before any score); ``cancel``; ``durable`` (the gate:
  nothing that follows scoring leaves before the reservation is on disk);
* :mod:`.generate` — candidates from the public prompt (failure cancels the reservation);
* :mod:`.score` — the private reward model (from here on the reservation stays charged);
* :mod:`.select` — the private selection;
* :mod:`.charge` — ``PrivacyFilter.charge`` in exact ledger units;
* :mod:`.respond` — the answer, encoded to bytes before the charge is finalised.
"""

from privalign.service.steps.charge import charge
from privalign.service.steps.generate import generate
from privalign.service.steps.reserve import cancel, durable, reserve
from privalign.service.steps.respond import respond
from privalign.service.steps.score import score
from privalign.service.steps.select import select

__all__ = ["reserve", "cancel", "durable", "generate", "score", "select", "charge", "respond"]
