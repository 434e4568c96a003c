"""Constitutional AI, the supervised stage (Bai et al. 2022): the policy answers, critiques its answer against a
principle drawn from a constitution, revises it, and is fine-tuned on the revisions (the "cai_sft" stage).

A constitution is a JSON list of principles (`config.cai.constitution`; "" is the built-in
rl_lm/train/constitution.json). Each has a `name`, the `principle` in words, a `critique` request and a `revision`
request, and, so that its effect is measured by a program rather than by another model, a `check`:

  answer_last_line   the last non-empty line is a number alone ("166", "-3.5", "166.")
  max_words          at most `n` words
  no_hedging         none of "I think", "maybe", "probably", "perhaps", "not sure", "might be"

and `keywords`: a critique "names the principle" when it contains one of them (case-insensitive). That rate is
measured over the answers that broke their principle.

  answer    = policy(prompt)                                            config.sampling, the RL prompt length
  critique  = policy(CRITIQUE.format(prompt, answer, principle.critique))   cai.max_new_tokens, cai.max_prompt_len
  revision  = policy(REVISION.format(prompt, answer, critique, principle.revision))
  SFT on (prompt, revision) with config.sft; its checkpoints in <workdir>/checkpoints/cai_sft (an empty revision,
  or one the tokenizer cannot encode back, is left out and counted)

The transcripts (answer, principle, critique, revision and every check) go to <workdir>/cai_transcripts.jsonl,
written once and read back by a resumed run. Compliance with every checkable principle is measured on held-out
prompts before and after the SFT, with the same sampling key (<workdir>/cai_summary.json).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from rl_lm import keys, sampling
from rl_lm.config.section import ConfigError
from rl_lm.tasks.base import Problem, Task
from rl_lm.train import held_out, sft, stage_run
from rl_lm.train.context import Context
from rl_lm.train.rollout import Sampler
from rl_lm.train.source import training_pool

BUILT_IN = os.path.join(os.path.dirname(__file__), "constitution.json")
TRANSCRIPTS = "cai_transcripts.jsonl"
CRITIQUE = "Question: {prompt}\nResponse: {answer}\n{request}\nCritique:"
REVISION = "Question: {prompt}\nResponse: {answer}\nCritique: {critique}\n{request}\nRevised response:"

_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?\.?$")
_HEDGES = ("i think", "maybe", "probably", "perhaps", "not sure", "might be")


@dataclasses.dataclass(frozen=True)
class Principle:
  name: str
  principle: str  # the rule in words
  critique: str  # the request that asks for a critique against it
  revision: str  # the request that asks for a revision
  check: str = ""  # a program that says whether a text complies (CHECKS); "": words only, not measured
  n: int = 0  # the check's parameter (max_words: the limit)
  keywords: tuple[str, ...] = ()  # a critique naming one of them names this principle


def _last_line_is_a_number(text: str, _: int) -> bool:
  lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
  return bool(lines) and bool(_NUMBER.match(lines[-1]))


CHECKS: dict[str, Callable[[str, int], bool]] = {
  "answer_last_line": _last_line_is_a_number,
  "max_words": lambda text, n: 0 < len(text.split()) <= n,
  "no_hedging": lambda text, _: bool(text.strip()) and not any(h in text.lower() for h in _HEDGES),
}


def load_constitution(path: str = "") -> list[Principle]:
  """The principles of the JSON file at `path` ("" the built-in one); a bad file is refused naming the key."""
  path = path or BUILT_IN
  try:
    with open(path, encoding="utf-8") as f:
      raw = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ConfigError("config.cai.constitution", f"{path}: not a readable JSON list of principles ({e})") from None
  fields = {f.name for f in dataclasses.fields(Principle)}
  out = []
  for i, item in enumerate(raw if isinstance(raw, list) else [None]):
    if not isinstance(item, dict) or not {"name", "principle", "critique", "revision"} <= set(item):
      raise ConfigError("config.cai.constitution", f"{path}: principle {i} needs name, principle, critique, revision")
    unknown = set(item) - fields
    if unknown or (item.get("check") and item["check"] not in CHECKS):
      raise ConfigError("config.cai.constitution", f"{path}: principle {item['name']!r}: unknown "
                        f"{'fields ' + ', '.join(sorted(unknown)) if unknown else 'check ' + repr(item['check'])}; "
                        f"checks: {', '.join(CHECKS)}")
    out.append(Principle(**{**item, "keywords": tuple(k.lower() for k in item.get("keywords", ()))}))
  if not out:
    raise ConfigError("config.cai.constitution", f"{path}: no principles")
  return out


def complies(principle: Principle, text: str) -> bool | None:
  """Whether `text` follows the principle (None: the principle has no check)."""
  return CHECKS[principle.check](text, principle.n) if principle.check else None


def names(principle: Principle, critique: str) -> bool:
  """Whether a critique names the principle (one of its keywords)."""
  low = critique.lower()
  return any(k in low for k in principle.keywords)


def compliance(principles: Sequence[Principle], texts: Sequence[str]) -> dict[str, float]:
  """cai/compliance/<name>: the share of `texts` that follow each checkable principle; cai/compliance_all: that
  follow all of them."""
  checked = [p for p in principles if p.check]
  per = {p.name: np.asarray([complies(p, t) for t in texts], bool) for p in checked}
  out = {f"cai/compliance/{name}": float(v.mean()) for name, v in per.items()}
  out["cai/compliance_all"] = float(np.all(np.stack(list(per.values())), axis=0).mean()) if per else float("nan")
  return out


class Revisions:
  """The SFT task: the prompts with their revisions as the demonstrations."""

  def __init__(self, problems: list[Problem], revisions: dict[str, str]):
    self.problems = [p for p in problems if revisions.get(p.id)]
    self.revisions = revisions

  def train_problems(self, n: int | None = None, seed: int = 0) -> Iterator[Problem]:
    order = np.random.default_rng(seed).permutation(len(self.problems))
    yield from [self.problems[i] for i in order][:n]

  def reference_completion(self, problem: Problem) -> str:
    return self.revisions[problem.id]


def _fits(sampler: Sampler, texts: Sequence[str]) -> list[bool]:
  """Which prompts the sampler can take (encodable, within its prompt length)."""
  out = []
  for t in texts:
    try:
      out.append(len(sampler.tok.encode_prompt(t)) <= sampler.prompt_len)
    except ValueError:
      out.append(False)
  return out


def _sample(sampler: Sampler, params: Any, texts: list[str], key: jax.Array) -> list[str | None]:
  """The completions of the prompts that fit, None for the others."""
  ok = _fits(sampler, texts)
  todo = [t for t, f in zip(texts, ok, strict=True) if f]
  done = iter(sampler.sample(params, todo, key)["texts"] if todo else [])
  return [next(done) if f else None for f in ok]


def transcripts(ctx: Context, principles: list[Principle], problems: list[Problem], log: Callable[[str], Any]
                ) -> list[dict[str, Any]]:
  """Answer, critique and revision for each problem (read back from the workdir when a run resumes)."""
  path = os.path.join(ctx.workdir, TRANSCRIPTS)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return [json.loads(line) for line in f]
  config, cai = ctx.config, ctx.config.cai
  scfg = sampling.config_from(config.sampling, ctx.tokenizer)
  short = Sampler(ctx.model_cfg, scfg, ctx.tokenizer, ctx.mesh, ctx.rules, config.rl.max_prompt_len, config.eval.rows)
  long = Sampler(ctx.model_cfg, dataclasses.replace(scfg, max_new_tokens=cai.max_new_tokens), ctx.tokenizer,
                 ctx.mesh, ctx.rules, cai.max_prompt_len, config.eval.rows)
  drawn = np.random.default_rng((config.seed, 5)).integers(len(principles), size=len(problems))
  rules = [principles[i] for i in drawn]
  answers = _sample(short, ctx.policy, [p.prompt for p in problems], keys.fold(ctx.key, 11, 0))
  asks = [CRITIQUE.format(prompt=p.prompt, answer=a, request=r.critique) if a is not None else ""
          for p, a, r in zip(problems, answers, rules, strict=True)]
  critiques = _sample(long, ctx.policy, asks, keys.fold(ctx.key, 11, 1))
  asks = [REVISION.format(prompt=p.prompt, answer=a, critique=c.strip(), request=r.revision) if c is not None else ""
          for p, a, c, r in zip(problems, answers, critiques, rules, strict=True)]
  revisions = _sample(long, ctx.policy, asks, keys.fold(ctx.key, 11, 2))
  records = []
  for p, r, a, c, v in zip(problems, rules, answers, critiques, revisions, strict=True):
    broke = None if a is None else complies(r, a) is False
    records.append({"id": p.id, "prompt": p.prompt, "answer": a, "principle": r.name, "critique": c,
                    "revision": v and v.strip(), "answer_complies": None if a is None else complies(r, a),
                    "critique_names": None if c is None or not broke else names(r, c),
                    "revision_complies": None if v is None else complies(r, v.strip())})
  if jax.process_index() == 0:
    os.makedirs(ctx.workdir, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      f.writelines(json.dumps(rec) + "\n" for rec in records)
    os.replace(path + ".tmp", path)  # whole or absent
  log(f"cai_sft: {len(records)} transcripts ({sum(rec['revision'] is None for rec in records)} without a revision: "
      f"a prompt that did not fit cai.max_prompt_len or the tokenizer) -> {path}")
  return records


def _encodes(tok: Any, text: str) -> bool:
  """Whether the policy's tokenizer encodes `text` (a sampled id may decode to a character it cannot encode back:
  such a revision is not trained on)."""
  try:
    tok.encode(text)
    return True
  except ValueError:
    return False


def _rate(records: Sequence[dict[str, Any]], key: str) -> float:
  values = [r[key] for r in records if r[key] is not None]
  return float(np.mean(values)) if values else float("nan")


def train(ctx: Context, task: Task, log: Any = print) -> dict[str, Any]:
  """The "cai_sft" stage: transcripts on the training pool, SFT on the revisions, compliance before and after on
  held-out prompts. Leaves the tuned policy in `ctx.policy`; returns (and writes) the summary."""
  config, cai, say = ctx.config, ctx.config.cai, stage_run.speaker(log)
  principles = load_constitution(cai.constitution)
  pool = held_out.fitting(ctx, training_pool(task, cai.prompts, config.seed), "training", say)[: cai.prompts]
  test = held_out.fitting(ctx, task.test_problems(cai.eval_prompts, seed=config.seed), "held-out", say)
  scfg = sampling.config_from(config.sampling, ctx.tokenizer)
  evals = Sampler(ctx.model_cfg, scfg, ctx.tokenizer, ctx.mesh, ctx.rules, config.rl.max_prompt_len, config.eval.rows)
  measure = lambda: compliance(principles, evals.sample(ctx.policy, [p.prompt for p in test],  # noqa: E731
                                                        keys.fold(ctx.key, 11, 3))["texts"])
  before = measure()
  records = transcripts(ctx, principles, pool, say)
  revisions = {r["id"]: r["revision"] for r in records if r["revision"] and _encodes(ctx.tokenizer, r["revision"])}
  metrics = sft.train(ctx, Revisions(pool, revisions), config.sft, log, stage="cai_sft")
  after = measure()
  summary = {"before": before, "after": after, "transcripts": len(records), "revisions": len(revisions),
             "unencodable": sum(bool(r["revision"]) for r in records) - len(revisions),
             "cai/answer_compliance": _rate(records, "answer_complies"),
             "cai/critique_names_principle": _rate(records, "critique_names"),
             "cai/revision_compliance": _rate(records, "revision_complies")}
  say("cai_sft: compliance on held-out prompts, before -> after: " + ", ".join(
    f"{k.removeprefix('cai/compliance/').removeprefix('cai/')} {before[k]:.2f} -> {after[k]:.2f}" for k in before))
  say(f"cai_sft: answers following their drawn principle {summary['cai/answer_compliance']:.2f}, critiques naming "
      f"the broken principle {summary['cai/critique_names_principle']:.2f}, revisions following it "
      f"{summary['cai/revision_compliance']:.2f}")
  if jax.process_index() == 0:
    with open(os.path.join(ctx.workdir, "cai_summary.json"), "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=1)
  return {**summary, **metrics}
