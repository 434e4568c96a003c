"""The checkpoint's own chat template: messages -> the text the model was trained on, and its end-of-turn tokens.

A Hugging Face checkpoint ships its template as Jinja source (`chat_template` in tokenizer_config.json, or
a `chat_template.jinja` file). It is rendered here the way transformers' `apply_chat_template` renders it,
so the tokens match: an immutable sandboxed Jinja environment (a template is code from a download; it
cannot reach Python objects' internals or mutate its inputs), `trim_blocks` and `lstrip_blocks`, the
`loopcontrols` extension, and the helpers templates call (`raise_exception`, `strftime_now`, a `tojson`
that keeps non-ASCII text). The rendered text is then encoded without adding special tokens: the template
writes every special token it wants (Llama 3's `<|begin_of_text|>`, ChatML's `<|im_start|>`).

  template = ChatTemplate(source, special_tokens={"bos_token": "<s>", "eos_token": "</s>"})
  text = template.render([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True)
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

Message = Mapping[str, Any]  # {"role": "system" | "user" | "assistant" | "tool", "content": str, ...}


class ChatTemplateError(ValueError):
  """A template that does not compile or raises while rendering (its own `raise_exception` too)."""

  user_facing = True


def _raise(message: str) -> None:
  raise ChatTemplateError(f"chat template: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
  return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.cache
def _environment() -> Any:
  from jinja2.ext import loopcontrols
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise
  env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
  return env


class ChatTemplate:
  """A compiled chat template; `special_tokens` ({"bos_token": ..., "eos_token": ...}) are passed to it by name."""

  def __init__(self, source: str, special_tokens: Mapping[str, str | None] | None = None):
    from jinja2 import TemplateError

    try:
      self._template = _environment().from_string(source)
    except TemplateError as e:
      raise ChatTemplateError(f"chat template does not compile: {e}") from None
    self.source = source
    self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}

  def render(self, messages: Sequence[Message], add_generation_prompt: bool = True, **kwargs: Any) -> str:
    """The conversation as text; with `add_generation_prompt` it ends where the assistant's reply begins.
    `kwargs` reach the template as variables (`tools`, `documents`, `enable_thinking`, ...)."""
    from jinja2 import TemplateError

    try:
      return self._template.render(messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
                                   **self.special_tokens, **kwargs)
    except TemplateError as e:
      raise ChatTemplateError(f"chat template failed to render: {e}") from None

  def prompt(self, user: str, system: str | None = None) -> str:
    """One user turn (after `system`, when given) and the generation prompt."""
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
      {"role": "user", "content": user}]
    return self.render(messages, add_generation_prompt=True)

  def end_of_turn(self, encode: Callable[[str], list[int]], special_ids: set[int]) -> tuple[int, ...]:
    """The special token(s) the template writes right after an assistant's reply (ChatML's `<|im_end|>`,
    Llama 3's `<|eot_id|>`): what a sampler stops on. Found by rendering a reply and encoding what follows
    it; () when no special token follows."""
    marker = "\u2063reply\u2063"  # text no template writes by itself
    text = self.render([{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}],
                       add_generation_prompt=False)
    if marker not in text:
      return ()
    ids = encode(text.split(marker, 1)[1])
    stops = []
    for i in ids:
      if i not in special_ids:
        break
      stops.append(i)
    return tuple(stops[:1])

  def reply(self, content: str, role: str = "user") -> str:
    """The text that follows an assistant's reply in a conversation: the rest of its end of turn, a `role` turn of
    `content`, and the generation prompt. A multi-turn episode appends it (as tokens) after the policy's stop
    token, so the episode reads as the template would render the whole conversation. The end-of-turn token
    itself leads the text; the caller drops it when the policy already sampled it."""
    marker = "\u2063reply\u2063"
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}]
    before = self.render(history, add_generation_prompt=False)
    after = self.render([*history, {"role": role, "content": content}], add_generation_prompt=True)
    if marker not in before or not after.startswith(before):
      raise ChatTemplateError("chat template: a conversation does not render as the prefix of its continuation, so "
                              "turns cannot be appended token by token")
    return before.split(marker, 1)[1] + after[len(before):]
