"""The one rollout batch type, from the sampler to `prepare`: a device half (the `Rollout` the sampler wrote) and a
host half (what the host fetched once, decoded and scored), a group's rows adjacent.

A single-turn batch is born dispatched (`host` None: the device may still be sampling it) and is scored once
(`rl_lm.train.source`). A multi-turn batch is born with its host half, the episodes having run to their end
(`rl_lm.envs.episodes.EpisodeRunner.run`): the same fields, the return as the score, the transcript as the text,
and the episodes' own account beside them (verdicts, turns, tool calls).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm.rollout.types import Rollout
from rl_lm.tasks.base import Problem


@dataclasses.dataclass
class Host:
  """A rollout's host half, one entry per row."""

  tokens: np.ndarray  # [B, T] int32: the device rollout's tokens, fetched once
  lengths: np.ndarray  # [B] int32: the policy's tokens
  finished: np.ndarray  # [B] bool: ended on a stop token (an episode: ended by its environment or a task failure)
  texts: list[str]  # the completions (an episode: its transcript)
  scores: np.ndarray  # [B] float32: what trains (a learned reward's proxy when one is configured)
  valid: np.ndarray  # [B] bool: the verifier (or environment) decided; False rows are masked, never scored 0
  success: np.ndarray  # [B] bool
  statuses: list[str]  # the verifier's status, or the episode's verdict
  staleness: np.ndarray  # [B] float32: updates applied between sampling the row and training on it
  gold: np.ndarray | None = None  # [B] the configured rewards beside a learned one (NaN where invalid)
  # Multi-turn episodes only (None for single-turn completions):
  verdicts: list[Any] | None = None  # the failure classifier's `envs.failures.Verdict` per episode
  turns: np.ndarray | None = None  # [B] int32: the policy's turns
  tool_calls: np.ndarray | None = None  # [B] int32
  injected: np.ndarray | None = None  # [B] bool: an injected crash or hang reached the episode (or its worker)
  fill: np.ndarray | None = None  # [B] int32: the episode's real slots in `tokens` (observations and turns)


@dataclasses.dataclass
class RolloutBatch:
  """One rollout: which step trains on it, which policy version sampled it, its problems, and its two halves."""

  step: int  # the step it trains at (0: one of dynamic sampling's extra rollouts)
  version: int  # updates applied to the policy that sampled it
  problems: list[Problem]  # one per row
  device: Rollout  # on device: tokens, masks, sampler log-probs [B, T]; lengths, finished [B]
  host: Host | None = None  # None until scored
  seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # multi-turn: "policy" (the turns on device,
  # tokens to the host) and "env" (the environments' resets and steps), wall time
  by_teacher: bool = False  # sampled by the distillation teacher, not the policy (rl.distill.on_policy < 1)

  @staticmethod
  def select(parts: Sequence[RolloutBatch], rows: np.ndarray, take: Callable[[Any, np.ndarray], Any]
             ) -> RolloutBatch:
    """Rows `rows` of scored parts laid end to end; `take(rollout, rows)` gathers the device arrays."""
    hosts = [p.host for p in parts]

    def field(name: str) -> Any:
      values = [getattr(h, name) for h in hosts]
      if values[0] is None:
        return None
      if isinstance(values[0], list):
        every = [x for v in values for x in v]
        return [every[i] for i in rows]
      return np.concatenate(values)[rows]

    every = [p for part in parts for p in part.problems]
    device = take(jax.tree.map(lambda *xs: jnp.concatenate(xs), *[p.device for p in parts]), rows)
    host = Host(**{f.name: field(f.name) for f in dataclasses.fields(Host)})
    return RolloutBatch(parts[0].step, parts[0].version, [every[i] for i in rows], device, host,
                        by_teacher=parts[0].by_teacher)
