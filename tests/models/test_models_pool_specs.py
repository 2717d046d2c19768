"""The library functions behind ``privalign build-pool``: the generator spec (whose fields feed a pool's
resume fingerprint, so they must not change) and the prompts with their recorded dataset options."""

import pytest

from privalign.errors import PrivacyParameterError
from privalign.pipeline.steps import generator_spec

SAMPLING = {"max_new_tokens": 16, "temperature": 1.0, "top_k": 0, "top_p": 1.0}


def test_local_specs_have_exactly_the_fields_pools_were_built_with():
    common = {
        "model": "smollm2",
        "batch_size": 8,
        "chat_template": True,
        "assistant_prefix": "",
        "sampling": SAMPLING,
        "stop": ["\n\n"],
        "num_threads": 2,
    }
    kw = dict(model=None, sampling=SAMPLING, stop=("\n\n",), batch_size=8, chat_template=True, num_threads=2)
    assert generator_spec("transformers", **kw, compute_type="int8", reseed_block=4) == {
        "kind": "transformers",
        **common,
    }
    assert generator_spec("ctranslate2", **kw, compute_type="int8") == {
        "kind": "ctranslate2",
        **common,
        "compute_type": "int8",
    }
    block = generator_spec("ctranslate2", **kw, compute_type="int8", reseed_block=4)
    assert block == {
        "kind": "ctranslate2",
        **common,
        "compute_type": "int8",
        "reseed": "block",
        "reseed_block": 4,
    }


def test_remote_specs():
    assert generator_spec("openai", model="m", sampling=SAMPLING, base_url="http://x/v1", batch_size=8) == {
        "kind": "openai",
        "base_url": "http://x/v1",
        "model": "m",
        "sampling": SAMPLING,
        "stop": [],
    }
    assert generator_spec("vllm", model="m", sampling=SAMPLING, stop=["x"]) == {
        "kind": "vllm",
        "model": "m",
        "sampling": SAMPLING,
        "stop": ["x"],
    }
    with pytest.raises(PrivacyParameterError, match="'generator'"):
        generator_spec("llama", model="m")


def test_pool_prompts_record_their_dataset_options():
    from privalign.pipeline.build_pool import load_pool_prompts

    examples, opts = load_pool_prompts("imdb", num_prompts=3, prompt_words=5)
    assert len(examples) == 3 and opts == {"num_words": 5}
    assert all(len(e.prompt.split()) <= 5 for e in examples)
    examples, opts = load_pool_prompts("gsm8k", num_prompts=3)
    assert opts == {} and len(examples) >= 3
