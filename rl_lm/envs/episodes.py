"""Multi-turn episodes, token in and token out: the policy's turns sampled on device, the environment's replies
appended as tokens, one KV cache carried across the turns.

Layout and the turn on device: `rl_lm.rollout.turns` (one jit per observation width, the decode engine's loop;
the result is a `Rollout` with `prompt_mask` = observation tokens and `completion_mask` = sampled tokens, which the
RL step (rl_lm/train/rl_update.py) trains on unchanged: its losses and KL see only `completion_mask`).

The host, between turns: fetches the turns that ended (once per device call), decodes each to text, steps the
environments (in worker processes, rl_lm/envs/workers.py, or in this process), frames their observations as
tokens (`Framing`), and classifies every ended episode (rl_lm/envs/failures.py). With continuous batching a row
whose episode ended takes the next one while the other rows' turns are still in flight. Random draws: episode e's
turn t uses fold_in(fold_in(rng, e), t), so an episode does not depend on the other episodes' lengths, nor on the
schedule.

Nothing the policy writes can stop the run. Text crosses into tokens at three places, each guarded, and what
fails there ends that episode only, classified and counted (the rule: rl_lm/envs/failures.py):
- decoding the policy's turn (`tok.decode`): a failure is the model's (its own tokens);
- framing an observation (`Framing.frame`): not text, refused by the tokenizer, oversized, or the chat
  template's renderer failing (rl_lm/envs/failures.py says whose failure each is);
- the environment's answer itself (`_account`): not a `base.Step`, a reward that is not a finite
  number, an `info` that is not a dict: the environment's failure.
Transcripts and failure reasons hold `text.visible` text (valid Unicode, control characters escaped), so they
can be printed, logged and written to JSON whatever the policy or a tool produced.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from rl_lm import keys as keys_lib
from rl_lm import mesh as mesh_lib
from rl_lm import sampling
from rl_lm.chat import ChatTemplateError
from rl_lm.envs import base, failures
from rl_lm.envs import text as text_lib
from rl_lm.models.presets import ModelConfig
from rl_lm.rollout import turns
from rl_lm.rollout.batch import Host, RolloutBatch
from rl_lm.tasks.base import Problem

# --- framing: text at the environment boundary, tokens inside -------------------------------------------


CHARS_PER_SLOT = 32  # an observation of more characters than this per slot of the episode is refused unencoded
TRANSCRIPT_OBS_CHARS = 2000  # what a transcript keeps of an observation that could not be framed


class Framing:
  """How the environment's texts become tokens: the first observation as the task's prompt
  (`tok.encode_prompt`: the chat template's user turn and generation prompt, or bos + text), the later ones
  as what follows the policy's stop token (`tok.encode_reply`: the template's user turn after the assistant's
  end of turn, or the text itself for a tokenizer without a template).

  `first` and `next` raise what the tokenizer raises (for callers that own their text: SFT demonstrations);
  the episode runner calls `frame`, which never raises. `slots`: the episode's buffer size, which bounds an
  observation (None: unbounded)."""

  def __init__(self, tok: Any, slots: int | None = None):
    self.tok, self.slots = tok, slots

  def first(self, observation: str) -> list[int]:
    return list(self.tok.encode_prompt(observation))

  def next(self, observation: str) -> list[int]:
    encode_reply = getattr(self.tok, "encode_reply", None)
    return list(encode_reply(observation) if encode_reply else self.tok.encode(observation))

  def frame(self, observation: Any, source: str, first: bool = False) -> list[int] | failures.Verdict:
    """The observation's tokens (`first`: as the episode's prompt), or why it cannot become tokens, as the
    episode's failure: `source`'s ("model" or "environment", `failures.observation_source`) unless said.
      (1) not a `str`: the environment's (it broke the interface);
      (2) more than CHARS_PER_SLOT characters a slot: oversized, refused before the tokenizer spends time on it
          (no real tokenizer averages 32 characters a token, so it could not fit);
      (3) a lone surrogate: not text (`text.first_surrogate`);
      (4) the chat template failed to render it (`ChatTemplateError`): the environment's;
      (5) the tokenizer raised on it (a character outside the character tokenizer's alphabet, anything else);
      (6) as many tokens as the episode's whole buffer: oversized (it could never fit with a reply)."""
    unframed = failures.UNFRAMED
    if not isinstance(observation, str):
      return failures.Verdict("environment", f"{unframed}: {type(observation).__name__}, not str")
    if self.slots is not None and len(observation) > CHARS_PER_SLOT * self.slots:
      return failures.Verdict(source, f"{unframed}: oversized ({len(observation)} characters)")
    at = text_lib.first_surrogate(observation)
    if at >= 0:
      return failures.Verdict(source, f"{unframed}: not valid Unicode (a lone surrogate at character {at})")
    try:
      ids = self.first(observation) if first else self.next(observation)
    except ChatTemplateError as e:  # before ValueError, which it is: the renderer, not the text
      return failures.Verdict("environment", f"{unframed}: {e}")
    except Exception as e:  # noqa: BLE001 -- whatever the tokenizer raises on this text, the text's producer's
      return failures.Verdict(source, f"{unframed}: cannot be encoded ({type(e).__name__}: {e})")
    if self.slots is not None and len(ids) >= self.slots:
      return failures.Verdict(source, f"{unframed}: oversized ({len(ids)} tokens, the episode holds {self.slots})")
    return ids


def _decode(tok: Any, ids: np.ndarray) -> tuple[str, str]:
  """The policy's turn as text, and "" or why it cannot be decoded (the model's failure: its tokens)."""
  try:
    out = tok.decode(ids)
    if not isinstance(out, str):
      raise TypeError(f"decode returned {type(out).__name__}")
    return out, ""
  except Exception as e:  # noqa: BLE001 -- any decoding failure ends this episode, not the run
    return "", f"turn cannot be decoded ({type(e).__name__}: {e})"


class _Account(NamedTuple):
  """What the runner takes from one `base.Step`, read once and checked."""

  reward: float
  done: bool
  success: bool  # when done
  calls: int
  model_failure: str  # "" or the reason of the policy's protocol error
  source: str  # who produced the observation (failures.observation_source)


def _account(step: Any) -> _Account | str:
  """The step's account, or why the environment's answer breaks the `base.Step` contract (its failure): the
  runner's bookkeeping must not raise on it, and a reward that is not a finite number must not reach the
  advantages."""
  if not isinstance(step, base.Step):
    return f"step returned {type(step).__name__}, not a Step"
  if not isinstance(step.info, dict):
    return f"step info is {type(step.info).__name__}, not a dict"
  info = step.info
  try:
    reward, done, calls = float(step.reward), bool(step.done), int(info.get("tool_calls", 0))
    success = bool(info.get("success", reward > 0))
    model = str(info.get("reason", "protocol error")) if info.get("failure") == "model" else ""
  except Exception as e:  # noqa: BLE001 -- a value that will not convert (an array's truth, a bad __str__)
    return f"malformed step ({type(e).__name__}: {e})"
  if not math.isfinite(reward):
    return f"step reward is {reward}"
  if calls < 0:
    return f"step tool_calls is {calls}"
  return _Account(reward, done, success, calls, model, failures.observation_source(info))


# --- the host loop ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
  """Where an episode ends besides `done` (from `config.env`)."""

  max_turns: int  # the policy's turns
  turn_tokens: int  # tokens of one turn (its stop token included)
  max_tokens: int  # the whole episode: observations and turns (the buffer and cache size S)


_EPISODE_IDS = itertools.count()


def _shown(observation: Any, framed: bool) -> str:
  """An observation as a transcript holds it: `text.visible`, and clipped when it could not be framed (it may
  be huge, or not even a str)."""
  shown = text_lib.visible(observation if isinstance(observation, str) else repr(observation))
  return shown if framed else text_lib.clip(shown, TRANSCRIPT_OBS_CHARS)


def _bucket(n: int) -> int:
  """Observation chunks are padded to a power of two (at least 8): a handful of compiled turn shapes."""
  return max(8, 1 << max(0, int(n - 1).bit_length()))


class EpisodeRunner:
  """Runs batches of `rows` episodes of one environment with the policy's parameters.

  `slots` 0: the episodes' turns in lockstep, one cache row each (a turn ends when its batch's longest turn ends).
  `slots` > 0: continuous batching over that many cache rows: a row whose turn ends goes back to the host while the
  other rows decode on (the device returns once a quarter of the rows wait), and a row whose episode ends takes the
  next episode. Row b's episode draws the same tokens either way (a key per episode and turn).

  `envs`: an object with `reset([(id, problem, seed)]) -> [Outcome]`, `step([(id, action, fault)]) -> [Outcome]`
  and `close_episodes(ids)` (rl_lm/envs/workers.py `EnvPool`, or `LocalEnvs` in this process).
  `faults(rows, turn) -> [fault label]` injects faults into the steps of those rows of the batch at that turn
  (config.env.faults); None: none.
  """

  def __init__(self, model_cfg: ModelConfig, scfg: sampling.SamplingConfig, tok: Any, envs: Any, limits: EpisodeLimits,
               rows: int, mesh: jax.sharding.Mesh | None = None, rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES,
               faults: Callable[[Sequence[int], int], list[str]] | None = None, slots: int = 0):
    self.model_cfg, self.scfg, self.tok, self.envs, self.limits, self.rows = model_cfg, scfg, tok, envs, limits, rows
    self.mesh, self.rules, self.faults = mesh, rules, faults
    self.framing = Framing(tok, limits.max_tokens)
    self.slots = min(slots, rows) if slots else rows  # cache rows
    self._wait = max(1, self.slots // 4) if slots else self.slots  # turns that end before the device returns
    self._advance = turns.make_advance_fn(model_cfg, scfg, mesh, rules)
    K = max(len(scfg.stop_tokens), 1)
    self._init = jax.jit(functools.partial(turns.init_state, model_cfg, scfg, self.slots, limits.max_tokens,
                                           limits.turn_tokens, K))
    self._episodes = jax.jit(functools.partial(turns.init_episodes, scfg, rows, limits.max_tokens))
    self._retire = jax.jit(turns.retire, donate_argnums=(1,))
    self._rollout = jax.jit(turns.to_rollout)

  def _frame(self, tracker: failures.Tracker, observation: Any, source: str, first: bool = False
             ) -> list[int] | None:
    """The observation's tokens, or None with the episode's failure recorded (`Framing.frame`)."""
    ids = self.framing.frame(observation, source, first)
    if isinstance(ids, failures.Verdict):
      tracker.fail(ids)
      return None
    return ids

  def _observe(self, tracker: failures.Tracker, out: Any) -> tuple[_Account | None, list[int] | None, str]:
    """The host's side of one environment step (`out`: its `workers.Outcome`), recorded in `tracker`: the step's
    account (None: the environment failed), the observation's tokens the episode reads next (None: the episode
    ended), and what the transcript adds. Never raises (tests/test_episode_fuzz.py drives it with hostile text)."""
    step = _account(out.value) if out.ok else f"{out.failure}: {out.detail}"[:200]
    if isinstance(step, str):
      tracker.environment(step)
      return None, None, ""
    if step.model_failure:
      tracker.model(step.model_failure)
    if step.done:
      tracker.finish(step.success)
      return step, None, ""
    observation = out.value.observation
    ids = self._frame(tracker, observation, step.source)
    return step, ids, f"\n<obs> {_shown(observation, ids is not None)}"

  def _put(self, x: Any) -> Any:
    """Host arrays (one, or a tuple of arrays over the same rows: one transfer) copied to the device with the batch
    sharding (`mesh_lib.put`: the loop resets `restart` and `retire` while the call is queued)."""
    rows = jax.tree.leaves(x)[0].shape[:1]
    return mesh_lib.put(x, None if self.mesh is None else mesh_lib.batch_sharding(self.mesh, self.rules, rows))

  def _scalar(self, x: int) -> jax.Array:
    return mesh_lib.put(np.int32(x), None if self.mesh is None else mesh_lib.replicated(self.mesh))

  def run(self, params: Any, problems: Sequence[Problem], rng: jax.Array, seeds: Sequence[int]) -> RolloutBatch:
    """One episode per problem (exactly `rows`), `seeds[b]` seeding episode b's environment: the batch with its
    host half (the return as the score, the verdict as the status, the transcript as the text; staleness 0 and
    step 0, for the caller to set)."""
    Q, R, S, lim = self.rows, self.slots, self.limits.max_tokens, self.limits
    rng = keys_lib.as_key(rng)
    if len(problems) != Q:
      raise ValueError(f"EpisodeRunner.run takes exactly {Q} problems, got {len(problems)}")
    ids = [next(_EPISODE_IDS) for _ in range(Q)]  # unique in the process: runners may share one pool
    tracker = [failures.Tracker() for _ in range(Q)]
    returns = np.zeros((Q,), np.float32)
    success = np.zeros((Q,), bool)
    turns_taken = np.zeros((Q,), np.int32)
    calls = np.zeros((Q,), np.int32)
    transcripts = [""] * Q
    pending: list[list[int] | None] = [None] * Q  # the observation tokens each episode reads next
    clock = {"policy": 0.0, "env": 0.0}
    start = time.perf_counter()
    resets = self.envs.reset([(ids[b], problems[b], int(seeds[b])) for b in range(Q)])
    clock["env"] += time.perf_counter() - start
    for b, out in enumerate(resets):
      if not out.ok:
        tracker[b].environment(f"reset: {out.failure}: {out.detail}"[:200])
        continue
      pending[b] = self._frame(tracker[b], out.value, "environment", first=True)
      transcripts[b] = _shown(out.value, pending[b] is not None)
    stops = np.asarray(self.scfg.stop_tokens or (-1,), np.int32)
    stop_dev = self._put(np.ascontiguousarray(np.broadcast_to(stops, (R, stops.shape[0]))))
    state, results = self._init(), self._episodes()
    fill = np.zeros((R,), np.int32)  # host copies of the rows' buffers: fill and tokens
    host_tokens = np.full((Q, S), self.scfg.pad_id, np.int32)
    final_fill = np.zeros((Q,), np.int32)
    episode = np.full((R,), -1, np.int32)  # the episode each row holds (-1: none)
    queue = list(range(Q))[::-1]  # episodes not started yet, next last
    flying = np.zeros((R,), bool)  # a turn in flight
    budget = np.zeros((R,), np.int32)
    turn_no = np.zeros((R,), np.int32)
    restart = np.zeros((R,), bool)
    retire = np.full((R,), Q, np.int32)  # rows whose episode is copied out before the next call
    obs_n = np.zeros((R,), np.int32)  # the length of the observation that started the turn in flight

    def finish(r: int) -> None:  # row r's episode is over: copied out (if it took a turn), the row freed
      b = episode[r]
      if pending[b] is not None and turns_taken[b] >= lim.max_turns:
        tracker[b].model("turn limit")  # still talking when the turns ran out
      pending[b] = None
      if turns_taken[b]:
        retire[r], final_fill[b], host_tokens[b] = b, fill[r], row_tokens[r]
      episode[r] = -1

    row_tokens = np.zeros((R, S), np.int32)
    while True:
      # Every row without a turn in flight: its episode's next observation, or the next episode.
      obs_ids: dict[int, list[int]] = {}
      for r in range(R):
        while not flying[r]:
          if episode[r] < 0:
            if not queue:
              break
            episode[r], restart[r], fill[r], turn_no[r] = queue.pop(), True, 0, 0
          b = episode[r]
          ids_b = pending[b]
          if ids_b is not None and turns_taken[b] < lim.max_turns and S - fill[r] - len(ids_b) < 1:
            tracker[b].model("token budget exhausted")  # no room for the observation and one token of a reply
            ids_b = pending[b] = None
          if ids_b is None or turns_taken[b] >= lim.max_turns:
            finish(r)
            continue
          obs_ids[r], obs_n[r], flying[r] = ids_b, len(ids_b), True
          budget[r], turn_no[r] = min(lim.turn_tokens, S - fill[r] - len(ids_b)), turns_taken[b]
      if retire.min() < Q:  # before the rows are reused
        results = self._retire(state, results, self._put(retire))
        retire[:] = Q
      if not flying.any():
        break
      width = _bucket(max([len(v) for v in obs_ids.values()], default=1))
      obs = np.full((R, width), self.tok.pad_id, np.int32)
      obs_len = np.zeros((R,), np.int32)
      for r, ids_r in obs_ids.items():
        obs[r, : len(ids_r)] = ids_r
        obs_len[r] = len(ids_r)
      start = time.perf_counter()
      state, ended, stopped = self._advance(
        params, state, *self._put((obs, obs_len, budget, restart, np.maximum(episode, 0), turn_no)), rng, stop_dev,
        self._scalar(max(0, int(flying.sum()) - self._wait)))
      restart[:] = False
      new_fill, ended, stopped, row_tokens = mesh_lib.fetch((state.fill, ended, stopped, state.tokens))
      clock["policy"] += time.perf_counter() - start
      if not ended.any():  # the device decodes until a turn ends: rows in flight that it does not hold are a bug
        raise RuntimeError(f"episodes: a device call ended no turn; rows in flight {np.flatnonzero(flying).tolist()}, "
                           f"fills {fill.tolist()}, budgets {budget.tolist()}")
      actions, said = [], {}
      for r in np.flatnonzero(ended):
        b = episode[r]
        flying[r] = False
        turn_ids = row_tokens[r, fill[r] + obs_n[r]: new_fill[r]]
        text, undecodable = _decode(self.tok, turn_ids)
        turns_taken[b] += 1
        transcripts[b] += f"\n<turn {turns_taken[b]}> {text_lib.visible(text)}"
        tracker[b].turn(turn_ids.tolist(), text, bool(stopped[r]))
        said[r] = text
        if undecodable:
          tracker[b].model(undecodable)
          pending[b] = None
        elif not stopped[r]:  # cut at its budget: the policy ran on
          tracker[b].model("turn token budget exhausted" if new_fill[r] < S else "token budget exhausted")
          pending[b] = None
        elif tracker[b].repeating():
          tracker[b].model("repetition loop")
          pending[b] = None
        else:
          actions.append(r)
      fill = np.where(ended, new_fill, fill)
      faults = [self.faults([episode[r]], turns_taken[episode[r]] - 1)[0] if self.faults else "" for r in actions]
      start = time.perf_counter()
      outcomes = self.envs.step([(ids[episode[r]], said[r], f) for r, f in zip(actions, faults, strict=True)])
      clock["env"] += time.perf_counter() - start
      for r, fault, out in zip(actions, faults, outcomes, strict=True):
        b = episode[r]
        # The ground truth for measuring the classifier: an injected crash or hang reached this episode, directly
        # or by taking down the worker that held it (a replaced worker's episodes are lost with it; with faults
        # injected into an environment that has none of its own, every replacement is an injected fault's doing).
        collateral = not out.ok and out.detail.startswith("worker replaced")
        tracker[b].injected = tracker[b].injected or fault in ("crash", "hang") or collateral
        step, pending[b], shown = self._observe(tracker[b], out)
        transcripts[b] += shown
        if step is not None:
          returns[b] += step.reward
          calls[b] += step.calls
          success[b] = step.done and step.success
    self.envs.close_episodes(ids)
    verdicts = [t.verdict() for t in tracker]
    finished = np.asarray([v.outcome in ("success", "task") for v in verdicts], bool)
    rollout = self._rollout(results, self._put(finished))
    host = Host(
      host_tokens, np.asarray(mesh_lib.fetch(rollout.lengths)), finished, transcripts, returns,
      np.asarray([v.trains for v in verdicts], bool), success & finished,
      [f"{v.outcome}: {v.reason}" if v.reason else v.outcome for v in verdicts], np.zeros((Q,), np.float32),
      verdicts=verdicts, turns=turns_taken, tool_calls=calls,
      injected=np.asarray([t.injected for t in tracker], bool), fill=final_fill)
    return RolloutBatch(0, 0, list(problems), rollout, host, seconds=clock)


class LocalEnvs:
  """Environments in this process, behind `EnvPool`'s calls: no isolation and no timeouts (a hang hangs the run),
  for tests and environments too cheap to ship to a worker. An exception is an environment failure all the
  same. Injected crash and hang faults cannot be honoured here (config.env.workers >= 1 does)."""

  def __init__(self, make: Callable[[], Any]):
    self._make = make
    self._envs: dict[int, Any] = {}

  def reset(self, episodes: Sequence[tuple[int, Problem, int]]) -> list[Any]:
    from rl_lm.envs.workers import Outcome

    out = []
    for eid, problem, seed in episodes:
      try:
        env = self._make()
        self._envs[eid] = env
        out.append(Outcome(True, env.reset(problem, np.random.default_rng(seed))))
      except Exception as e:  # noqa: BLE001 -- any exception of an environment is its failure
        out.append(Outcome(False, None, "reset_failure", f"{type(e).__name__}: {e}"))
    return out

  def step(self, actions: Sequence[tuple[int, str, str]]) -> list[Any]:
    from rl_lm.envs.workers import Outcome

    out = []
    for eid, action, fault in actions:
      if fault in ("crash", "hang"):
        raise ValueError(f"injected {fault} faults need environment workers (config.env.workers >= 1)")
      try:
        out.append(Outcome(True, self._envs[eid].step(action)))
      except Exception as e:  # noqa: BLE001
        out.append(Outcome(False, None, "error", f"{type(e).__name__}: {e}"))
    return out

  def close_episodes(self, ids: Sequence[int]) -> None:
    for eid in ids:
      env = self._envs.pop(eid, None)
      if env is not None:
        try:
          env.close()
        except Exception:  # noqa: BLE001, S110 -- closing is best effort
          pass

  def close(self) -> None:
    self.close_episodes(list(self._envs))
