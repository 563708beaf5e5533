"""BERT's uncased WordPiece tokenizer, rebuilt so the builtin model needs nothing beyond numpy.

It reproduces what sentence-transformers runs for all-MiniLM-L6-v2 (the Rust ``BertNormalizer``,
``BertPreTokenizer`` and ``WordPiece`` of the ``tokenizers`` library), in that order:

1. clean: drop NUL, U+FFFD and control characters (categories Cc, Cf, Co, Cs; *not* Cn), and turn
   every Unicode White_Space character (plus \\t \\n \\r, which are Cc) into a space;
2. pad CJK ideographs with spaces so each becomes its own word;
3. strip accents (NFD, drop Mn), then lowercase one character at a time (so a final 'Σ' becomes
   'σ', not the 'ς' that ``str.lower`` would give for the whole string);
4. split on spaces, and around every punctuation character (ASCII symbols and Unicode P*);
5. greedy longest-match-first WordPiece with ``##`` continuations; a word longer than 100 characters,
   or one that cannot be covered by vocabulary pieces, becomes a single ``[UNK]``.

Any divergence moves vectors, so tests pin the ids against the reference tokenizer.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

__all__ = ["WordPieceTokenizer"]

MAX_WORD_CHARS = 100

# The Unicode White_Space property (Python's str.isspace also counts U+001C..U+001F).
_WHITESPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _cleaned(char: str) -> str:
    """What step 1 and 2 turn one character into: '', ' ', ' x ' or the character itself."""
    if char in "\t\n\r":
        return " "
    if char in "\x00\ufffd" or unicodedata.category(char) in ("Cc", "Cf", "Co", "Cs"):
        return ""
    if char in _WHITESPACE:
        return " "
    code = ord(char)
    if any(low <= code <= high for low, high in _CJK_RANGES):
        return f" {char} "
    return char


@functools.lru_cache(maxsize=4096)
def _is_punctuation(char: str) -> bool:
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _normalise(text: str) -> str:
    text = "".join(_cleaned(char) for char in text)
    if text.isascii():  # nothing to decompose, and ASCII lowercasing has no context
        return text.lower()
    text = unicodedata.normalize("NFD", text)
    return "".join(char.lower() for char in text if unicodedata.category(char) != "Mn")


def _words(text: str) -> list[str]:
    """Whitespace-separated words, with each punctuation character split off as its own word."""
    words: list[str] = []
    for chunk in _normalise(text).split(" "):
        start = 0
        for i, char in enumerate(chunk):
            if _is_punctuation(char):
                if start < i:
                    words.append(chunk[start:i])
                words.append(char)
                start = i + 1
        if start < len(chunk):
            words.append(chunk[start:])
    return words


class WordPieceTokenizer:
    """Text to BERT input ids; immutable after construction, so safe to share between threads."""

    def __init__(self, vocab: Mapping[str, int], max_seq_length: int = 256) -> None:
        self.vocab = dict(vocab)
        self.max_seq_length = max_seq_length
        self.cls_id = self.vocab["[CLS]"]
        self.sep_id = self.vocab["[SEP]"]
        self.pad_id = self.vocab["[PAD]"]
        self.unk_id = self.vocab["[UNK]"]
        # lru_cache is thread-safe; wrapping per instance keeps the cache tied to this vocabulary.
        self._word_ids = functools.lru_cache(maxsize=65536)(self._word_ids_uncached)

    @classmethod
    def from_file(cls, path: Path, max_seq_length: int = 256) -> WordPieceTokenizer:
        """Read a ``vocab.txt``: one token per line, the line number is the id."""
        lines = Path(path).read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return cls({token: i for i, token in enumerate(lines)}, max_seq_length)

    def _word_ids_uncached(self, word: str) -> tuple[int, ...]:
        if len(word) > MAX_WORD_CHARS:
            return (self.unk_id,)
        ids: list[int] = []
        start = 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    start = end
                    break
            else:
                return (self.unk_id,)
        return tuple(ids)

    def tokenize(self, text: str) -> list[int]:
        """WordPiece ids of ``text``, without special tokens or truncation."""
        return [i for word in _words(text) for i in self._word_ids(word)]

    def encode(self, text: str) -> list[int]:
        """``[CLS] ids [SEP]``, truncated to ``max_seq_length`` ids in total."""
        return [self.cls_id, *self.tokenize(text)[: self.max_seq_length - 2], self.sep_id]

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Padded ids and attention mask, both int64 of shape (len(texts), longest)."""
        return self.pad([self.encode(text) for text in texts])

    def pad(self, encoded: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Already encoded rows, right-padded with ``[PAD]`` into ids and attention mask."""
        width = max((len(row) for row in encoded), default=0)
        ids = np.full((len(encoded), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encoded), width), dtype=np.int64)
        for i, row in enumerate(encoded):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        return ids, mask
