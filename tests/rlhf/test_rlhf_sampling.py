"""``sample_with_logprobs`` (batched sampling, policy log-probabilities read off the sampler's logits,
reference log-probabilities on the completion positions only) against a direct per-prompt oracle: the
pre-batching implementation (one ``generate`` per prompt, then a full forward pass of each model over the
whole sequence and a log-softmax over the vocabulary), on a tiny random Llama (no download)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _util import tiny_char_llama  # noqa: E402
from privalign.rlhf.evaluate import sample_with_logprobs  # noqa: E402


def tiny_base(seed: int):
    """A randomly initialised two-layer Llama and a character tokenizer (tests/_util.py)."""
    return tiny_char_llama(layers=2, seed=seed)


# prompts of different lengths, so batches are left-padded
PROMPTS = ["a", "great film, ", "the plot was dull and", "why?", "ok ok ok ok ok ok ok ok ok ok"]


def _oracle(model, tok, prompts, n, *, max_new_tokens, seed, reference=None):
    """The per-prompt implementation that batching replaced (kept verbatim in spirit: a row's generator is
    seeded by candidate_seed(seed, i, j); log-probabilities from full forward passes)."""
    from transformers import LogitsProcessorList

    from privalign.models.generators.base import SamplingParams, _RowSampler, candidate_seed

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, top_k=0, top_p=1.0)
    eos_set = {model.generation_config.eos_token_id or tok.eos_token_id}
    texts, lp, lpr, ntok = (
        [],
        np.zeros((len(prompts), n)),
        np.zeros((len(prompts), n)),
        np.zeros((len(prompts), n), int),
    )
    model.eval()
    for i, prompt in enumerate(prompts):
        gens = [torch.Generator().manual_seed(candidate_seed(seed, i, j)) for j in range(n)]
        enc = tok([prompt] * n, return_tensors="pt")
        L = enc["input_ids"].shape[1]
        with torch.inference_mode():
            out = model.generate(
                input_ids=enc["input_ids"],
                attention_mask=enc["attention_mask"],
                do_sample=False,
                max_new_tokens=max_new_tokens,
                num_beams=1,
                pad_token_id=tok.pad_token_id,
                eos_token_id=list(eos_set),
                logits_processor=LogitsProcessorList([_RowSampler(torch, gens, params)]),
            )
            new = out[:, L:]
            mask = torch.ones_like(new, dtype=torch.bool)
            row = []
            for r in range(new.shape[0]):
                ids = new[r].tolist()
                k = next((t for t, v in enumerate(ids) if v in eos_set), None)
                if k is not None:
                    mask[r, k + 1 :] = False
                ntok[i, r] = len(ids) if k is None else k
                row.append(tok.decode(ids[: ntok[i, r]], skip_special_tokens=True))
            texts.append(row)
            attn = torch.cat([enc["attention_mask"], mask.long()], dim=1)
            for m, dst in ((model, lp), (reference, lpr)):
                if m is None:
                    continue
                logits = m(input_ids=out, attention_mask=attn).logits[:, L - 1 : -1].float()
                logp = torch.log_softmax(logits, dim=-1).gather(-1, new[..., None])[..., 0]
                dst[i] = (logp * mask).sum(dim=1).numpy()
    return {
        "texts": texts,
        "logp": lp,
        "logp_ref": lpr if reference is not None else None,
        "num_tokens": ntok,
    }


@pytest.fixture(scope="module")
def models():
    policy, tok = tiny_base(seed=1)
    reference, _ = tiny_base(seed=2)  # a different model, so logp and logp_ref differ
    return policy, reference, tok


@pytest.mark.parametrize("batch_rows,reference_rows", [(1, 1), (3, 2), (64, 16)])
def test_batched_sampling_matches_the_per_prompt_oracle(models, batch_rows, reference_rows):
    policy, reference, tok = models
    kw = dict(max_new_tokens=12, seed=7)
    want = _oracle(policy, tok, PROMPTS, 3, reference=reference, **kw)
    got = sample_with_logprobs(
        policy,
        tok,
        PROMPTS,
        3,
        reference=reference,
        batch_rows=batch_rows,
        reference_rows=reference_rows,
        **kw,
    )
    assert got["texts"] == want["texts"]  # the same draws: each row has its own generator
    np.testing.assert_array_equal(got["num_tokens"], want["num_tokens"])
    np.testing.assert_allclose(got["logp"], want["logp"], rtol=0, atol=1e-4)
    np.testing.assert_allclose(got["logp_ref"], want["logp_ref"], rtol=0, atol=1e-4)
    assert np.all(got["logp"] < 0) and not np.allclose(got["logp"], got["logp_ref"], atol=1e-2)


def test_eos_ends_a_row_and_is_counted(models):
    """A row that samples EOS stops there: its text excludes it, num_tokens counts the tokens before it, and
    its log-probability includes the EOS (and nothing after it), as the oracle's."""
    policy, reference, tok = models
    kw = dict(max_new_tokens=10, seed=3)
    want = _oracle(policy, tok, PROMPTS, 4, reference=reference, **kw)
    got = sample_with_logprobs(policy, tok, PROMPTS, 4, reference=reference, batch_rows=8, **kw)
    assert 0 < (want["num_tokens"] < 10).mean() < 1  # some rows stopped early (batches hold finished rows)
    assert got["texts"] == want["texts"]
    np.testing.assert_array_equal(got["num_tokens"], want["num_tokens"])
    np.testing.assert_allclose(got["logp"], want["logp"], rtol=0, atol=1e-4)
    np.testing.assert_allclose(got["logp_ref"], want["logp_ref"], rtol=0, atol=1e-4)


def test_without_reference_and_argument_checks(models):
    policy, _, tok = models
    got = sample_with_logprobs(policy, tok, PROMPTS[:2], 2, max_new_tokens=4, seed=0)
    assert got["logp_ref"] is None and got["logp"].shape == (2, 2) and len(got["texts"]) == 2
    from privalign.errors import PrivacyParameterError

    with pytest.raises(PrivacyParameterError, match="batch_rows"):
        sample_with_logprobs(policy, tok, PROMPTS, 2, max_new_tokens=4, seed=0, batch_rows=0)
