"""Generators: SmolLM2 offline, seeding/batch invariance on a tiny local model, the OpenAI-compatible client
against an in-process fake server on 127.0.0.1, and bad input."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from _models_helpers import make_tiny_causal_lm

from privalign.errors import MissingDependencyError, PrivacyParameterError
from privalign.models.generators import (
    GenerationError,
    OpenAICompatibleGenerator,
    SamplingParams,
    TransformersGenerator,
    candidate_seed,
)


@pytest.fixture(scope="module")
def tiny_generator(tmp_path_factory):
    d = make_tiny_causal_lm(tmp_path_factory.mktemp("tinylm"))
    return TransformersGenerator(
        str(d), params=SamplingParams(max_new_tokens=6, top_k=50), batch_size=4, progress=False
    )


@pytest.mark.model
def test_smollm2_loads_offline_and_generates(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    g = TransformersGenerator(params=SamplingParams(max_new_tokens=4), batch_size=2, progress=False)
    assert "SmolLM2-135M-Instruct" in g.model_id
    out = g.generate(["The movie was"], 2, seed=0)
    assert len(out) == 1 and len(out[0]) == 2
    for c in out[0]:
        assert isinstance(c.text, str) and 1 <= c.num_tokens <= 4
    # the chat template of SmolLM2 is available offline
    g.chat_template = True
    assert "<|im_start|>user" in g.format_prompt("hi")


def test_candidate_seeds_are_distinct_and_stable():
    seeds = {candidate_seed(7, i, j) for i in range(20) for j in range(50)}
    assert len(seeds) == 1000
    assert candidate_seed(7, 3, 4) == candidate_seed(7, 3, 4)
    assert candidate_seed(7, 3, 4) != candidate_seed(8, 3, 4)


def test_same_seed_same_text_and_batch_invariance(tiny_generator):
    g = tiny_generator
    a = g.generate(["the film", "a story"], 6, seed=11)
    b = g.generate(["the film", "a story"], 6, seed=11)
    assert [[c.text for c in r] for r in a] == [[c.text for c in r] for r in b]
    # prompt 1 generated alone (same prompt index) gives the same candidates
    alone = g.generate(["a story"], 6, seed=11, prompt_indices=[1])
    assert [c.text for c in alone[0]] == [c.text for c in a[1]]
    # candidates do not depend on the batch they share (per-candidate torch.Generator)
    g.batch_size = 1
    try:
        one_by_one = g.generate(["the film"], 6, seed=11)
    finally:
        g.batch_size = 4
    assert [c.text for c in one_by_one[0]] == [c.text for c in a[0]]
    other = g.generate(["the film"], 6, seed=12)
    assert [c.text for c in other[0]] != [c.text for c in a[0]]


def test_bad_generator_input(tiny_generator, tmp_path):
    with pytest.raises(PrivacyParameterError, match="'n' parameter"):
        tiny_generator.generate(["x"], 0, seed=0)
    with pytest.raises(PrivacyParameterError, match="single string"):
        tiny_generator.generate("x", 2, seed=0)
    with pytest.raises(PrivacyParameterError, match="temperature"):
        SamplingParams(temperature=0.0)
    with pytest.raises(PrivacyParameterError, match="top_p"):
        SamplingParams(top_p=1.5)
    with pytest.raises(MissingDependencyError, match="does not exist"):
        TransformersGenerator(str(tmp_path / "nope"), progress=False)


# ----------------------------------------------------------------------------------------------
# OpenAI-compatible client against a fake server on loopback
# ----------------------------------------------------------------------------------------------
class _FakeHandler(BaseHTTPRequestHandler):
    fail_first = 0
    calls: list = []

    def log_message(self, *args):  # keep test output clean
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append(body)
        if type(self).fail_first > 0:
            type(self).fail_first -= 1
            self.send_response(503)
            self.send_header("retry-after-ms", "5")  # the SDK honours it: keeps the retries fast
            self.send_header("Content-Length", "10")
            self.end_headers()
            self.wfile.write(b"overloaded")
            return
        if self.path != "/v1/completions":
            self.send_response(404)
            self.end_headers()
            return
        choices = [
            {"index": i, "text": f" {body['prompt']}|{body['seed']}|{i} END tail", "finish_reason": "stop"}
            for i in reversed(range(body["n"]))
        ]
        data = json.dumps({"object": "text_completion", "choices": choices}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def fake_server():
    _FakeHandler.calls = []
    _FakeHandler.fail_first = 0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _FakeHandler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_openai_client_n_per_request_order_and_stop(fake_server):
    g = OpenAICompatibleGenerator(
        fake_server,
        "fake-model",
        params=SamplingParams(max_new_tokens=8, stop=("END",)),
        max_n_per_request=3,
        progress=False,
    )
    out = g.generate(["p0", "p1"], 5, seed=4)
    assert [len(r) for r in out] == [5, 5]
    # two requests per prompt (3 + 2), choices put back in index order, stop string applied
    assert [c["n"] for c in _FakeHandler.calls] == [3, 2, 3, 2]
    assert out[0][0].text.startswith(" p0|") and out[0][0].text.endswith("|0 ")
    assert all("END" not in c.text for r in out for c in r)
    assert _FakeHandler.calls[0]["max_tokens"] == 8 and _FakeHandler.calls[0]["stop"] == ["END"]
    again = g.generate(["p0", "p1"], 5, seed=4)
    assert [[c.text for c in r] for r in again] == [[c.text for c in r] for r in out]


def test_openai_client_retries_then_fails_cleanly(fake_server):
    _FakeHandler.fail_first = 2
    g = OpenAICompatibleGenerator(fake_server, "m", max_retries=2, progress=False)
    assert len(g.generate(["x"], 2, seed=0)[0]) == 2
    assert len(_FakeHandler.calls) == 3
    _FakeHandler.fail_first = 10
    _FakeHandler.calls = []
    g2 = OpenAICompatibleGenerator(fake_server, "m", max_retries=1, progress=False)
    with pytest.raises(GenerationError, match="HTTP 503 from .*/completions: overloaded") as ei:
        g2.generate(["x"], 2, seed=0)
    assert len(_FakeHandler.calls) == 2  # one retry, one retry loop
    assert "\n" not in str(ei.value) and ei.value.__cause__ is None and ei.value.__suppress_context__


def test_openai_client_unreachable_server_is_one_line():
    """Nothing listens on the port: the SDK retries, then one ServerUnreachableError with a one-line
    message and no chained traceback; the service's upstream generator turns it into one UpstreamError."""
    from privalign.models.generators import OpenAICompatibleClient, ServerUnreachableError
    from privalign.service.components import UpstreamError, UpstreamGenerator

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connection refused
    url = f"http://127.0.0.1:{port}/v1"
    g = OpenAICompatibleGenerator(url, "m", max_retries=0, timeout=2.0, progress=False)
    with pytest.raises(ServerUnreachableError) as ei:
        g.generate(["x"], 2, seed=0)
    msg = str(ei.value)
    assert msg == f"the OpenAI-compatible server at {url} is unreachable (1 attempts)"
    assert (
        ei.value.__cause__ is None and ei.value.__suppress_context__ and isinstance(ei.value, GenerationError)
    )
    with pytest.raises(
        UpstreamError,
        match=f"^upstream generator failed: the OpenAI-compatible server at {url} is unreachable",
    ):
        UpstreamGenerator(url, timeout_s=2.0, max_retries=0)(
            "hi", 2, max_tokens=4, temperature=1.0, top_p=1.0, chat=True
        )
    with pytest.raises(PrivacyParameterError, match="base_url"):
        OpenAICompatibleClient("127.0.0.1:8000")
    with pytest.raises(PrivacyParameterError, match="max_retries"):
        OpenAICompatibleClient(url, max_retries=-1)


