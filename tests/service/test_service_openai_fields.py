"""Issue 26, item 4: OpenAI fields that tell the truth, checked with the official ``openai`` client against
the real app on uvicorn (in a thread).

* ``usage``: the generator's token counts (the prompt once, every candidate's generated tokens together;
  ``selected_completion_tokens`` for the returned one when known), ``null`` when the generator did not
  count;
* ``finish_reason``: ``length`` when the selected candidate was cut at ``max_tokens``, ``stop`` when it
  ended by itself;
* streaming: the selected answer in word-sized chunks, the finish reason on the finish chunk, and the
  usage chunk when ``stream_options.include_usage`` is set.

The upstream test server (``svc_components.make_upstream_app``) counts whitespace-separated words as tokens.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from svc_components import candidates_for
from test_service_http import _cfg

from conftest import serve_in_thread
from privalign.models.generators import Completion
from privalign.service.app import create_app
from privalign.service.components import Generation
from privalign.service.keys import create_key
from privalign.service.streaming import pieces


def _words(text: str) -> int:
    return len(text.split())


@pytest.fixture
def svc(tmp_path, reward_model, upstream):
    app = create_app(_cfg(tmp_path, reward_model, upstream))
    with serve_in_thread(app) as url:
        _, token = create_key(app.state.service.engine, budget_epsilon=20.0)
        yield openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0), url, token


def test_usage_and_finish_reason_come_from_the_upstream_generator(svc):
    client, _, _ = svc
    prompt = "Say something nice"
    cands = candidates_for(prompt, 4)
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": prompt}],
        extra_body={"privacy": {"epsilon": 0.5, "n": 4}},
    )
    assert r.choices[0].message.content in cands and r.choices[0].finish_reason == "stop"
    # the prompt once, the completion tokens of all 4 candidates together (the upstream's own usage)
    assert r.usage.prompt_tokens == 3
    assert r.usage.completion_tokens == sum(_words(c) for c in cands) > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    # an OpenAI-compatible upstream counts n > 1 choices only together: the returned one's count is unknown
    assert "selected_completion_tokens" not in (r.usage.model_extra or {})

    # cut at max_tokens: finish_reason "length", the first 3 words of a candidate
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=3,
        extra_body={"privacy": {"epsilon": 0.5, "n": 4}},
    )
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.content in [" ".join(c.split()[:3]) for c in cands]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (3, 12, 15)

    # text completions, one candidate: its own count is the upstream's completion count
    c = client.completions.create(
        model="m", prompt=prompt, max_tokens=2, extra_body={"privacy": {"epsilon": 0.5, "n": 1}}
    )
    assert c.choices[0].finish_reason == "length" and _words(c.choices[0].text) == 2
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) == (3, 2, 5)
    assert c.usage.model_extra["selected_completion_tokens"] == 2
    c = client.completions.create(model="m", prompt=prompt, extra_body={"privacy": {"epsilon": 0.5, "n": 1}})
    assert c.choices[0].finish_reason == "stop" and c.choices[0].text == candidates_for(prompt, 1)[0]
    assert (
        c.usage.completion_tokens
        == c.usage.model_extra["selected_completion_tokens"]
        == _words(c.choices[0].text)
    )


def test_streaming_sends_the_selected_answer_in_word_chunks_with_finish_reason_and_usage(svc):
    client, _, _ = svc
    prompt = "Say something nice"
    cands = candidates_for(prompt, 3)
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": prompt}],
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=5,
            extra_body={"privacy": {"epsilon": 0.5, "n": 3}},
        )
    )
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c.choices[0].delta.content for c in chunks[1:] if c.choices and c.choices[0].delta.content]
    text = "".join(content)
    assert text in [" ".join(c.split()[:5]) for c in cands]
    assert len(content) == 5  # one chunk per word, not the whole answer in one
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "length"
    assert finish[0].model_extra["privacy"]["charged"] == 0.5
    # include_usage: "usage": null on every chunk but the last, which has no choices and the usage
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (3, 15, 18)

    # without include_usage: no usage chunk; text completions stream per word too, async client included
    async def go():
        ac = openai.AsyncOpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
        stream = await ac.completions.create(
            model="m", prompt=prompt, stream=True, extra_body={"privacy": {"epsilon": 0.5, "n": 2}}
        )
        out = [c async for c in stream]
        await ac.close()
        return out

    out = asyncio.run(go())
    assert all(c.object == "text_completion" and c.usage is None and len(c.choices) == 1 for c in out)
    text = "".join(c.choices[0].text for c in out)
    assert text in candidates_for(prompt, 2)
    assert len(out) == _words(text) + 1  # one chunk per word, then the finish chunk
    assert [c.choices[0].finish_reason for c in out] == [None] * _words(text) + ["stop"]


def test_stream_options_include_usage_must_be_a_boolean(svc):
    _, url, token = svc
    r = httpx.post(
        url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {token}"},
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": "yes"},
            "privacy": {"epsilon": 0.5},
        },
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options.include_usage"


class MixedGenerator:
    """Candidates with their own token counts: even ones cut at max_tokens, odd ones ended by themselves."""

    def __call__(self, prompt, n, *, max_tokens, **kw):
        cands = [
            Completion(f"cut {i}", num_tokens=max_tokens, finish_reason="length")
            if i % 2 == 0
            else Completion(f"done {i}", num_tokens=i, finish_reason="stop")
            for i in range(n)
        ]
        return Generation(cands, prompt_tokens=7, completion_tokens=sum(c.num_tokens for c in cands))


def test_finish_reason_and_usage_are_the_selected_candidates(tmp_path, reward_model):
    app = create_app(_cfg(tmp_path, reward_model), generator=MixedGenerator())
    _, token = create_key(app.state.service.engine, budget_epsilon=10.0)
    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0)
        seen = set()
        for _ in range(20):  # ε = 0.01 over equal scores: each kind is selected about half the time
            r = client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=9,
                extra_body={"privacy": {"epsilon": 0.01, "n": 4}},
            )
            kind, i = r.choices[0].message.content.split()
            expect = ("length", 9) if kind == "cut" else ("stop", int(i))
            assert (r.choices[0].finish_reason, r.usage.model_extra["selected_completion_tokens"]) == expect
            assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (7, 9 + 1 + 9 + 3)
            seen.add(kind)
    assert seen == {"cut", "done"}


def test_a_generator_that_does_not_count_gives_usage_null(tmp_path, reward_model):
    app = create_app(_cfg(tmp_path, reward_model), generator=lambda prompt, n, **kw: candidates_for("p", n))
    _, token = create_key(app.state.service.engine, budget_epsilon=1.0)
    with serve_in_thread(app) as url:
        r = httpx.post(
            url + "/v1/completions",
            headers={"Authorization": f"Bearer {token}"},
            json={"prompt": "p", "privacy": {"epsilon": 0.5, "n": 2}},
        )
    assert r.status_code == 200 and r.json()["usage"] is None  # unknown, not 0/0/0
    assert r.json()["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("text", ["", "one", "  lead and  trail \n", "a\nb\tc", "Grüße, 世界!"])
def test_pieces_cut_text_into_words_that_join_back(text):
    ps = pieces(text)
    assert "".join(ps) == text and len(ps) == len(text.split()) + (1 if text[-1:].isspace() else 0)


@pytest.mark.model
@pytest.mark.parametrize("kind", ["transformers", "ctranslate2"])
def test_smollm2_usage_counts_tokens_and_a_cut_answer_finishes_with_length(tmp_path, reward_model, kind):
    """SmolLM2 (offline) through the local generator: real token counts, and ``length`` at max_tokens=3."""
    from dataclasses import replace

    from privalign.service.config import ComponentConfig

    cfg = _cfg(tmp_path, reward_model)
    cfg = replace(
        cfg,
        generator=ComponentConfig(kind=kind, options={"max_new_tokens": 8}),
        limits=replace(cfg.limits, request_timeout_s=600.0),
    )
    app = create_app(cfg)
    _, token = create_key(app.state.service.engine, budget_epsilon=1.0)
    prompt = "Write a long story about a dragon who learns to bake bread."
    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0, timeout=300)
        r = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=3,
            extra_body={"privacy": {"epsilon": 0.5, "n": 2}},
        )
    gen = next(iter(app.state.service.generator._gens.values()))
    assert r.choices[0].finish_reason == "length"
    assert r.usage.model_extra["selected_completion_tokens"] == 3
    assert 3 <= r.usage.completion_tokens <= 6  # both candidates, each at most 3 tokens
    # the prompt as the generator fed it: one user message "user: <content>" in SmolLM2's chat template
    ids = gen.tokenizer.apply_chat_template(
        [{"role": "user", "content": f"user: {prompt}"}], tokenize=True, add_generation_prompt=True
    )
    ids = ids if isinstance(ids, list) else ids["input_ids"]  # a BatchEncoding in newer transformers
    assert r.usage.prompt_tokens == len(ids) > len(prompt.split())
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


# ------------------------------------------------------------------------------------------------
# Issue 36, item 5: the answer's ``model`` is the served model that ``GET /v1/models`` lists, and every
# error body has OpenAI's shape with a documented, non-null ``code``.
# ------------------------------------------------------------------------------------------------


def test_answers_name_the_served_model_whatever_the_request_named(svc):
    client, url, token = svc
    served = [m.id for m in client.models.list()]
    assert served == ["m"]  # the upstream generator's model option
    kw = {"extra_body": {"privacy": {"epsilon": 0.25, "n": 2}}}
    for asked in ("gpt-x", "m", "privalign"):
        r = client.chat.completions.create(model=asked, messages=[{"role": "user", "content": "hi"}], **kw)
        assert r.model == "m", asked
        c = client.completions.create(model=asked, prompt="hi", **kw)
        assert c.model == "m", asked
        chunks = list(
            client.chat.completions.create(
                model=asked, messages=[{"role": "user", "content": "hi"}], stream=True, **kw
            )
        )
        assert {ch.model for ch in chunks} == {"m"}, asked
    # an Idempotency-Key replay is the stored answer: the served model too
    h = {"Authorization": f"Bearer {token}", "Idempotency-Key": "model-1"}
    body = {"model": "gpt-x", "prompt": "hi", "privacy": {"epsilon": 0.25, "n": 2}}
    r1, r2 = (httpx.post(url + "/v1/completions", headers=h, json=body) for _ in range(2))
    assert r2.headers.get("idempotent-replayed") == "true" and r1.json()["model"] == r2.json()["model"] == "m"


def test_without_a_model_option_the_answer_names_privalign_as_v1_models_does(tmp_path, reward_model):
    app = create_app(_cfg(tmp_path, reward_model), generator=lambda prompt, n, **kw: candidates_for("p", n))
    _, token = create_key(app.state.service.engine, budget_epsilon=1.0)
    with serve_in_thread(app) as url:
        listed = httpx.get(url + "/v1/models").json()["data"]
        r = httpx.post(
            url + "/v1/completions",
            headers={"Authorization": f"Bearer {token}"},
            json={"model": "gpt-x", "prompt": "p", "privacy": {"epsilon": 0.5, "n": 2}},
        )
    assert [m["id"] for m in listed] == ["privalign"] and r.json()["model"] == "privalign", r.text
