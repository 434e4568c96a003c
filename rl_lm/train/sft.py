"""Supervised fine-tuning: next-token loss on completion tokens only (the prompt is masked).

Works from any task that yields (prompt, target) pairs: `Problem.prompt` and
`task.reference_completion(problem)`. Sequences are `[bos] prompt target [eos]`, right-padded to
`config.sft.max_len`; the loss counts the target and eos tokens.

A task with multi-turn demonstrations (`task.episode_demonstration(problem)`: ("policy", text) and ("env", observation)
turns) trains on the token layout of an episode (rl_lm/envs/episodes.py): the prompt, each policy turn and its
stop token (trained), each observation framed as the rollout frames it (`episodes.Framing`, not trained).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from rl_lm import tokenizer as tokenizer_lib
from rl_lm.models import scoring
from rl_lm.rl import losses
from rl_lm.tasks.base import Problem, Task
from rl_lm.train import loop, stage_run
from rl_lm.train import state as state_lib
from rl_lm.train.context import Context


def encode_examples(tok: tokenizer_lib.Tokenizer, pairs: Sequence[tuple[str, str]], max_len: int
                    ) -> dict[str, np.ndarray]:
  """(prompt, target) texts -> tokens [B, L], mask [B, L] (real tokens), loss_mask [B, L] (targets to predict).

  A pair longer than `max_len` is cut at the end (its eos is lost); `truncated` counts them.
  """
  return encode_ids(tok, [(prompt, tok.encode(target) + [tok.eos_id]) for prompt, target in pairs], max_len)


def encode_ids(tok: tokenizer_lib.Tokenizer, pairs: Sequence[tuple[str, list[int]]], max_len: int
               ) -> dict[str, np.ndarray]:
  """(prompt text, completion token ids) -> the arrays of `encode_examples`, the ids trained as they are (no eos
  added: a sampled completion carries its own stop token, or was cut without one)."""
  B = len(pairs)
  tokens = np.full((B, max_len), tok.pad_id, np.int32)
  mask = np.zeros((B, max_len), bool)
  loss_mask = np.zeros((B, max_len), bool)
  truncated = 0
  for i, (prompt, target) in enumerate(pairs):
    p = tok.encode_prompt(prompt)
    ids = (p + list(target))[:max_len]
    truncated += len(p) + len(target) > max_len
    tokens[i, : len(ids)] = ids
    mask[i, : len(ids)] = True
    loss_mask[i, len(p): len(ids)] = True
  return {"tokens": tokens, "mask": mask, "loss_mask": loss_mask, "truncated": np.int32(truncated)}


def encode_episodes(tok: tokenizer_lib.Tokenizer, demos: Sequence[tuple[str, list[tuple[str, str]]]], max_len: int
                    ) -> dict[str, np.ndarray]:
  """(prompt, turns) demonstrations -> the arrays of `encode_examples`, with loss on the policy's turns only."""
  from rl_lm.envs.episodes import Framing

  framing = Framing(tok)
  B = len(demos)
  tokens = np.full((B, max_len), tok.pad_id, np.int32)
  mask = np.zeros((B, max_len), bool)
  loss_mask = np.zeros((B, max_len), bool)
  truncated = 0
  stop = tok.stop_ids[-1]  # the chat template's end of turn when there is one, else eos
  for i, (prompt, turns) in enumerate(demos):
    ids = framing.first(prompt)
    trains = [False] * len(ids)
    for who, text in turns:
      part = tok.encode(text) + [stop] if who == "policy" else framing.next(text)
      ids += part
      trains += [who == "policy"] * len(part)
    truncated += len(ids) > max_len
    ids, trains = ids[:max_len], trains[:max_len]
    tokens[i, : len(ids)] = ids
    mask[i, : len(ids)] = True
    loss_mask[i, : len(ids)] = trains
  return {"tokens": tokens, "mask": mask, "loss_mask": loss_mask, "truncated": np.int32(truncated)}


