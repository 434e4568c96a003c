"""Tokenizers behind one interface.

`CharTokenizer` serves the built-in tasks (arithmetic, synthetic preferences): every printable
ASCII character and newline is one token, after three specials (pad=0, bos=1, eos=2).
`HFTokenizer` wraps a Hugging Face `tokenizer.json` through the `tokenizers` library.
Both expose `encode`, `decode`, `vocab_size`, `pad_id`, `bos_id`, `eos_id`. A tokenizer file that cannot
be read raises `TokenizerError` naming the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Protocol

PAD, BOS, EOS = 0, 1, 2
_SPECIALS = ("<pad>", "<bos>", "<eos>")
_CHARS = "\n" + "".join(chr(c) for c in range(32, 127))


class TokenizerError(ValueError):
  """A tokenizer file that cannot be read or lacks what the run needs; the message names the file.

  `user_facing`: `rl_lm.main` reports it as one line, as the user's input, not as a bug.
  """

  user_facing = True


class Tokenizer(Protocol):
  """What the trainers and tasks need of a tokenizer."""

  vocab_size: int
  pad_id: int
  bos_id: int | None
  eos_id: int

  def encode(self, text: str) -> list[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...


class CharTokenizer:
  """Character-level tokenizer: ids 0..2 are specials, then '\\n' and ASCII 32..126 (98 ids)."""

  vocab_size = len(_SPECIALS) + len(_CHARS)
  pad_id, bos_id, eos_id = PAD, BOS, EOS

  def __init__(self) -> None:
    self._to_id = {c: i + len(_SPECIALS) for i, c in enumerate(_CHARS)}

  def encode(self, text: str) -> list[int]:
    """Encodes text; raises ValueError naming the first character outside the alphabet."""
    try:
      return [self._to_id[c] for c in text]
    except KeyError as e:
      raise ValueError(f"CharTokenizer cannot encode character {e.args[0]!r} in {text[:40]!r}") from None

  def decode(self, ids: Sequence[int]) -> str:
    """Decodes ids, dropping specials, stopping at the first eos; ids past the alphabet (a model's
    vocabulary may be larger) decode to U+FFFD."""
    out = []
    for i in ids:
      i = int(i)
      if i == EOS:
        break
      if i >= len(_SPECIALS):
        j = i - len(_SPECIALS)
        out.append(_CHARS[j] if j < len(_CHARS) else "\ufffd")
    return "".join(out)


class HFTokenizer:
  """A Hugging Face fast tokenizer loaded from `tokenizer.json` (plus `tokenizer_config.json` if present)."""

  def __init__(self, path: str) -> None:
    from tokenizers import Tokenizer as _Tok  # imported lazily: only HF models need it

    directory = path if os.path.isdir(path) else os.path.dirname(path)
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.exists(file):
      raise FileNotFoundError(f"no tokenizer.json at {file}")
    try:
      self._tok = _Tok.from_file(file)
    except Exception as e:  # noqa: BLE001 -- the tokenizers library raises a bare Exception for any bad file
      reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise TokenizerError(f"{file}: not a readable Hugging Face tokenizer file ({reason})") from None
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    special = {}
    cfg_file = os.path.join(directory, "tokenizer_config.json")
    if os.path.exists(cfg_file):
      try:
        with open(cfg_file, encoding="utf-8") as f:
          special = json.load(f)
      except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{cfg_file}: not valid JSON ({e})") from None
      if not isinstance(special, dict):
        raise TokenizerError(f"{cfg_file}: expected a JSON object, got {type(special).__name__}")

    def _id(name: str) -> int | None:
      tok = special.get(name)
      if isinstance(tok, dict):
        tok = tok.get("content")
      return None if tok is None else self._tok.token_to_id(tok)

    self.eos_id = _id("eos_token")
    self.bos_id = _id("bos_token")
    pad = _id("pad_token")
    if self.eos_id is None:
      raise TokenizerError(f"{cfg_file}: no eos_token; the sampler needs one to stop")
    self.pad_id = pad if pad is not None else self.eos_id

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int]) -> str:
    ids = [int(i) for i in ids]
    if self.eos_id in ids:
      ids = ids[: ids.index(self.eos_id)]
    return self._tok.decode(ids, skip_special_tokens=True)


def from_config(config) -> CharTokenizer | HFTokenizer:
  """The tokenizer a run uses: `config.tokenizer` is "char" or "hf" (from `config.model.hf_checkpoint`)."""
  if config.tokenizer == "char":
    return CharTokenizer()
  return HFTokenizer(config.model.hf_checkpoint)


def encode_prompt(tok: Tokenizer, text: str) -> list[int]:
  """Prompt ids: bos (when the tokenizer has one) followed by the text."""
  ids = tok.encode(text)
  return ([tok.bos_id] if tok.bos_id is not None else []) + ids
