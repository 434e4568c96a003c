"""The checkpoint's own chat template: messages -> the text the model was trained on, and its end-of-turn tokens.

A Hugging Face checkpoint ships its template as Jinja source (`chat_template` in tokenizer_config.json, or
a `chat_template.jinja` file). It is rendered here the way transformers' `apply_chat_template` renders it,
so the tokens match: an immutable sandboxed Jinja environment (a template is code from a download; it
cannot reach Python objects' internals or mutate its inputs), `trim_blocks` and `lstrip_blocks`, the
`loopcontrols` extension, and the helpers templates call (`raise_exception`, `strftime_now`, a `tojson`
that keeps non-ASCII text). The rendered text is then encoded without adding special tokens: the template
writes every special token it wants (Llama 3's `<|begin_of_text|>`, ChatML's `<|im_start|>`).

The sandbox bounds what a template can reach, not what it can spend: a template is also compiled and
rendered in a worker process of its own (rl_lm/chat_worker.py) under `RenderLimits`, a deadline per call,
a cap on the output and a memory limit, so a template that loops for ever, builds gigabytes or recurses
without end costs at most the deadline and gives one `ChatTemplateError` line naming the file it came
from. A call is one round trip to the worker, about 25 µs more than rendering in this process took
(`reply`, which renders twice, sends both renders at once: about 45 µs more).

  template = ChatTemplate(source, {"bos_token": "<s>", "eos_token": "</s>"}, origin="ckpt/tokenizer_config.json")
  text = template.render([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rl_lm.chat_worker import RenderError, RenderLimits, RenderWorker

Message = Mapping[str, Any]  # {"role": "system" | "user" | "assistant" | "tool", "content": str, ...}


class ChatTemplateError(ValueError):
  """A template that does not compile, raises while rendering (its own `raise_exception` too), or passes a limit.

  `user_facing`: `rl_lm.main` reports it as one line, as the user's input (a checkpoint), not as a bug.
  """

  user_facing = True


class ChatTemplate:
  """A compiled chat template; `special_tokens` ({"bos_token": ..., "eos_token": ...}) are passed to it by name.

  `origin` (the file the source came from) leads every error line. Compiling starts the template's worker, so
  a template that does not compile raises here; a copy made by pickling starts its own worker on first use.
  """

  def __init__(self, source: str, special_tokens: Mapping[str, str | None] | None = None, origin: str | None = None,
               limits: RenderLimits | None = None):
    if not isinstance(source, str):
      raise ChatTemplateError(f"{origin or 'chat template'}: a template is a string, not {type(source).__name__}")
    self.source, self.origin = source, origin
    self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
    self._worker = RenderWorker(source, limits or RenderLimits())
    self._call(self._worker.start)

  @property
  def limits(self) -> RenderLimits:
    return self._worker.limits

  def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
    try:
      return fn(*args)
    except RenderError as e:
      raise ChatTemplateError(f"{self.origin}: {e}" if self.origin else str(e)) from None

  def render_many(self, calls: Sequence[tuple[Sequence[Message], bool, Mapping[str, Any]]]) -> list[str]:
    """Several renders in one round trip to the worker: (messages, add_generation_prompt, kwargs) each."""
    contexts = [{**self.special_tokens, **kwargs, "messages": [dict(m) for m in messages],
                 "add_generation_prompt": add_generation_prompt} for messages, add_generation_prompt, kwargs in calls]
    return self._call(self._worker.render, contexts)

  def render(self, messages: Sequence[Message], add_generation_prompt: bool = True, **kwargs: Any) -> str:
    """The conversation as text; with `add_generation_prompt` it ends where the assistant's reply begins.
    `kwargs` reach the template as variables (`tools`, `documents`, `enable_thinking`, ...)."""
    return self.render_many([(messages, add_generation_prompt, kwargs)])[0]

  def close(self) -> None:
    """Stops the worker now (garbage collection does too); a later render starts another."""
    self._worker.close()

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
    before, after = self.render_many([(history, False, {}), ([*history, {"role": role, "content": content}], True, {})])
    if marker not in before or not after.startswith(before):
      raise ChatTemplateError(f"{self.origin or 'chat template'}: a conversation does not render as the prefix of its "
                              "continuation, so turns cannot be appended token by token")
    return before.split(marker, 1)[1] + after[len(before):]
