"""Multi-turn episodes, token in and token out: the policy's turns sampled on device, the environment's replies
appended as tokens, one KV cache carried across the turns.

Layout. Each row is one episode, written left to right from slot 0 of an S-slot buffer (S =
`config.env.max_tokens`): the first observation (the prompt), the policy's first turn, the next observation,
and so on. `fill[b]` slots are real. `sampled[b, t]` marks the policy's tokens (the stop token that ends each
turn included), which train and carry the sampler's log-probs; every other real slot is an observation token,
which never trains. No slot is padding inside an episode, so the trainer scores the row with the attention
mask `slots < fill` and positions 0, 1, 2, ... exactly as the sampler ran it: the result is a
`sampling.Rollout` with `prompt_mask` = observation tokens and `completion_mask` = sampled tokens, and the RL
step (rl_lm/train/rl_update.py) trains on it unchanged: its losses and KL see only `completion_mask`.

One turn on device (`_turn`, one jit per observation width O): the rows' observation chunks [B, O] are
prefilled at each row's own cache offset (`transformer.forward_cached` with a per-row index), the first token
is drawn from the logits at each row's last observation token, and a `lax.while_loop` decodes one token per
row per step until every row has stopped (a stop token, its turn budget, or the end of the buffer). A last
step feeds each row's final token, so the cache holds the whole episode and the next turn prefills only its
new observation: no re-prefill of the history, nothing re-tokenised.

The host, between turns: fetches the new tokens (once per turn), decodes each row's turn to text, steps the
environments (in worker processes, rl_lm/envs/workers.py, or in this process), frames their observations as
tokens (`Framing`), and classifies every ended episode (rl_lm/envs/failures.py). Random draws: turn t of a
batch uses fold_in(rng, t) and rows draw from fold_in(that, row), so a row's episode does not depend on the
batch's other rows' lengths.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm import mesh as mesh_lib
from rl_lm import sampling
from rl_lm.envs import failures
from rl_lm.models import transformer
from rl_lm.models.presets import ModelConfig
from rl_lm.tasks.base import Problem


class EpisodeState(NamedTuple):
  """The device side of a batch of episodes."""

  cache: transformer.KVCache
  tokens: jax.Array  # [B, S] int32
  sampled: jax.Array  # [B, S] bool: the policy's tokens
  logprobs: jax.Array  # [B, S] float32: sampler log-probs of sampled tokens, 0 elsewhere
  fill: jax.Array  # [B] int32: real slots (all of them in the cache, after a turn)


def init_state(model_cfg: ModelConfig, cfg: sampling.SamplingConfig, rows: int, slots: int) -> EpisodeState:
  dtype = jnp.dtype(cfg.cache_dtype) if cfg.cache_dtype else model_cfg.compute_dtype
  return EpisodeState(transformer.init_cache(model_cfg, rows, slots, dtype), jnp.full((rows, slots), cfg.pad_id,
                      jnp.int32), jnp.zeros((rows, slots), bool), jnp.zeros((rows, slots), jnp.float32),
                      jnp.zeros((rows,), jnp.int32))


def _turn(model_cfg: ModelConfig, cfg: sampling.SamplingConfig, params: Any, state: EpisodeState, obs: jax.Array,
          obs_len: jax.Array, budget: jax.Array, rng: jax.Array, stop_tokens: jax.Array
          ) -> tuple[EpisodeState, jax.Array]:
  """Appends each row's observation obs[b, :obs_len[b]] and samples the policy's turn, at most budget[b] tokens
  (rows with obs_len 0 or budget 0 sit the turn out). -> (state, stopped [B]: the turn ended on a stop token)."""
  cache, tokens, sampled, logprobs, fill = state
  B, O = obs.shape  # noqa: E741 -- O: the observation width, as in the shape comments
  S = tokens.shape[1]
  rows, slots = jnp.arange(B), jnp.arange(S)[None, :]
  keys = jax.vmap(lambda b: jax.random.fold_in(rng, b))(rows)  # [B] keys: a row's draws are its own
  obs_len = jnp.minimum(obs_len, S - fill)
  live = (obs_len > 0) & (budget > 0)
  obs_len = jnp.where(live, obs_len, 0)

  def is_stop(tok):  # [B] -> [B]
    return jnp.any(tok[:, None] == stop_tokens, axis=-1)

  # PREFILL the observation at each row's own offset; the first token comes from its last observation token.
  at = fill[:, None] + jnp.arange(O)[None, :]  # [B, O]
  real = jnp.arange(O)[None, :] < obs_len[:, None]
  tokens = tokens.at[rows[:, None], jnp.where(real, at, S)].set(obs, mode="drop")
  end = fill + obs_len
  logits, cache = transformer.forward_cached(model_cfg, params, obs, at, cache, fill, slots < end[:, None],
                                             take=obs_len - 1)
  tok, logp = sampling.sample_token(logits[:, 0], jax.vmap(jax.random.fold_in)(keys, jnp.zeros_like(rows)), cfg)

  def write(tokens, sampled, logprobs, fill, tok, logp, writing):
    at = jnp.where(writing, fill, S)  # slot S: out of range, dropped
    return (tokens.at[rows, at].set(tok, mode="drop"), sampled.at[rows, at].set(True, mode="drop"),
            logprobs.at[rows, at].set(logp, mode="drop"), fill + writing.astype(jnp.int32))

  fill = end
  writing = live & (fill < S)
  last = tokens[rows, jnp.maximum(fill - 1, 0)]  # what a row that sits the turn out feeds: its own last token
  tokens, sampled, logprobs, fill = write(tokens, sampled, logprobs, fill, tok, logp, writing)
  stopped = writing & is_stop(tok)
  done = ~writing | stopped | (budget <= 1) | (fill >= S)

  # DECODE: feed each row's last token at its slot fill - 1, draw the next, until every row is done.
  def cond(carry):
    return ~jnp.all(carry[4])

  def body(carry):
    i, cache, tokens, sampled, done, stopped, logprobs, fill, prev = carry
    pos = jnp.maximum(fill - 1, 0)
    logits, cache = transformer.forward_cached(model_cfg, params, prev[:, None], pos[:, None], cache, pos,
                                               slots <= pos[:, None])
    tok, logp = sampling.sample_token(logits[:, 0], jax.vmap(jax.random.fold_in)(keys, jnp.full_like(rows, i)), cfg)
    writing = ~done
    tokens, sampled, logprobs, fill = write(tokens, sampled, logprobs, fill, tok, logp, writing)
    hit = writing & is_stop(tok)
    done = done | hit | (i + 1 >= budget) | (fill >= S)
    prev = jnp.where(writing, tok, prev)
    return i + 1, cache, tokens, sampled, done, stopped | hit, logprobs, fill, prev

  # Every row feeds its own last token: a row that is done rewrites that token's cache entry with what it
  # already held (same token, position and context), so the batch decodes in lockstep without corrupting it.
  carry = (jnp.int32(1), cache, tokens, sampled, done, stopped, logprobs, fill, jnp.where(writing, tok, last))
  _, cache, tokens, sampled, _, stopped, logprobs, fill, prev = jax.lax.while_loop(cond, body, carry)
  # The turn's last token into the cache, so the next observation attends to the whole episode.
  pos = jnp.maximum(fill - 1, 0)
  _, cache = transformer.forward_cached(model_cfg, params, prev[:, None], pos[:, None], cache, pos,
                                        slots <= pos[:, None])
  return EpisodeState(cache, tokens, sampled, logprobs, fill), stopped


def make_turn_fn(model_cfg: ModelConfig, cfg: sampling.SamplingConfig, mesh: jax.sharding.Mesh | None = None,
                 rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES) -> Callable[..., tuple[EpisodeState, jax.Array]]:
  """jit(params, state, obs [B, O], obs_len [B], budget [B], rng, stop_tokens [B, K]) -> (state, stopped [B]),
  the state donated (its cache is written in place)."""
  return jax.jit(mesh_lib.bind(functools.partial(_turn, model_cfg, cfg), mesh, rules), donate_argnums=(1,))


def to_rollout(state: EpisodeState, finished: jax.Array) -> sampling.Rollout:
  """The episodes as the RL step's `sampling.Rollout`: observation tokens as the prompt mask, the policy's tokens
  as the completion mask (see the module docstring)."""
  real = jnp.arange(state.tokens.shape[1])[None, :] < state.fill[:, None]
  return sampling.Rollout(tokens=state.tokens, prompt_mask=real & ~state.sampled, completion_mask=state.sampled,
                          logprobs=jnp.where(state.sampled, state.logprobs, 0.0),
                          lengths=jnp.sum(state.sampled, axis=1).astype(jnp.int32), finished=finished)


# --- framing: text at the environment boundary, tokens inside -------------------------------------------


class Framing:
  """How the environment's texts become tokens: the first observation as the task's prompt
  (`tok.encode_prompt`: the chat template's user turn and generation prompt, or bos + text), the later ones
  as what follows the policy's stop token (`tok.encode_reply`: the template's user turn after the assistant's
  end of turn, or the text itself for a tokenizer without a template)."""

  def __init__(self, tok: Any):
    self.tok = tok

  def first(self, observation: str) -> list[int]:
    return list(self.tok.encode_prompt(observation))

  def next(self, observation: str) -> list[int]:
    encode_reply = getattr(self.tok, "encode_reply", None)
    return list(encode_reply(observation) if encode_reply else self.tok.encode(observation))


# --- the host loop ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
  """Where an episode ends besides `done` (from `config.env`)."""

  max_turns: int  # the policy's turns
  turn_tokens: int  # tokens of one turn (its stop token included)
  max_tokens: int  # the whole episode: observations and turns (the buffer and cache size S)


@dataclasses.dataclass
class EpisodeBatch:
  """A batch of finished episodes: the device rollout and the host's account of each."""

  rollout: sampling.Rollout  # on device, [B, S]
  host: dict[str, np.ndarray]  # tokens [B, S], lengths [B] (sampled tokens), finished [B], fill [B]
  returns: np.ndarray  # [B] float32: the sum of the environment's rewards
  success: np.ndarray  # [B] bool
  verdicts: list[failures.Verdict]  # one per episode: success / task / model / environment, and why
  turns: np.ndarray  # [B] int32: the policy's turns
  tool_calls: np.ndarray  # [B] int32
  transcripts: list[str]  # each episode as text, turns marked, for reading
  injected: np.ndarray  # [B] bool: an injected crash or hang reached the episode (or its worker)
  seconds: dict[str, float]  # wall time: "policy" (the turns on device, tokens to the host), "env" (resets, steps)


