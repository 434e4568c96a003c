"""Off-policy distillation, the baseline that on-policy distillation is measured against: SFT of the policy on a
frozen teacher's samples (the "teacher_sft" stage, after "sft"). The student learns the teacher's tokens on the
teacher's own prefixes, where on-policy distillation scores the student's; the mismatch between the prefixes it
trains on and those it meets when it samples is what the on-policy form removes (Agarwal et al. 2024).

The teacher (`config.teacher`, rl_lm/train/teacher.py) samples `teacher.samples_per_problem` completions of each
problem of the training pool (`task.pool_size` distinct problems, the curriculum's) once, at `sampling.temperature`,
and they are written to `<workdir>/teacher_samples.jsonl` (a resumed run reads them back: the same data). SFT then
cycles over them with `config.sft`'s steps, batch size and learning rate, its checkpoints in
`<workdir>/checkpoints/teacher_sft`.
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from rl_lm import evaluation, keys, sampling
from rl_lm.tasks.base import Problem, Task
from rl_lm.train import held_out, sft, stage_run
from rl_lm.train import teacher as teacher_lib
from rl_lm.train.context import Context
from rl_lm.train.rollout import Sampler
from rl_lm.train.source import training_pool

SAMPLES_FILE = "teacher_samples.jsonl"


class TeacherDemos:
  """`task` with the teacher's samples as its demonstrations: a problem's k-th use gives its (k mod n)-th sample."""

  def __init__(self, task: Task, problems: list[Problem], completions: dict[str, list[list[int]]]):
    self.task, self.problems, self.completions = task, problems, completions
    self._uses: collections.Counter = collections.Counter()

  def train_problems(self, n: int | None = None, seed: int = 0) -> Iterator[Problem]:
    """The pool the teacher sampled, in an order drawn from `seed` (sft.batches reshuffles per pass this way)."""
    order = np.random.default_rng(seed).permutation(len(self.problems))
    yield from [self.problems[i] for i in order][:n]

  def demonstration_ids(self, problem: Problem) -> list[int]:
    """The completion's token ids as the teacher sampled them (its stop token included when it stopped): trained on
    as ids, never decoded and re-encoded (a teacher may write ids whose text does not encode back to them)."""
    samples = self.completions[problem.id]
    k = self._uses[problem.id]
    self._uses[problem.id] += 1
    return samples[k % len(samples)]


def teacher_samples(ctx: Context, problems: list[Problem], log: Any = print) -> dict[str, list[list[int]]]:
  """problem id -> the teacher's completions as token ids (read back from the workdir when a run resumes)."""
  path = os.path.join(ctx.workdir, SAMPLES_FILE)
  out: dict[str, list[list[int]]] = collections.defaultdict(list)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      for line in f:
        record = json.loads(line)
        out[record["id"]].append(record["ids"])
    return dict(out)
  config = ctx.config
  frozen = teacher_lib.load(config, ctx, log)
  k = config.teacher.samples_per_problem
  sampler = Sampler(frozen.model_cfg, sampling.config_from(config.sampling, ctx.tokenizer), ctx.tokenizer, ctx.mesh,
                    ctx.rules, config.rl.max_prompt_len, config.eval.rows)
  rows = [p for p in problems for _ in range(k)]
  result = sampler.sample(frozen.params, [p.prompt for p in rows], keys.fold(ctx.key, 8))
  P = config.rl.max_prompt_len
  records = [{"id": p.id, "prompt": p.prompt, "completion": text, "finished": bool(result["finished"][i]),
              "ids": result["tokens"][i, P: P + int(result["lengths"][i])].tolist()}
             for i, (p, text) in enumerate(zip(rows, result["texts"], strict=True))]
  if jax.process_index() == 0:
    os.makedirs(ctx.workdir, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      f.writelines(json.dumps(r) + "\n" for r in records)
    os.replace(path + ".tmp", path)  # whole or absent: a crash mid-write leaves no half file to resume from
  for r in records:
    out[r["id"]].append(r["ids"])
  unfinished = sum(not r["finished"] for r in records)
  stage_run.speaker(log)(f"teacher_sft: the teacher wrote {len(records)} completions of {len(problems)} problems "
                         f"({unfinished} cut at sampling.max_new_tokens) -> {path}")
  return dict(out)


def train(ctx: Context, task: Task, log: Any = print) -> dict[str, Any]:
  """SFT of `ctx.policy` on the teacher's samples of the training pool; leaves the result in `ctx.policy`. The
  held-out pass@k before and after (`held_out.HeldOut`, the RL stage's draws) go to `<workdir>/eval/`, to
  `<workdir>/teacher_sft_summary.json` and into the returned summary."""
  config, say = ctx.config, stage_run.speaker(log)
  problems = held_out.fitting(ctx, training_pool(task, config.task.pool_size, config.seed), "training", say)
  test = held_out.fitting(ctx, task.test_problems(config.task.eval_size, seed=config.seed), "held-out", say)
  evals = held_out.HeldOut(ctx, sampling.config_from(config.sampling, ctx.tokenizer), test)
  before = evals.evaluate(ctx.policy)
  demos = TeacherDemos(task, problems, teacher_samples(ctx, problems, log))
  metrics = sft.train(ctx, demos, config.sft, log, stage="teacher_sft")
  after = evals.evaluate(ctx.policy)
  for label, result in (("before teacher_sft", before), ("after teacher_sft", after)):
    evaluation.write_eval(result, ctx.workdir, 0 if result is before else config.sft.steps, label=label)
  say(f"teacher_sft: before: {before.line()}")
  say(f"teacher_sft: after:  {after.line()}")
  summary = {"before": before.to_dict(), "after": after.to_dict(), "steps": config.sft.steps}
  if jax.process_index() == 0:  # beside the SFT loop's own files (its stage wrote none)
    with open(os.path.join(ctx.workdir, "teacher_sft_summary.json"), "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=1)
  return {**summary, **metrics}
