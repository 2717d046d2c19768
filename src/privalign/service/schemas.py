"""Request schemas of the service: strict JSON types, encodable text, no silent defaults.

Validation happens before authentication and before any reservation, so nothing here can cost budget:

* **strict types**: a number field refuses ``true``/``false`` and strings; an integer field refuses
  ``2.0``; a string field refuses numbers; ``NaN``/``Infinity`` literals are refused;
* **encodable text**: every string must be valid Unicode (a JSON-escaped lone surrogate such as
  ``"\\ud800"`` parses but cannot be encoded as UTF-8): refused with a 400 naming the field, so an answer
  can always be encoded once a candidate has been privately selected;
* **OpenAI parameters**: ``temperature``, ``top_p``, ``max_tokens``/``max_completion_tokens`` and
  ``stream`` are honoured; ``n`` must be 1; parameters that would change the output but are not
  implemented (``stop``, ``logit_bias``, ``tools`` …) are refused with a 400 naming them instead of being
  ignored. Message content may be a string or an array of ``{"type": "text", "text": …}`` parts.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

__all__ = [
    "Text",
    "Real",
    "PrivacyParams",
    "ContentPart",
    "ChatMessage",
    "ChatCompletionRequest",
    "CompletionRequest",
    "SelectRequest",
    "UNSUPPORTED_OPENAI_PARAMS",
]


def _encodable(v: str) -> str:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            "must be valid Unicode text (a lone surrogate code point such as \\ud800 cannot be encoded)"
        ) from None
    return v


#: A string that can be encoded as UTF-8 (no lone surrogates); numbers are not coerced.
Text = Annotated[StrictStr, AfterValidator(_encodable)]
#: A finite real number; ``true``/``false`` and strings are refused (integers are accepted).
Real = Annotated[float, Field(strict=True, allow_inf_nan=False)]

_STRICT = ConfigDict(strict=True, allow_inf_nan=False)

#: OpenAI request parameters that would change the answer but are not implemented: refused when set.
UNSUPPORTED_OPENAI_PARAMS = (
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "response_format",
    "best_of",
    "echo",
    "suffix",
    "audio",
    "modalities",
    "prediction",
)


class PrivacyParams(BaseModel):
    """The ``privacy`` object of a request. Unknown fields are refused (a typo must not silently fall
    back to a default); ``seed`` is refused explicitly. Ranges are checked against the server's public
    bounds by :func:`privalign.service.plan.make_plan`, before any reservation."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    method: str | None = Field(
        None,
        max_length=64,
        description="Selection method (one of the server's privacy.allowed_methods: privbon, privitp, bon).",
    )
    epsilon: Real | None = Field(
        None, gt=0, description="Per-request ε (PrivBoN: the exponential mechanism's ε)."
    )
    n: StrictInt | None = Field(
        None, ge=1, description="Number of candidates to generate (completions endpoints)."
    )
    beta: Real | None = Field(None, gt=0, description="PrivITP: KL temperature β.")
    sigma_x: Real | None = Field(None, gt=0, description="PrivITP: phase-1 Gaussian noise σ_X.")
    sigma_z: Real | None = Field(None, gt=0, description="PrivITP: phase-2 Gaussian noise σ_Z.")
    seed: Any | None = Field(None, description="Refused: the service uses secure noise only.")

    @classmethod
    def method_fields(cls) -> tuple[str, ...]:
        """The fields that are a method's parameters (each method declares which it takes)."""
        return tuple(k for k in cls.model_fields if k not in ("method", "epsilon", "n", "seed"))


class ContentPart(BaseModel):
    """One part of a message's content array; only text parts are supported."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Text = Field(..., max_length=64)
    content: Text | list[ContentPart] = Field(..., description="A string, or an array of text parts.")
    name: Text | None = Field(None, max_length=200)

    def text(self) -> str:
        """The content as one string (text parts joined without separator, as OpenAI does)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class _OpenAIBase(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    model: Text = Field("privalign", max_length=200)
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    temperature: Real | None = Field(None, ge=0, le=2)
    top_p: Real | None = Field(None, gt=0, le=1)
    n: StrictInt | None = Field(None, ge=1, description="Number of returned choices; only 1 is supported.")
    stream: StrictBool | None = None
    stream_options: dict[str, Any] | None = None
    seed: Any | None = Field(None, description="Refused: the service uses secure noise only.")
    user: Text | None = Field(None, max_length=500)
    privacy: PrivacyParams | None = None
    # Set to refuse them by name (never silently ignored).
    stop: Any | None = None
    presence_penalty: Any | None = None
    frequency_penalty: Any | None = None
    logit_bias: Any | None = None
    logprobs: Any | None = None
    top_logprobs: Any | None = None
    tools: Any | None = None
    tool_choice: Any | None = None
    functions: Any | None = None
    function_call: Any | None = None
    response_format: Any | None = None
    best_of: Any | None = None
    echo: Any | None = None
    suffix: Any | None = None
    audio: Any | None = None
    modalities: Any | None = None
    prediction: Any | None = None


class ChatCompletionRequest(_OpenAIBase):
    messages: list[ChatMessage] = Field(..., min_length=1, max_length=256)


class CompletionRequest(_OpenAIBase):
    prompt: Text


class SelectRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    prompt: Text
    candidates: list[Text] = Field(..., min_length=1)
    privacy: PrivacyParams | None = None