_EPISODE_IDS = itertools.count()


def _bucket(n: int) -> int:
  """Observation chunks are padded to a power of two (at least 8): a handful of compiled turn shapes."""
  return max(8, 1 << max(0, int(n - 1).bit_length()))


class EpisodeRunner:
  """Runs batches of `rows` episodes of one environment with the policy's parameters.

  `envs`: an object with `reset([(id, problem, seed)]) -> [Outcome]`, `step([(id, action, fault)]) -> [Outcome]`
  and `close_episodes(ids)` (rl_lm/envs/workers.py `EnvPool`, or `LocalEnvs` in this process).
  `faults(rows, turn) -> [fault label]` injects faults into the steps of those rows of the batch at that turn
  (config.env.faults); None: none.
  """

  def __init__(self, model_cfg: ModelConfig, scfg: sampling.SamplingConfig, tok: Any, envs: Any, limits: EpisodeLimits,
               rows: int, mesh: jax.sharding.Mesh | None = None, rules: mesh_lib.Rules = mesh_lib.DEFAULT_RULES,
               faults: Callable[[Sequence[int], int], list[str]] | None = None):
    self.model_cfg, self.scfg, self.tok, self.envs, self.limits, self.rows = model_cfg, scfg, tok, envs, limits, rows
    self.mesh, self.rules, self.faults = mesh, rules, faults
    self.framing = Framing(tok)
    self._turn = make_turn_fn(model_cfg, scfg, mesh, rules)
    self._init = jax.jit(functools.partial(init_state, model_cfg, scfg, rows, limits.max_tokens))
    self._rollout = jax.jit(to_rollout)

  def _put(self, x: np.ndarray) -> jax.Array:
    if self.mesh is None:
      return jnp.asarray(x)
    return mesh_lib.put(x, mesh_lib.batch_sharding(self.mesh, self.rules, x.shape))

  def run(self, params: Any, problems: Sequence[Problem], rng: jax.Array, seeds: Sequence[int]) -> EpisodeBatch:
    """One episode per problem (exactly `rows`), `seeds[b]` seeding row b's environment."""
    B, S, lim = self.rows, self.limits.max_tokens, self.limits
    if len(problems) != B:
      raise ValueError(f"EpisodeRunner.run takes exactly {B} problems, got {len(problems)}")
    ids = [next(_EPISODE_IDS) for _ in range(B)]  # unique in the process: runners may share one pool
    tracker = [failures.Tracker() for _ in range(B)]
    returns = np.zeros((B,), np.float32)
    success = np.zeros((B,), bool)
    turns = np.zeros((B,), np.int32)
    calls = np.zeros((B,), np.int32)
    transcripts = [""] * B
    pending: list[list[int] | None] = [None] * B  # the observation tokens each live row reads next
    clock = {"policy": 0.0, "env": 0.0}
    start = time.perf_counter()
    resets = self.envs.reset([(ids[b], problems[b], int(seeds[b])) for b in range(B)])
    clock["env"] += time.perf_counter() - start
    for b, out in enumerate(resets):
      if not out.ok:
        tracker[b].environment(f"reset: {out.failure}: {out.detail}"[:200])
        continue
      pending[b] = self.framing.first(out.value)
      transcripts[b] = out.value
    stop = np.asarray(sampling.stop_and_budget(self.scfg, B, None, None)[0])
    stop_dev = self._put(stop)
    state = self._init()
    fill = np.zeros((B,), np.int32)
    host_tokens = np.zeros((B, S), np.int32)
    for turn in range(lim.max_turns):
      live = [b for b in range(B) if pending[b] is not None]
      if not live:
        break
      width = _bucket(max(len(pending[b]) for b in live))
      obs = np.full((B, width), self.tok.pad_id, np.int32)
      obs_len = np.zeros((B,), np.int32)
      budget = np.zeros((B,), np.int32)
      for b in live:
        ids_b = pending[b]
        room = S - fill[b] - len(ids_b)
        if room < 1:  # no room for the observation and one token of a reply
          tracker[b].model("token budget exhausted")
          pending[b] = None
          continue
        obs[b, : len(ids_b)] = ids_b
        obs_len[b] = len(ids_b)
        budget[b] = min(lim.turn_tokens, room)
      start = time.perf_counter()
      state, stopped = self._turn(params, state, self._put(obs), self._put(obs_len), self._put(budget),
                                  jax.random.fold_in(rng, turn), stop_dev)
      new_fill, stopped, tokens = mesh_lib.fetch((state.fill, stopped, state.tokens))
      clock["policy"] += time.perf_counter() - start
      host_tokens = tokens
      acted = [b for b in range(B) if budget[b] > 0]
      actions, said = [], {}
      for b in acted:
        start = fill[b] + obs_len[b]
        text = self.tok.decode(tokens[b, start: new_fill[b]])
        turns[b] += 1
        transcripts[b] += f"\n<turn {turn + 1}> {text}"
        tracker[b].turn(tokens[b, start: new_fill[b]].tolist(), text, bool(stopped[b]))
        said[b] = text
        if not stopped[b]:  # cut at its budget: the policy ran on
          tracker[b].model("turn token budget exhausted" if new_fill[b] < S else "token budget exhausted")
          pending[b] = None
        else:
          actions.append(b)
      fill = new_fill
      loop = [b for b in actions if tracker[b].repeating()]
      for b in loop:
        tracker[b].model("repetition loop")
        pending[b] = None
      actions = [b for b in actions if b not in loop]
      faults = self.faults(actions, turn) if self.faults else [""] * len(actions)
      start = time.perf_counter()
      outcomes = self.envs.step([(ids[b], said[b], f) for b, f in zip(actions, faults, strict=True)])
      clock["env"] += time.perf_counter() - start
      for b, fault, out in zip(actions, faults, outcomes, strict=True):
        # The ground truth for measuring the classifier: an injected crash or hang reached this episode, directly
        # or by taking down the worker that held it (a replaced worker's episodes are lost with it; with faults
        # injected into an environment that has none of its own, every replacement is an injected fault's doing).
        collateral = not out.ok and out.detail.startswith("worker replaced")
        tracker[b].injected = tracker[b].injected or fault in ("crash", "hang") or collateral
        if not out.ok:
          tracker[b].environment(f"{out.failure}: {out.detail}"[:200])
          pending[b] = None
          continue
        step = out.value
        returns[b] += float(step.reward)
        calls[b] += int(step.info.get("tool_calls", 0))
        if step.info.get("failure") == "model":
          tracker[b].model(str(step.info.get("reason", "protocol error")))
        if step.done:
          success[b] = bool(step.info.get("success", step.reward > 0))
          tracker[b].finish(success[b])
          pending[b] = None
        else:
          pending[b] = self.framing.next(step.observation)
          transcripts[b] += f"\n<obs> {step.observation}"
    for b in range(B):
      if pending[b] is not None:  # still talking when the turns ran out
        tracker[b].model("turn limit")
    self.envs.close_episodes(ids)
    verdicts = [t.verdict() for t in tracker]
    finished = np.asarray([v.outcome in ("success", "task") for v in verdicts], bool)
    rollout = self._rollout(state, self._put(finished))
    host = {"tokens": host_tokens, "lengths": np.asarray(mesh_lib.fetch(rollout.lengths)), "finished": finished,
            "fill": fill}
    injected = np.asarray([t.injected for t in tracker], bool)
    return EpisodeBatch(rollout, host, returns, success & finished, verdicts, turns, calls, transcripts, injected,
                        clock)


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
