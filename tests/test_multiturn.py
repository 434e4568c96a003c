"""Multi-turn episodes, token in and token out (rl_lm/envs/episodes.py): the trajectory is exactly the sampled and
observation tokens laid end to end, the trainer scores the sampled tokens as the sampler drew them, and the loss
and KL never touch an observation token."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm import sampling, tokenizer
from rl_lm.envs import base, episodes, failures
from rl_lm.models import presets, transformer
from rl_lm.rl import advantages, kl, losses
from rl_lm.tasks.base import Problem


class ScriptedEnv(base.Environment):
  """Written against the documented interface only: replies "ok<turn>;" twice, then ends the episode."""

  def reset(self, problem, rng):
    self.turn = 0
    return problem.prompt

  def step(self, action):
    self.turn += 1
    if self.turn >= 3:
      return base.Step("", 1.0, True, {"success": True})
    return base.Step(f"ok{self.turn};", 0.0, False, {"tool_calls": 1})


TOK = tokenizer.CharTokenizer()
CFG = presets.get("test")
STOPS = tuple(range(2, 40))  # eos and 37 more: a random model ends most turns within a few tokens


LIMITS = episodes.EpisodeLimits(max_turns=4, turn_tokens=12, max_tokens=96)


def _runner(rows, limits, greedy=False, temperature=1.0):
  scfg = sampling.SamplingConfig(max_new_tokens=limits.turn_tokens, temperature=temperature, greedy=greedy,
                                 stop_tokens=STOPS, pad_id=TOK.pad_id)
  return episodes.EpisodeRunner(CFG, scfg, TOK, episodes.LocalEnvs(ScriptedEnv), limits, rows)


@pytest.fixture(scope="module")
def batch():
  params = transformer.init(CFG, jax.random.key(0))
  runner = _runner(4, LIMITS)
  problems = [Problem(id=f"p{i}", prompt=f"{i}+{i}=", answer=str(2 * i)) for i in range(4)]
  out = runner.run(params, problems, jax.random.key(1), seeds=[0, 1, 2, 3])
  return params, runner, problems, out


def test_trajectory_is_the_sampled_and_observation_tokens_end_to_end(batch):
  params, runner, problems, out = batch
  tokens, fill = out.host.tokens, out.host.fill
  sampled = np.asarray(out.device.completion_mask)
  prompt_mask = np.asarray(out.device.prompt_mask)
  assert out.host.turns.max() >= 2, "some episode should take several turns"
  for b in range(4):
    expect = list(TOK.encode_prompt(problems[b].prompt))
    marks = [False] * len(expect)
    pos = len(expect)
    for turn in range(out.host.turns[b]):
      # the policy's turn: sampled tokens up to and including its stop token (or its budget)
      j = pos
      while j < fill[b] and sampled[b, j]:
        j += 1
      turn_ids = tokens[b, pos:j].tolist()
      assert turn_ids, f"row {b} turn {turn}: no sampled tokens"
      expect += turn_ids
      marks += [True] * len(turn_ids)
      pos = j
      if turn + 1 < out.host.turns[b]:
        obs = runner.framing.next(f"ok{turn + 1};")
        expect += obs
        marks += [False] * len(obs)
        pos += len(obs)
    assert tokens[b, : fill[b]].tolist() == expect
    assert sampled[b, : fill[b]].tolist() == marks
    assert not sampled[b, fill[b]:].any() and not prompt_mask[b, fill[b]:].any()
    assert (prompt_mask[b, : fill[b]] == ~np.asarray(marks)).all()


def test_trainer_logprobs_equal_sampler_logprobs_across_turns(batch):
  params, _, _, out = batch
  trainer = sampling.completion_logprobs(CFG, params, out.device)
  mask = np.asarray(out.device.completion_mask)
  np.testing.assert_allclose(np.asarray(trainer)[mask], np.asarray(out.device.logprobs)[mask], atol=2e-5)
  assert np.all(np.asarray(out.device.logprobs)[~mask] == 0)


def test_attention_windows_change_no_token_of_an_episode(batch):
  # The engine's windows (8, 16, 32, 64, 96 slots here, against the fixture's 64, 96) read only the filled part of
  # the cache: the same episodes, token for token.
  params, _, problems, out = batch
  scfg = dataclasses.replace(_runner(4, LIMITS).scfg, window=8)
  runner = episodes.EpisodeRunner(CFG, scfg, TOK, episodes.LocalEnvs(ScriptedEnv), LIMITS, 4)
  again = runner.run(params, problems, jax.random.key(1), seeds=[0, 1, 2, 3])
  np.testing.assert_array_equal(again.host.tokens, out.host.tokens)
  np.testing.assert_allclose(np.asarray(again.device.logprobs), np.asarray(out.device.logprobs), atol=1e-5)
  assert out.host.fill.max() > 16  # several windows were crossed


@pytest.mark.parametrize("slots", [1, 3])
def test_continuous_batching_runs_the_same_episodes(batch, slots):
  # 4 episodes through 1 or 3 cache rows: rows return to the host as their turns end and take the next episode as
  # theirs end, and every episode is the static batch's, token for token (one key per episode and turn).
  params, _, problems, out = batch
  runner = episodes.EpisodeRunner(CFG, _runner(4, LIMITS).scfg, TOK, episodes.LocalEnvs(ScriptedEnv), LIMITS, 4,
                                  slots=slots)
  again = runner.run(params, problems, jax.random.key(1), seeds=[0, 1, 2, 3])
  for field in ("tokens", "fill", "lengths", "finished"):
    np.testing.assert_array_equal(getattr(again.host, field), getattr(out.host, field), err_msg=field)
  for field in ("tokens", "prompt_mask", "completion_mask"):
    np.testing.assert_array_equal(np.asarray(getattr(again.device, field)), np.asarray(getattr(out.device, field)))
  np.testing.assert_allclose(np.asarray(again.device.logprobs), np.asarray(out.device.logprobs), atol=1e-5)
  assert [v.outcome for v in again.host.verdicts] == [v.outcome for v in out.host.verdicts]
  np.testing.assert_array_equal(again.host.scores, out.host.scores)
  np.testing.assert_array_equal(again.host.turns, out.host.turns)


def test_episode_accounting(batch):
  _, _, _, out = batch
  for b in range(4):
    v = out.host.verdicts[b]
    if v.outcome == "success":
      assert out.host.turns[b] == 3 and out.host.scores[b] == 1.0 and out.host.tool_calls[b] == 2
    else:
      assert v.outcome == "model", v  # the scripted environment never fails; a random policy runs over budgets
  assert out.host.lengths.tolist() == np.asarray(out.device.completion_mask).sum(1).tolist()


def test_greedy_episode_equals_stepwise_full_forward():
  """Greedy multi-turn decoding with the carried cache picks, at every sampled slot, the argmax of a full forward
  over the episode so far: the cache across turns is the whole history."""
  params = transformer.init(CFG, jax.random.key(3))
  runner = _runner(2, episodes.EpisodeLimits(max_turns=3, turn_tokens=6, max_tokens=64), greedy=True)
  problems = [Problem(id="a", prompt="12=", answer="x"), Problem(id="b", prompt="7*8=", answer="y")]
  out = runner.run(params, problems, jax.random.key(0), seeds=[0, 0])
  tokens, fill = out.host.tokens, out.host.fill
  mask = np.arange(tokens.shape[1])[None, :] < fill[:, None]
  logits = np.asarray(transformer.forward(CFG, params, jnp.asarray(tokens), jnp.asarray(mask)))
  sampled = np.asarray(out.device.completion_mask)
  for b in range(2):
    for t in np.flatnonzero(sampled[b]):
      assert tokens[b, t] == int(np.argmax(logits[b, t - 1])), (b, t)


def test_loss_and_kl_never_touch_observation_tokens(batch):
  params, _, _, out = batch
  mask = out.device.completion_mask
  logp = sampling.completion_logprobs(CFG, params, out.device)
  adv = advantages.broadcast_to_tokens(jnp.asarray([1.0, -1.0, 0.5, -0.5]), mask)

  def objective(logp_all):
    loss, _ = losses.policy_loss(logp_all, jax.lax.stop_gradient(logp_all), adv, mask, 0.2, 0.2, None, "token-mean")
    kl_tok = kl.estimate(logp_all, logp_all * 0.9, "k3", mask=mask)
    return loss + jnp.sum(jnp.where(mask, kl_tok, 0.0))

  full = out.device.prompt_mask | mask
  grad = np.asarray(jax.grad(objective)(logp + 0.0))
  obs = np.asarray(out.device.prompt_mask)
  assert np.all(grad[obs] == 0) and np.all(grad[~np.asarray(full)] == 0)
  assert np.any(grad[np.asarray(mask)] != 0)


def test_gae_carries_over_observation_holes():
  """verl's convention for masked holes: the value and the advantage carry over an observation unchanged.
  Tokens: a0 a1 | o o | a2 (mask 1 1 0 0 1), reward 1 on a2, gamma 1, lambda 1 -> every sampled token's
  advantage is 1 - V(t): A(a2) = 1 - 0.5, A(a1) = 0 + V(a2) - V(a1) + A... = 1 - 0.2, A(a0) = 1 - 0.1."""
  rewards = jnp.asarray([[0.0, 0.0, 0.0, 0.0, 1.0]])
  values = jnp.asarray([[0.1, 0.2, 9.0, 9.0, 0.5]])  # values on the hole are ignored
  mask = jnp.asarray([[1, 1, 0, 0, 1]], bool)
  adv, ret = advantages.gae(rewards, values, mask, gamma=1.0, lam=1.0)
  np.testing.assert_allclose(np.asarray(adv), [[0.9, 0.8, 0.0, 0.0, 0.5]], atol=1e-6)
  np.testing.assert_allclose(np.asarray(ret), [[1.0, 1.0, 0.0, 0.0, 1.0]], atol=1e-6)
  # gamma 0.5, lambda 0.5: a1's delta uses V(a2) as the next value, across the hole.
  adv, _ = advantages.gae(rewards, values, mask, gamma=0.5, lam=0.5)
  d2 = 1.0 - 0.5
  d1 = 0.0 + 0.5 * 0.5 - 0.2
  d0 = 0.0 + 0.5 * 0.2 - 0.1
  a1 = d1 + 0.25 * d2
  np.testing.assert_allclose(np.asarray(adv)[0, [0, 1, 4]], [d0 + 0.25 * a1, a1, d2], atol=1e-6)


def test_failure_verdicts():
  t = failures.Tracker()
  t.environment("crash: worker died")
  t.finish(True)
  assert t.verdict().outcome == "environment" and not t.verdict().trains
  t = failures.Tracker()
  t.model("malformed tool call")
  assert t.verdict() == failures.Verdict("model", "malformed tool call")
  t = failures.Tracker()
  t.finish(False)
  assert t.verdict().outcome == "task"
  t = failures.Tracker()
  for _ in range(3):
    t.turn([5, 6], "[calc(1+1)]", True)
  assert t.repeating()
  t = failures.Tracker()
  t.turn([7, 8, 9] * 5, "xyzxyz", stopped=False)
  assert t.verdict() == failures.Verdict("model", "repetition loop")
  assert failures.periodic_tail([1, 2, 1, 2, 1, 2, 1, 2]) and not failures.periodic_tail([1, 2, 3, 4, 5, 6, 7, 8])
  assert failures.precision_recall([True, True, False], [True, False, False]) == (0.5, 1.0)
  t = failures.Tracker()  # reasons are kept as visible, bounded text: they reach logs and JSON
  t.fail(failures.Verdict("model", "cannot encode \udcff\x1b" + "x" * 500))
  reason = t.verdict().reason
  assert t.verdict().outcome == "model" and reason.startswith("cannot encode \ufffd\\x1b") and len(reason) < 350
  with pytest.raises(ValueError, match="model or environment"):
    t.fail(failures.Verdict("task"))


def test_chat_template_frames_the_turns_as_one_rendered_conversation(smollm2_folder):
  """The prompt, the policy's reply and its end-of-turn token, then the observation as `encode_reply` frames it:
  the tokens of the whole conversation as the checkpoint's template renders it, so nothing is re-tokenised."""
  tok = tokenizer.HFTokenizer(smollm2_folder, chat=True)
  framing = episodes.Framing(tok)
  reply, observation = "[calc(347*862)]", "299114"
  ids = framing.first("347*862=") + tok.encode(reply) + [tok.stop_ids[-1]] + framing.next(observation)
  text = tok.chat.render([{"role": "user", "content": "347*862="}, {"role": "assistant", "content": reply},
                          {"role": "user", "content": observation}], add_generation_prompt=True)
  assert ids == tok.encode(text)
  assert tokenizer.CharTokenizer().encode_prompt("1+1=") == episodes.Framing(tokenizer.CharTokenizer()).first("1+1=")


