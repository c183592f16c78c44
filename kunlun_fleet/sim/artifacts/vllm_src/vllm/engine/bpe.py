# SPDX-License-Identifier: Apache-2.0
"""Byte-level BPE, the tokenizer family of the Qwen models, in the standard library.

The small model directory carries a real byte-level BPE tokenizer.json (the format and
pipeline transformers' Qwen3_5Tokenizer builds: NFC, Qwen's pre-tokenizer regex, GPT-2
byte-to-unicode mapping, BPE merges, ByteLevel decoder), so any client loads it with
`AutoTokenizer.from_pretrained(model_dir)` and counts tokens exactly as the server does.

This module holds both halves:
- `train(words)`: the merges that make each word of a small vocabulary one token
  (classic BPE training, ties broken by the pair's text: deterministic);
- `Encoder`: counts and encodes tokens of a text with a tokenizer.json's merges and added
  tokens, and decodes ids, as the `tokenizers` library does (its ByteLevel decoder: the
  added tokens as their text, invalid UTF-8 as U+FFFD). Qwen's regex uses Unicode classes (\\p{L}, \\p{N},
  \\p{M}) that Python's `re` lacks: letters are `[^\\W\\d_]`, numbers `\\d`; identical for
  ASCII text, an approximation for rare scripts.
"""

import collections
import re
import unicodedata

# transformers' Qwen3_5Tokenizer / Qwen2Tokenizer pre-tokenizer (the `tokenizers` regex).
QWEN_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
    r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The same in Python's re (see the module's docstring).
_L = r"[^\W\d_]"
PRETOKENIZE = re.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    rf"|(?:[^\w\r\n]|_)?{_L}+"
    r"|\d"
    r"| ?(?:[^\s\w]|_)+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)


def bytes_to_unicode() -> dict:
    """GPT-2's reversible byte -> printable character map (byte-level BPE's alphabet)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


BYTE_CHARS = bytes_to_unicode()


def to_byte_level(text: str) -> str:
    return "".join(BYTE_CHARS[b] for b in text.encode("utf-8"))


def train(words) -> list:
    """Merges (pairs of symbols, in rank order) after which every word is one token."""
    seqs = [list(to_byte_level(w)) for w in sorted(set(words))]
    counts = collections.Counter()
    where = collections.defaultdict(set)
    for i, seq in enumerate(seqs):
        for pair in zip(seq, seq[1:], strict=False):
            counts[pair] += 1
            where[pair].add(i)
    merges = []
    while counts:
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        joined = best[0] + best[1]
        for i in sorted(where.pop(best, ())):
            seq = seqs[i]
            for pair in zip(seq, seq[1:], strict=False):
                counts[pair] -= 1
                if counts[pair] <= 0:
                    del counts[pair]
            out, j = [], 0
            while j < len(seq):
                if j + 1 < len(seq) and (seq[j], seq[j + 1]) == best:
                    out.append(joined)
                    j += 2
                else:
                    out.append(seq[j])
                    j += 1
            seqs[i] = out
            for pair in zip(out, out[1:], strict=False):
                counts[pair] += 1
                where[pair].add(i)
        counts.pop(best, None)
    return merges


def tokenizer_json(words, special_tokens) -> dict:
    """A tokenizer.json (the `tokenizers` format) of Qwen's pipeline over `words`."""
    vocab = {}
    for ch in BYTE_CHARS.values():
        vocab.setdefault(ch, len(vocab))
    merges = train(words)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    added = []
    for tok in special_tokens:
        vocab[tok] = len(vocab)
        added.append(
            {
                "id": vocab[tok],
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN_PRETOKENIZE_REGEX},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [[a, b] for a, b in merges],
        },
    }


class Encoder:
    """Token counts, ids and texts of a byte-level BPE tokenizer.json (model, merges, added tokens)."""

    def __init__(self, data: dict):
        model = data["model"]
        merges = model.get("merges") or []
        self.ranks = {}
        for rank, m in enumerate(merges):
            pair = tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
            self.ranks.setdefault(pair, rank)
        self.vocab = model.get("vocab") or {}
        self.added = {t["content"]: t["id"] for t in data.get("added_tokens") or []}
        specials = sorted(self.added, key=len, reverse=True)
        self.split = re.compile("(" + "|".join(map(re.escape, specials)) + ")") if specials else None
        self.cache = {}
        self.pieces = None  # id -> token string, built on the first decode

    def _symbols(self, piece: str) -> tuple:
        """The piece's byte-level symbols after the merges (each one token)."""
        seq = self.cache.get(piece)
        if seq is not None:
            return seq
        seq = list(to_byte_level(piece))
        while len(seq) > 1:
            ranked = [(self.ranks.get(p), i) for i, p in enumerate(zip(seq, seq[1:], strict=False)) if p in self.ranks]
            if not ranked:
                break
            best = seq[min(ranked)[1]], seq[min(ranked)[1] + 1]
            out, j = [], 0
            while j < len(seq):
                if j + 1 < len(seq) and (seq[j], seq[j + 1]) == best:
                    out.append(seq[j] + seq[j + 1])
                    j += 2
                else:
                    out.append(seq[j])
                    j += 1
            seq = out
        seq = tuple(seq)
        if len(self.cache) < 200000:
            self.cache[piece] = seq
        return seq

    def _bpe(self, piece: str) -> int:
        return len(self._symbols(piece))

    def _parts(self, text: str):
        """(is an added token, text) in order: the added tokens split out first."""
        parts = self.split.split(text) if self.split else [text]
        for k, part in enumerate(parts):
            if self.split and k % 2 == 1:
                yield True, part
            elif part:
                yield False, unicodedata.normalize("NFC", part)

    def count(self, text: str) -> int:
        total = 0
        for added, part in self._parts(text):
            if added:
                total += 1  # an added (special) token
            else:
                total += sum(self._bpe(m.group(0)) for m in PRETOKENIZE.finditer(part))
        return total

    def encode(self, text: str):
        """(ids, token strings) of `text`: each symbol's id in the vocabulary (the strings in
        their byte-level form, as `tokenizers` shows them: "Ġw"), an added token's own id."""
        ids, strs = [], []
        for added, part in self._parts(text):
            if added:
                ids.append(self.added[part])
                strs.append(part)
                continue
            for m in PRETOKENIZE.finditer(part):
                for sym in self._symbols(m.group(0)):
                    ids.append(self.vocab[sym])
                    strs.append(sym)
        return ids, strs

    def decode(self, ids) -> str:
        """The text of `ids`: an id the vocabulary lacks is left out, an added token is its
        own text, the bytes of the others are decoded as UTF-8 (U+FFFD where invalid)."""
        if self.pieces is None:
            self.pieces = {i: t for t, i in self.vocab.items()}
            self.pieces.update({i: t for t, i in self.added.items()})
        byte_of = {c: b for b, c in BYTE_CHARS.items()}
        added_ids = set(self.added.values())
        out, buf = [], bytearray()
        for i in ids:
            tok = self.pieces.get(i)
            if tok is None:
                continue
            if i in added_ids:
                out.append(buf.decode("utf-8", "replace"))
                buf = bytearray()
                out.append(tok)
            else:
                buf.extend(byte_of[c] for c in tok)
        out.append(buf.decode("utf-8", "replace"))
        return "".join(out)
