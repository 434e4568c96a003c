"""Tokenizers behind one interface.

`CharTokenizer` serves the built-in tasks (arithmetic, synthetic preferences): every printable
ASCII character and newline is one token, after three specials (pad=0, bos=1, eos=2).
`HFTokenizer` wraps a Hugging Face `tokenizer.json` through the `tokenizers` library, with the
checkpoint's chat template (rl_lm/chat.py) when asked for one.
Both expose `encode`, `decode`, `encode_prompt` (how a task's prompt text becomes the ids the sampler
continues: bos + text, or the text as a user turn of the chat template), `vocab_size`, `pad_id`, `bos_id`,
`eos_id` and `stop_ids` (eos and the template's end-of-turn token). A tokenizer file that cannot be read
raises `TokenizerError` naming the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Protocol

from rl_lm.chat import ChatTemplate

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
  stop_ids: tuple[int, ...]  # ids that end a completion: eos, and the chat template's end of turn

  def encode(self, text: str) -> list[int]: ...

  def encode_prompt(self, text: str) -> list[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...


class CharTokenizer:
  """Character-level tokenizer: ids 0..2 are specials, then '\\n' and ASCII 32..126 (98 ids)."""

  vocab_size = len(_SPECIALS) + len(_CHARS)
  pad_id, bos_id, eos_id, stop_ids = PAD, BOS, EOS, (EOS,)

  def __init__(self) -> None:
    self._to_id = {c: i + len(_SPECIALS) for i, c in enumerate(_CHARS)}

  def encode(self, text: str) -> list[int]:
    """Encodes text; raises ValueError naming the first character outside the alphabet."""
    try:
      return [self._to_id[c] for c in text]
    except KeyError as e:
      raise ValueError(f"CharTokenizer cannot encode character {e.args[0]!r} in {text[:40]!r}") from None

  def encode_prompt(self, text: str) -> list[int]:
    """bos, then the text."""
    return [BOS, *self.encode(text)]

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
  """A Hugging Face fast tokenizer loaded from `tokenizer.json` (plus `tokenizer_config.json` if present).

  `chat=True`: prompts are framed as one user turn by the checkpoint's chat template (`chat_template` in
  tokenizer_config.json, or chat_template.jinja), and the template's end-of-turn token joins `stop_ids`.
  Plain prompts get bos first when the tokenizer adds one (`add_bos_token`; when unset, whenever it has a bos).
  """

  def __init__(self, path: str, chat: bool = False) -> None:
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
    self.add_bos = bool(special.get("add_bos_token", self.bos_id is not None)) and self.bos_id is not None
    self.special_ids = {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
    self.chat = None
    if chat:
      source, origin = special.get("chat_template"), cfg_file
      jinja_file = os.path.join(directory, "chat_template.jinja")
      if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
        source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"), None)
      if not source and os.path.exists(jinja_file):
        try:
          with open(jinja_file, encoding="utf-8") as f:
            source, origin = f.read(), jinja_file
        except UnicodeDecodeError as e:
          raise TokenizerError(f"{jinja_file}: not UTF-8 text ({e})") from None
      if not isinstance(source, str) or not source:
        raise TokenizerError(f"{cfg_file}: no chat_template (nor {jinja_file}); a chat prompt needs the checkpoint's "
                             "template (or use a plain one)")
      names = ("bos_token", "eos_token", "unk_token", "pad_token")
      text = {n: (special[n].get("content") if isinstance(special.get(n), dict) else special.get(n)) for n in names}
      self.chat = ChatTemplate(source, text, origin=origin)
    turn_end = self.chat.end_of_turn(self.encode, self.special_ids) if self.chat else ()
    self.stop_ids = tuple(dict.fromkeys((self.eos_id, *turn_end)))

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_prompt(self, text: str) -> list[int]:
    """The chat template's user turn and generation prompt (chat), else bos (when added) and the text."""
    if self.chat is not None:
      return self.encode(self.chat.prompt(text))
    return ([self.bos_id] if self.add_bos else []) + self.encode(text)

  def encode_reply(self, text: str) -> list[int]:
    """An environment's reply, as the tokens that follow the policy's stop token: the template's user turn and
    generation prompt (the end-of-turn token the policy sampled left out), or the text itself without a template."""
    if self.chat is None:
      return self.encode(text)
    ids = self.encode(self.chat.reply(text))
    return ids[1:] if ids and ids[0] in self.stop_ids else ids

  def decode(self, ids: Sequence[int]) -> str:
    """The text of `ids` up to the first stop id, special tokens left out."""
    ids = [int(i) for i in ids]
    end = next((k for k, i in enumerate(ids) if i in self.stop_ids), len(ids))
    return self._tok.decode(ids[:end], skip_special_tokens=True)


def from_config(config) -> CharTokenizer | HFTokenizer:
  """The tokenizer a run uses: `config.tokenizer` is "char" or "hf" (from `config.model.hf_checkpoint`), with the
  checkpoint's chat template when `config.task.template` is "chat"."""
  if config.tokenizer == "char":
    return CharTokenizer()
  return HFTokenizer(config.model.hf_checkpoint, chat=config.task.template == "chat")