def test_sft_on_an_episode_demonstration_trains_the_policy_turns_only():
  """A multi-turn demonstration is encoded in the episode's own layout: prompt and observations masked, each
  policy turn and its stop token trained."""
  from rl_lm.train import sft

  out = sft.encode_episodes(TOK, [("7*8=", [("policy", "[calc(7*8)]"), ("env", "56\n"), ("policy", "56")])], 40)
  ids = TOK.encode_prompt("7*8=") + TOK.encode("[calc(7*8)]") + [TOK.eos_id] + TOK.encode("56\n") + \
    TOK.encode("56") + [TOK.eos_id]
  n = len(ids)
  assert out["tokens"][0, :n].tolist() == ids and out["mask"][0].sum() == n
  trained = [False] * 5 + [True] * 12 + [False] * 3 + [True] * 3
  assert out["loss_mask"][0, :n].tolist() == trained and not out["loss_mask"][0, n:].any()


@pytest.mark.parametrize("by_slot", [False, True], ids=["keys-transposed", "keys-by-slot"])
def test_per_row_chunked_prefill_equals_the_full_forward(by_slot):
  """forward_cached with a per-row index and T > 1: two rows at different offsets append chunks of different real
  lengths; the logits at each row's `take` position equal the full forward's at that slot."""
  params = transformer.init(CFG, jax.random.key(5))
  tokens = jax.random.randint(jax.random.key(6), (2, 12), 3, 90)
  first = jnp.asarray([3, 5])  # row b's first chunk: slots [0, first[b])
  cache = transformer.init_cache(CFG, 2, 16, by_slot=by_slot)
  slots = jnp.arange(16)[None, :]
  pos = jnp.arange(8)[None, :].repeat(2, 0)
  _, cache = transformer.forward_cached(CFG, params, tokens[:, :8], pos, cache, jnp.zeros((2,), jnp.int32),
                                        slots < first[:, None], take=first - 1)
  n = jnp.asarray([4, 2])  # second chunk: slots [first, first + n)
  rest = [tokens[b, int(first[b]): int(first[b]) + 8] for b in range(2)]  # the real tokens, then padding
  chunk = jnp.stack([jnp.pad(r, (0, 8 - r.shape[0])) for r in rest])
  at = first[:, None] + jnp.arange(8)[None, :]
  logits, _ = transformer.forward_cached(CFG, params, chunk, at, cache, first, slots < (first + n)[:, None],
                                         take=n - 1)
  end = first + n
  full = transformer.forward(CFG, params, tokens, jnp.arange(12)[None, :] < end[:, None])
  for b in range(2):
    np.testing.assert_allclose(np.asarray(logits[b, 0]), np.asarray(full[b, int(end[b]) - 1]), atol=2e-5)
