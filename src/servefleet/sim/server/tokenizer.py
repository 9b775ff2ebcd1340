"""Tokenizers for the sim-server: a word tokenizer that needs no download, or a real one.

``WordTokenizer`` (the default) counts one token per whitespace-separated word, so prompt
lengths are exact and easy to reason about, and identical text gives identical token ids, so
shared prefixes hit the prefix cache. Three special tokens exist: ``<|endoftext|>``,
``<|im_start|>`` and ``<|im_end|>``; they are tokens even when glued to a word.

* Words of the built-in vocabulary (4,096 pseudo-words such as ``bada`` or ``kitu``, the words
  the sim-server writes) have fixed ids; any other word gets a stable id hashed into the rest of
  the model's vocabulary. ``/detokenize`` gives back a hashed word if this process has seen it,
  else ``<unk:ID>``.
* Chat prompts are rendered as ChatML (the Qwen2 template, without a default system prompt):
  ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then ``<|im_start|>assistant\\n``
  when a generation prompt is asked for. With the word tokenizer a message therefore costs its
  words plus 3 tokens (``<|im_start|>``, the role, ``<|im_end|>``), and the generation prompt 2.

``HFTokenizer`` loads a Hugging Face tokenizer from a local directory (``--tokenizer PATH``):
``transformers`` when installed (its chat template is used), else ``tokenizers`` (ChatML).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
NUM_RESERVED_IDS = 16
"""Ids below this are special tokens (3 used) or reserved."""
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
NUM_WORDS = 4096
MIN_VOCAB = 32768
UNKNOWN_CACHE = 200_000
"""Hashed words remembered for /detokenize (bounded; older ones are not forgotten, new ones
are simply not remembered past this)."""


def _pseudo_words(n: int) -> list[str]:
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    words = list(syllables)
    for a in syllables:
        for b in syllables:
            words.append(a + b)
            if len(words) >= n:
                return words
    return words[:n]


WORDS: tuple[str, ...] = tuple(_pseudo_words(NUM_WORDS))


class ChatTemplateError(ValueError):
    """A chat request the template cannot render (becomes HTTP 400)."""


def render_chatml(
    messages: Sequence[tuple[str, str]], add_generation_prompt: bool, continue_final_message: bool
) -> str:
    """ChatML text of ``(role, content)`` messages (see the module docstring)."""
    parts = []
    last = len(messages) - 1
    for i, (role, content) in enumerate(messages):
        if continue_final_message and i == last:
            parts.append(f"<|im_start|>{role}\n{content}")
        else:
            parts.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    output_ids: Sequence[int]
    """Ids the sim-server draws its output from."""
    json_safe: bool
    """True when every output piece can be put between JSON quotes as it is."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_str(self, token_id: int) -> str: ...

    def piece(self, token_id: int, first: bool) -> str:
        """Text of one output token; ``first`` for the first token of a new chat message."""
        ...

    def render_chat(
        self,
        messages: Sequence[tuple[str, str]],
        add_generation_prompt: bool,
        continue_final_message: bool,
    ) -> str: ...


class WordTokenizer:
    """One whitespace-separated word = one token (see the module docstring)."""

    name = "servefleet-word"
    json_safe = True

    def __init__(self, vocab_size: int = MIN_VOCAB) -> None:
        self.vocab_size = max(vocab_size, MIN_VOCAB)
        self._special = {s: i for i, s in enumerate(SPECIAL_TOKENS)}
        self._known = {w: NUM_RESERVED_IDS + i for i, w in enumerate(WORDS)}
        self._first_hashed = NUM_RESERVED_IDS + len(WORDS)
        self._num_hashed = self.vocab_size - self._first_hashed
        self._seen: dict[int, str] = {}
        self._id_cache: dict[str, int] = {}
        self.output_ids = range(NUM_RESERVED_IDS, NUM_RESERVED_IDS + len(WORDS))
        self._pieces = [""] * NUM_RESERVED_IDS + [" " + w for w in WORDS]

    def _word_id(self, word: str) -> int:
        tid = self._known.get(word)
        if tid is not None:
            return tid
        tid = self._id_cache.get(word)
        if tid is None:
            tid = self._first_hashed + zlib.crc32(word.encode()) % self._num_hashed
            if len(self._id_cache) < UNKNOWN_CACHE:
                self._id_cache[word] = tid
                self._seen.setdefault(tid, word)
        return tid

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = []
        special = self._special
        word_id = self._word_id
        for part in _SPECIAL_RE.split(text):
            sid = special.get(part)
            if sid is not None:
                ids.append(sid)
            elif part:
                ids.extend(word_id(w) for w in part.split())
        return ids

    def token_str(self, token_id: int) -> str:
        if 0 <= token_id < len(SPECIAL_TOKENS):
            return SPECIAL_TOKENS[token_id]
        if NUM_RESERVED_IDS <= token_id < self._first_hashed:
            return WORDS[token_id - NUM_RESERVED_IDS]
        if token_id < 0 or token_id >= self.vocab_size:
            raise ValueError(
                f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})"
            )
        return self._seen.get(token_id, f"<unk:{token_id}>")

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.token_str(i) for i in ids)

    def piece(self, token_id: int, first: bool) -> str:
        p = self._pieces[token_id]
        return p[1:] if first else p

    def render_chat(
        self,
        messages: Sequence[tuple[str, str]],
        add_generation_prompt: bool,
        continue_final_message: bool,
    ) -> str:
        return render_chatml(messages, add_generation_prompt, continue_final_message)