def test_gguf_progress_silences_the_gguf_loaders_own_bar():
    """--no-progress reaches transformers' GGUF tensor-conversion bar (a tqdm the HF switch does not
    govern); the bar is restored afterwards, and left alone when progress is on."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    from privalign.models.generators import gguf_progress

    bar = gguf_utils.tqdm
    with gguf_progress(False):
        assert gguf_utils.tqdm([1, 2]).disable
    assert gguf_utils.tqdm is bar
    with gguf_progress(True):
        assert gguf_utils.tqdm is bar


def test_align_keeps_the_bar_but_not_the_per_step_dicts(capsys):
    """align's bar stays; the per-step log dicts that TRL logs at every step are not written under it."""
    from transformers.trainer_callback import ProgressCallback, TrainerControl, TrainerState

    from privalign.rlhf.train import quiet_progress_callback

    cb = quiet_progress_callback()()
    assert isinstance(cb, ProgressCallback)
    state = TrainerState()
    cb.training_bar = type("Bar", (), {"write": lambda self, s: print(s)})()
    cb.on_log(None, state, TrainerControl(), logs={"loss": 0.5, "reward": 1.0})
    assert capsys.readouterr().out == ""
    ProgressCallback.on_log(cb, None, state, TrainerControl(), logs={"loss": 0.5})
    assert "loss" in capsys.readouterr().out  # the negative control: the stock callback writes it