def batches(task: Task, tok: tokenizer_lib.Tokenizer, batch_size: int, max_len: int, seed: int, start: int = 0
            ) -> Iterator[dict[str, np.ndarray]]:
  """Endless SFT batches from the task's training problems (a finite task is cycled, reshuffled per pass),
  from batch number `start` on (the data position of a resumed run)."""

  def problems() -> Iterator[Problem]:
    for epoch in itertools.count():
      yield from task.train_problems(None, seed=seed + epoch)

  stream = problems()
  if hasattr(task, "episode_demonstration"):  # multi-turn
    demo, encode = task.episode_demonstration, encode_episodes
  elif hasattr(task, "demonstration_ids"):  # token ids (a teacher's samples, rl_lm/train/offpolicy.py)
    demo, encode = task.demonstration_ids, encode_ids
  else:
    demo, encode = task.reference_completion, encode_examples
  for _ in range(start * batch_size):  # replayed, not skipped: a task's demonstrations may draw from its own RNG
    demo(next(stream))
  while True:
    chunk = list(itertools.islice(stream, batch_size))
    yield encode(tok, [(p.prompt, demo(p)) for p in chunk], max_len)


def sft_loss(model_cfg: Any):
  """loss_fn(params, batch, rng) for `state.make_update_fn`: token-mean NLL of the targets."""

  def loss_fn(params, batch, rng):
    del rng
    scores = scoring.score_tokens(model_cfg, params, batch["tokens"], batch["mask"])  # [B, L] each
    loss, metrics = losses.nll_from_scores(scores.logp, scores.hit, batch["loss_mask"])
    return loss, {f"sft/{k.split('/')[-1]}": v for k, v in metrics.items()}

  return loss_fn


def train(ctx: Context, task: Task, sft_cfg: Any, log: Any = print, stage: str = "sft") -> dict[str, float]:
  """Runs `sft_cfg.steps` updates on `ctx.policy` and leaves the result there. Returns the last metrics.

  Checkpoints go to `<workdir>/checkpoints/<stage>`; a workdir holding some resumes from the latest, one
  whose stage completed loads its result and trains nothing. Metrics: `<workdir>/<stage>_metrics.jsonl`.
  (`stage` "teacher_sft": SFT on a teacher's samples, rl_lm/train/offpolicy.py.)
  """
  optimizer = state_lib.make_optimizer(sft_cfg.learning_rate, weight_decay=sft_cfg.weight_decay,
                                       warmup_steps=sft_cfg.warmup_steps, total_steps=sft_cfg.steps)
  params_abstract = jax.eval_shape(lambda: ctx.policy)
  shardings = state_lib.state_shardings(optimizer, params_abstract, ctx.param_shardings, ctx.mesh)
  targets = stage_run.state_targets(optimizer, params_abstract, shardings)
  create = lambda p: state_lib.create(p, optimizer, ctx.mesh, ctx.param_shardings)
  with stage_run.StageRun(ctx.config, ctx.workdir, stage, sft_cfg.steps, f"{stage}_metrics.jsonl", log=log) as run:
    state, ctx.policy, _ = run.start(ctx, targets, create, sft_cfg.init_from)
    if run.complete:
      return {}
    update = state_lib.make_update_fn(sft_loss(ctx.model_cfg), optimizer, shardings, ctx.mesh, ctx.rules)
    data = batches(task, ctx.tokenizer, sft_cfg.batch_size, sft_cfg.max_len, ctx.config.seed, start=run.start_step)

    def batch_at(step: int) -> dict[str, Any]:  # called in step order: the stream is the data position
      batch = next(data)
      batch["host_metrics"] = {"sft/truncated": int(batch.pop("truncated"))}
      return batch

    spec = loop.LoopSpec(stage, sft_cfg.steps, sft_cfg.log_every, batch_at, console=(("sft/accuracy", "token acc"),),
                         curves=("train/loss", "sft/accuracy", "train/grad_norm"))
    state, metrics = loop.run_steps(ctx, run, state, update, spec, jax.random.fold_in(ctx.key, 1), run.log)
    run.finish()
  ctx.policy = state.params
  return metrics