_WORDLIKE = re.compile(r"^ [A-Za-z]{2,12}$")


class HFTokenizer:
    """A Hugging Face tokenizer from a local directory or ``tokenizer.json`` file."""

    json_safe = True

    def __init__(self, path: str) -> None:
        p = Path(path).expanduser()
        if not p.exists():
            raise FileNotFoundError(f"--tokenizer {path}: no such file or directory")
        self.name = str(p)
        self._hf = None
        self._tok = None
        try:
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
            self._tok = getattr(self._hf, "backend_tokenizer", None)
        except ImportError:
            try:
                from tokenizers import Tokenizer as RawTokenizer
            except ImportError as exc:
                raise ImportError(
                    "--tokenizer needs the Hugging Face `tokenizers` package (or `transformers`), "
                    "which is not installed: pip install 'servefleet[hf]' — or leave --tokenizer "
                    "out to use the built-in word tokenizer"
                ) from exc
            file = p / "tokenizer.json" if p.is_dir() else p
            if not file.exists():
                raise FileNotFoundError(f"--tokenizer {path}: no tokenizer.json there") from None
            self._tok = RawTokenizer.from_file(str(file))
        self.vocab_size = (
            len(self._hf)
            if self._hf is not None
            else self._tok.get_vocab_size(with_added_tokens=True)
        )
        self.output_ids = self._pick_output_ids()
        self._pieces = {i: self.decode([i]) for i in self.output_ids}

    def _pick_output_ids(self) -> list[int]:
        ids = []
        limit = min(self.vocab_size, 200_000)
        for i in range(limit):
            s = self.decode([i])
            if _WORDLIKE.match(s):
                ids.append(i)
                if len(ids) >= NUM_WORDS:
                    break
        if len(ids) < 64:
            raise ValueError(
                f"tokenizer {self.name}: found only {len(ids)} word-like tokens (' word') to "
                "write output with; use the built-in word tokenizer instead"
            )
        return ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self._hf is not None:
            return list(self._hf.encode(text, add_special_tokens=add_special_tokens))
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int]) -> str:
        for i in ids:
            if i < 0 or i >= self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
        if self._hf is not None:
            return self._hf.decode(list(ids))
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_str(self, token_id: int) -> str:
        if self._hf is not None:
            return self._hf.convert_ids_to_tokens(token_id)
        return self._tok.id_to_token(token_id)

    def piece(self, token_id: int, first: bool) -> str:
        p = self._pieces.get(token_id)
        if p is None:
            p = self._pieces[token_id] = self.decode([token_id])
        return p

    def render_chat(
        self,
        messages: Sequence[tuple[str, str]],
        add_generation_prompt: bool,
        continue_final_message: bool,
    ) -> str:
        if self._hf is not None and getattr(self._hf, "chat_template", None):
            try:
                return self._hf.apply_chat_template(
                    [{"role": r, "content": c} for r, c in messages],
                    tokenize=False,
                    add_generation_prompt=add_generation_prompt,
                    continue_final_message=continue_final_message,
                )
            except Exception as exc:  # template errors are the request's fault
                raise ChatTemplateError(f"chat template failed: {exc}") from exc
        return render_chatml(messages, add_generation_prompt, continue_final_message)


def load_tokenizer(path: str | None, vocab_size: int) -> Tokenizer:
    """The word tokenizer, or the Hugging Face tokenizer at ``path``."""
    if path is None:
        return WordTokenizer(vocab_size)
    return HFTokenizer(path)
