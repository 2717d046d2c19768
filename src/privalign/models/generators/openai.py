"""``OpenAICompatibleGenerator``: candidates from an OpenAI-compatible ``/v1/completions`` endpoint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from privalign._validation import check_int, check_real
from privalign.errors import PrivacyParameterError
from privalign.models._resources import require
from privalign.models.generators.base import (
    Completion,
    GenerationError,
    SamplingParams,
    _apply_stop,
    _progress,
    candidate_seed,
)


class ServerUnreachableError(GenerationError):
    """Nothing answered at an OpenAI-compatible server's base URL (connection refused, DNS failure,
    timeout) after the client's retries; callers do not retry it again."""


class OpenAICompatibleClient:
    """The one client for OpenAI-compatible servers (vLLM, llama.cpp server, the OpenAI API, …):
    ``POST {base_url}/completions`` and ``/chat/completions`` with ``n`` choices.

    Used by :class:`OpenAICompatibleGenerator` (``privalign build-pool --generator openai``) and by the
    service's ``upstream`` generator (:class:`privalign.service.components.UpstreamGenerator`). Built on
    the official ``openai`` SDK: its retry policy (``max_retries`` retries of connection errors, timeouts,
    408/409/429 and 5xx answers, exponential backoff with jitter, ``Retry-After`` honoured) is the only
    retry loop, and its typed errors become one-line errors: :class:`ServerUnreachableError` when nothing
    answered, :class:`GenerationError` for an HTTP error answer (status and the first 200 characters of
    the body) or an answer without the expected choices. The body is sent as given (vLLM's ``top_k`` and
    ``seed`` included) and the answer is read as JSON, so servers that add or omit fields are accepted.

    Args:
      base_url: e.g. ``http://127.0.0.1:8000/v1`` (``http``/``https``).
      api_key: bearer token, if the server wants one.
      timeout: seconds per attempt.
      max_retries: retries after the first attempt (0 disables).
    """

    def __init__(
        self, base_url: str, *, api_key: str | None = None, timeout: float = 30.0, max_retries: int = 2
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise PrivacyParameterError(
                f"The 'base_url' parameter must be an http(s) URL such as http://127.0.0.1:8000/v1. "
                f"Got {base_url!r} instead."
            )
        self.max_retries = check_int(max_retries, "max_retries", low=0)
        timeout = check_real(timeout, "timeout", low=0.0)
        self._openai = require("openai", purpose="the OpenAI-compatible client")
        self.base_url = base_url.rstrip("/")
        self._client = self._openai.OpenAI(
            base_url=self.base_url,
            api_key=api_key or "none",
            timeout=float(timeout),
            max_retries=self.max_retries,
        )

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        oa = self._openai
        url = f"{self.base_url}{path}"
        try:
            out = self._client.post(path, cast_to=object, body=body)
        except oa.APIConnectionError as exc:  # APITimeoutError included
            what = "timed out" if isinstance(exc, oa.APITimeoutError) else "is unreachable"
            raise ServerUnreachableError(
                f"the OpenAI-compatible server at {self.base_url} {what} ({self.max_retries + 1} attempts)"
            ) from None
        except oa.APIStatusError as exc:
            text = exc.response.text[:200].replace("\n", " ") if exc.response is not None else ""
            raise GenerationError(f"HTTP {exc.status_code} from {url}: {text}") from None
        except oa.OpenAIError as exc:
            raise GenerationError(f"{url} failed: {type(exc).__name__}: {str(exc)[:200]}") from None
        if not isinstance(out, dict):
            raise GenerationError(f"{url} returned an answer that is not a JSON object")
        return out

    def choices_and_usage(
        self, path: str, body: dict[str, Any]
    ) -> tuple[list[tuple[str, str]], dict[str, int] | None]:
        """``POST {path}`` (``/completions`` or ``/chat/completions``) with ``body``; returns
        ``(text, finish_reason)`` per choice, in index order, and the answer's token counts
        ``{"prompt_tokens", "completion_tokens"}`` (the server's ``usage``: the prompt counted once, the
        completion tokens of all ``n`` choices together), or ``None`` if the answer carried no such counts
        (non-negative integers)."""
        n = int(body.get("n", 1))
        answer = self._post(path, body)
        choices = answer.get("choices")
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise GenerationError(f"{self.base_url}{path} returned a malformed answer (no list of choices)")
        if len(choices) != n:
            raise GenerationError(f"{self.base_url}{path} returned {len(choices)} choices; expected n={n}.")
        chat, out = path.startswith("/chat"), []
        for c in sorted(choices, key=lambda c: c["index"] if isinstance(c.get("index"), int) else 0):
            msg = c.get("message")
            text = (msg.get("content") if isinstance(msg, dict) else None) if chat else c.get("text")
            if not isinstance(text, str):
                what = "content" if chat else "text"
                raise GenerationError(f"{self.base_url}{path} returned a choice without {what}: {c!r:.200}")
            out.append((text, str(c.get("finish_reason") or "stop")))
        usage = answer.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        counts = {k: usage.get(k) for k in ("prompt_tokens", "completion_tokens")}
        if all(type(v) is int and v >= 0 for v in counts.values()):
            return out, {k: int(v) for k, v in counts.items() if v is not None}
        return out, None

    def completions(self, body: dict[str, Any]) -> list[tuple[str, str]]:
        """``POST /completions`` with ``body`` (``model``, ``prompt``, ``n``, sampling fields); returns
        ``(text, finish_reason)`` per choice, in index order."""
        return self.choices_and_usage("/completions", body)[0]

    def chat(self, body: dict[str, Any]) -> list[tuple[str, str]]:
        """``POST /chat/completions`` with ``body`` (``model``, ``messages``, ``n``, …); returns
        ``(content, finish_reason)`` per choice, in index order."""
        return self.choices_and_usage("/chat/completions", body)[0]

    def close(self) -> None:
        self._client.close()


class OpenAICompatibleGenerator:
    """Candidates from an OpenAI-compatible ``POST {base_url}/completions`` endpoint (vLLM, llama.cpp, ...),
    through :class:`OpenAICompatibleClient`.

    One request per prompt with ``n`` completions (split into requests of at most ``max_n_per_request``);
    ``seed`` is sent per request as ``seed + prompt_index`` (+ chunk offset), which vLLM honours, so reruns
    are reproducible on the same server. Transport errors, timeouts, 408/409/429 and 5xx answers are retried
    by the client (the ``openai`` SDK's policy, ``max_retries`` retries); then a :class:`GenerationError`
    (:class:`ServerUnreachableError` if nothing answered) is raised and nothing of that prompt is kept.

    Args:
      base_url: e.g. ``http://127.0.0.1:8000/v1``.
      model: The served model name.
      params: :class:`SamplingParams`.
      api_key: Sent as a bearer token if given.
      timeout: Seconds per request.
      max_retries: Retries per request.
      max_n_per_request: Largest ``n`` per request.
      progress: tqdm bar on stderr.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        params: SamplingParams | None = None,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 2,
        max_n_per_request: int = 128,
        progress: bool = True,
    ) -> None:
        self._client = OpenAICompatibleClient(
            base_url, api_key=api_key, timeout=timeout, max_retries=max_retries
        )
        self.base_url = self._client.base_url
        self.model_id = model
        self.params = params or SamplingParams()
        self.api_key = api_key
        self.timeout = float(timeout)
        self.max_retries = self._client.max_retries
        self.max_n_per_request = check_int(max_n_per_request, "max_n_per_request", low=1)
        self.progress = progress

    def format_prompt(self, prompt: str) -> str:
        return prompt

    def generate(
        self, prompts: Sequence[str], n: int, *, seed: int, prompt_indices: Sequence[int] | None = None
    ) -> list[list[Completion]]:
        n = check_int(n, "n", low=1)
        idxs = list(range(len(prompts))) if prompt_indices is None else [int(i) for i in prompt_indices]
        p = self.params
        out: list[list[Completion]] = []
        with _progress(n * len(prompts), "generate[http]", self.progress) as bar:
            for prompt, pi in zip(prompts, idxs):
                comps: list[Completion] = []
                for s in range(0, n, self.max_n_per_request):
                    k = min(self.max_n_per_request, n - s)
                    payload = {
                        "model": self.model_id,
                        "prompt": prompt,
                        "n": k,
                        "max_tokens": p.max_new_tokens,
                        "temperature": p.temperature,
                        "top_p": p.top_p,
                        "seed": candidate_seed(seed, pi, s) % (2**31),
                    }
                    if p.top_k:
                        payload["top_k"] = p.top_k
                    if p.stop:
                        payload["stop"] = list(p.stop)
                    for text, finish in self._client.completions(payload):
                        text, _ = _apply_stop(text, p.stop)
                        comps.append(Completion(text=text, num_tokens=-1, finish_reason=finish))
                    bar.update(k)
                out.append(comps)
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "openai",
            "base_url": self.base_url,
            "model": self.model_id,
            "sampling": self.params.to_dict(),
            "max_n_per_request": self.max_n_per_request,
        }

    def close(self) -> None:
        self._client.close()
