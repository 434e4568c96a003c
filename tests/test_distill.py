"""On-policy distillation (rl_lm/rl/distill.py) and the teacher on the mesh (rl_lm/train/teacher.py): the reward's
gradient against a hand-computed reverse KL, the teacher's log-probs against its full forward, loading and
refusing teachers."""

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import distill as distill_config
from rl_lm import config as config_lib
from rl_lm import mesh as mesh_lib
from rl_lm import sampling
from rl_lm.checkpoint import Checkpointer
from rl_lm.config.section import ConfigError
from rl_lm.models import build, presets, scoring, transformer
from rl_lm.rl import distill, policy_losses
from rl_lm.train import offpolicy, rl_update, teacher
from rl_lm.train.context import Context
from rl_lm.train.rl import RLTrainer
from rl_lm.train.source import task_from_config
from tests.test_rl_loop import make_ctx, smoke_config

pytestmark = pytest.mark.usefixtures("persistent_compilation_cache")  # trainers of one shape share executables


def test_reward_gradient_is_the_reverse_kl_gradient_on_a_toy_vocabulary():
  """One position, V = 5 tokens, student logits theta, teacher q. Every token y is a row, weighted by
  pi_old(y) through the importance weights, so the token-mean PPO loss is the exact expectation over the student's
  samples. Its gradient at theta = theta_old must be grad KL(pi || q), by hand:
  dKL/dtheta_k = pi_k (log pi_k - log q_k - KL)."""
  theta = jnp.asarray([0.3, -1.2, 0.8, 0.0, 2.0])
  log_q = jax.nn.log_softmax(jnp.asarray([1.0, 0.5, -0.3, 0.2, -1.0]))
  V = theta.shape[0]
  log_pi = jax.nn.log_softmax(theta)
  mask = jnp.ones((V, 1), bool)
  old = log_pi[:, None]  # [V, 1]: row y holds token y
  adv = distill.advantages(jnp.zeros((V, 1)), old, log_q[:, None], mask, coef=1.0, verifier=0.0)
  weights = V * jnp.exp(old)  # token-mean over V rows: sum_y pi(y) * loss(y)

  def loss(th):
    logp = jax.nn.log_softmax(th)[:, None]
    return policy_losses.compute("ppo", logp, old, adv, mask, 0.2, 0.2, is_weights=weights)[0]

  pi = np.exp(np.asarray(log_pi))
  kl = float(np.sum(pi * (np.asarray(log_pi) - np.asarray(log_q))))
  by_hand = pi * (np.asarray(log_pi) - np.asarray(log_q) - kl)
  np.testing.assert_allclose(np.asarray(jax.grad(loss)(theta)), by_hand, atol=1e-6)
  assert np.abs(by_hand).max() > 0.05  # the student is far from the teacher: the check has a gradient to check
  # The reward is per token, and a verifier's advantage adds with its weight.
  np.testing.assert_allclose(np.asarray(distill.advantages(jnp.ones((V, 1)), old, log_q[:, None], mask, 2.0, 0.5)),
                             0.5 + 2.0 * (np.asarray(log_q) - np.asarray(log_pi))[:, None], atol=1e-6)


def test_metrics_are_the_reverse_kl_per_token_and_per_sequence():
  student = jnp.asarray([[0.0, -1.0, -2.0], [0.0, -0.5, 0.0]])
  teacher_logp = jnp.asarray([[0.0, -0.5, -1.0], [0.0, -1.5, 0.0]])
  mask = jnp.asarray([[False, True, True], [False, True, False]])
  m = distill.metrics(student, teacher_logp, mask)
  # gaps on the mask: -0.5, -1.0 (row 0), +1.0 (row 1)
  assert float(m["distill/reverse_kl"]) == pytest.approx(-0.5 / 3)
  assert float(m["distill/reverse_kl_seq"]) == pytest.approx(-0.5 / 2)
  assert float(m["distill/teacher_logp_mean"]) == pytest.approx(-3.0 / 3)


def _rl_config(coef: float = 1.0, verifier: float = 0.0):
  config = config_lib.base_config()
  config.rl.group_size, config.rl.distill.coef, config.rl.distill.verifier = 2, coef, verifier
  return config


def test_prepare_scores_the_teacher_as_its_full_forward():
  """A teacher of another preset than the policy's (same vocabulary): its per-token log-probs in `prepare` (read back
  from the advantages of pure distillation) equal a full forward of the teacher, to 1e-5."""
  policy_cfg, teacher_cfg = presets.get("test"), presets.get("test", n_layers=3)
  assert teacher_cfg.vocab_size == policy_cfg.vocab_size and teacher_cfg != policy_cfg
  policy, teacher_params = transformer.init(policy_cfg, jax.random.key(0)), transformer.init(teacher_cfg,
                                                                                             jax.random.key(1))
  B, P, N, temperature = 4, 3, 5, 0.7
  tokens = jax.random.randint(jax.random.key(2), (B, P + N), 3, policy_cfg.vocab_size)
  lengths = jnp.asarray([N, 2, 4, 1])
  comp = (jnp.arange(P + N)[None, :] >= P) & (jnp.arange(P + N)[None, :] < P + lengths[:, None])
  prompt = jnp.arange(P + N)[None, :] < P
  rollout = sampling.Rollout(tokens, prompt, comp, jnp.zeros((B, P + N)), lengths, jnp.ones((B,), bool))
  trains = jnp.asarray([True, True, False, True])
  scored = rl_update.Scored(jnp.asarray([1.0, 0.0, 1.0, 0.0]), jnp.ones((B,), bool), trains, jnp.ones((B,), bool))
  config = _rl_config()
  fn = rl_update.make_prepare_fn(policy_cfg, config.rl, temperature, None, mesh_lib.DEFAULT_RULES)
  teacher_fn = rl_update.make_teacher_fn(teacher_cfg, config.rl, temperature, None, mesh_lib.DEFAULT_RULES)
  batch, metrics = fn(policy, policy, None, rollout, scored, jnp.float32(0.0),
                      teacher_fn(teacher_params, tokens, prompt | comp))
  logits = transformer.forward(teacher_cfg, teacher_params, tokens, prompt | comp)[:, :-1] / temperature
  full = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tokens[:, 1:, None], -1)[..., 0]
  full = jnp.concatenate([jnp.zeros((B, 1)), full], 1)
  on = np.asarray(comp & trains[:, None])
  np.testing.assert_allclose(np.asarray(batch.advantages + batch.old_logp)[on], np.asarray(full)[on], atol=1e-5)
  assert np.all(np.asarray(batch.advantages)[~on] == 0)
  assert float(metrics["distill/teacher_logp_mean"]) == pytest.approx(float(np.asarray(full)[np.asarray(comp)].mean()),
                                                                       abs=1e-5)


@pytest.mark.parametrize("loss", ["reward", "jsd"])
def test_a_teacher_that_scores_rows_non_finitely_has_them_masked_counted_and_alarmed(loss):
  """A teacher whose embedding of one token is nan scores every row holding that token non-finitely: those rows
  leave the loss (mask, advantages), are counted in distill/teacher_invalid_frac and alarm; the other rows train as
  before and the update's loss and gradients stay finite (a nan is never a silent 0)."""
  from rl_lm import health
  from rl_lm.config import AlarmConfig

  cfg = presets.get("test", tie_embeddings=False)  # untied: a nan input embedding leaves the output head finite
  policy, teacher_params = transformer.init(cfg, jax.random.key(0)), transformer.init(cfg, jax.random.key(1))
  bad_token = 7
  broken = {**teacher_params, "embed": teacher_params["embed"].at[bad_token].set(jnp.nan)}
  B, P, N = 4, 3, 5
  tokens = jax.random.randint(jax.random.key(2), (B, P + N), 8, cfg.vocab_size)  # ids >= 8: no bad token yet
  tokens = tokens.at[1, P + 2].set(bad_token).at[3, 0].set(bad_token)  # row 1 mid-completion, row 3 in the prompt
  comp = jnp.broadcast_to(jnp.arange(P + N)[None, :] >= P, (B, P + N))
  prompt = ~comp
  rollout = sampling.Rollout(tokens, prompt, comp, jnp.zeros((B, P + N)), jnp.full((B,), N), jnp.ones((B,), bool))
  scored = rl_update.Scored(jnp.asarray([1.0, 0.0, 1.0, 0.0]), jnp.ones((B,), bool), jnp.ones((B,), bool),
                            jnp.ones((B,), bool))
  config = _rl_config()
  config.rl.distill.loss = loss
  rules = mesh_lib.DEFAULT_RULES
  prepare = rl_update.make_prepare_fn(cfg, config.rl, 1.0, None, rules)
  teacher_fn = rl_update.make_teacher_fn(cfg, config.rl, 1.0, None, rules)
  clean, _ = prepare(policy, policy, None, rollout, scored, jnp.float32(0.0),
                     teacher_fn(teacher_params, tokens, prompt | comp))
  batch, metrics = prepare(policy, policy, None, rollout, scored, jnp.float32(0.0), teacher_fn(broken, tokens,
                                                                                                prompt | comp))
  mask = np.asarray(batch.mask)
  assert mask[[0, 2]].any(axis=1).all() and not mask[[1, 3]].any()
  np.testing.assert_array_equal(mask[[0, 2]], np.asarray(clean.mask)[[0, 2]])
  assert np.isfinite(np.asarray(batch.advantages)).all() and not np.asarray(batch.advantages)[[1, 3]].any()
  np.testing.assert_allclose(np.asarray(batch.advantages)[[0, 2]], np.asarray(clean.advantages)[[0, 2]], atol=1e-6)
  assert float(metrics["distill/teacher_invalid_frac"]) == 0.5
  assert all(np.isfinite(float(v)) for v in metrics.values())

  hidden = batch.teacher_hidden  # the update's: the teacher's hidden states made before prepare ("jsd")
  assert (hidden is not None) == (loss == "jsd")
  divergence = lambda p: scoring.score_tokens(cfg, p, tokens, prompt | comp, 1.0,  # noqa: E731
                                              scoring.Teacher(cfg, broken, 0.5, hidden)).divergence[0].sum()
  grads = jax.jit(jax.grad(divergence))(policy)
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))  # masked rows' stand-in is finite

  monitor = health.Monitor(AlarmConfig(patience=1))
  lines = monitor.update(1, {k: float(v) for k, v in metrics.items()})
  assert any("distill/teacher_invalid_frac=0.5 > 0.1" in line for line in lines), lines


def _ctx(config, mesh, model_cfg) -> Context:
  return Context(config, "", mesh, mesh_lib.DEFAULT_RULES, model_cfg, None, None, jax.random.key(0))


def test_a_teacher_loads_in_bfloat16_on_the_mesh_and_a_foreign_vocabulary_is_refused(tmp_path):
  mesh = mesh_lib.make_mesh(1, 2, 1, devices=jax.devices()[:2])
  cfg = presets.get("test")
  params = transformer.init(cfg, jax.random.key(3))
  with Checkpointer(str(tmp_path / "ckpt")) as ckpt:
    ckpt.save(5, {"params": params})
  config = _rl_config()
  config.model.preset, config.teacher.init_from = "test", str(tmp_path / "ckpt")
  lines: list[str] = []
  frozen = teacher.load(config, _ctx(config, mesh, cfg), lines.append)
  assert frozen.model_cfg.param_dtype == "bfloat16"
  chex.assert_trees_all_close(jax.device_get(frozen.params),
                              jax.tree.map(lambda x: np.asarray(x.astype(jnp.bfloat16)), params))
  n = sum(x.size for x in jax.tree.leaves(params))
  assert frozen.num_params == n and frozen.nbytes == 2 * n  # 2 bytes a parameter: no optimizer state
  assert frozen.per_device < frozen.nbytes  # sharded over fsdp, not replicated
  assert "teacher" in lines[0] and "MiB resident" in lines[0]
  config.teacher.preset = "tiny"  # another vocabulary: the same ids are other tokens
  with pytest.raises(ConfigError, match=r"config.teacher: a vocabulary of \d+ ids"):
    teacher.check_vocabulary(config, cfg, presets.get("tiny").replace(vocab_size=cfg.vocab_size + 1))


def test_distillation_without_a_teacher_fails_validation():
  config = _rl_config()
  config.stages = ("rl",)
  with pytest.raises(ConfigError, match="config.teacher.init_from"):
    config_lib.validate(config, num_devices=1)
  config.teacher.init_from, config.teacher.hf_checkpoint = "/", "/"
  with pytest.raises(ConfigError, match="config.teacher.hf_checkpoint"):
    config_lib.validate(config, num_devices=1)


def test_abstract_teacher_matches_its_checkpoint_shapes():
  cfg = presets.get("test", param_dtype="bfloat16")
  mesh = mesh_lib.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  abstract = build.abstract_params(cfg, mesh, mesh_lib.DEFAULT_RULES)
  assert {x.dtype for x in jax.tree.leaves(abstract)} == {jnp.dtype(jnp.bfloat16)}


def _crash_teacher(trainer: RLTrainer, at: set[int]) -> dict[str, int]:
  """Makes the teacher's forward raise, as an XLA runtime error would, at the steps `at`; the loop sets "step"."""
  real, now = trainer.teacher_fn, {"step": 0}

  def flaky(*args):
    if now["step"] in at:
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.20GiB (injected)")
    return real(*args)

  trainer.teacher_fn = flaky
  return now


def test_on_policy_distillation_moves_the_student_towards_the_teacher(tmp_path):
  """Pure distillation (verifier weight 0, no KL to the reference) towards a teacher that is the student's own
  initialisation at temperature 0.1 (its final norm scaled by 10): the student starts near uniform, about 4 nats
  per token from the teacher, and its reverse KL on its own samples falls below a quarter of that in 15 steps
  (it sharpens: reverse KL seeks the teacher's modes).

  The teacher's forward crashes at step 8: that step's rows are all masked and counted, the alarm fires, the
  error is logged, the weights do not move, and the run goes on."""
  from rl_lm import health
  from rl_lm.config import AlarmConfig

  config = smoke_config(distill__coef=1.0, distill__verifier=0.0, kl__placement="none", learning_rate=3e-2)
  ctx = make_ctx(config, (1, 1, 1), str(tmp_path / "run"))
  sharp = jax.device_get(ctx.policy)
  sharp["final_norm"] = sharp["final_norm"] * 10.0
  with Checkpointer(str(tmp_path / "teacher")) as ckpt:
    ckpt.save(1, {"params": sharp})
  config.teacher.init_from, config.teacher.param_dtype = str(tmp_path / "teacher"), "float32"
  lines: list[str] = []
  trainer = RLTrainer(ctx, log=lines.append)
  now = _crash_teacher(trainer, {8})
  metrics = []
  try:
    for step in range(1, 16):
      now["step"] = step
      before = jax.device_get(trainer.state.policy.params) if step == 8 else None
      metrics.append(trainer.train_step(step))
      if before is not None:
        chex.assert_trees_all_equal(jax.device_get(trainer.state.policy.params), before)
  finally:
    trainer.source.close()
  crashed = metrics[7]
  assert crashed["distill/teacher_error"] == 1.0 and crashed["distill/teacher_invalid_frac"] == 1.0
  assert all(m["distill/teacher_error"] == 0.0 == m["distill/teacher_invalid_frac"] for m in metrics[:7] + metrics[8:])
  assert any("step 8: the teacher's forward failed (RuntimeError: RESOURCE_EXHAUSTED" in line for line in lines)
  alarms = health.Monitor(AlarmConfig(patience=1)).update(8, crashed)
  assert any("distill/teacher_invalid_frac=1" in line for line in alarms), alarms
  kls = [m["distill/reverse_kl"] for m in metrics]
  assert np.mean(kls[:3]) > 3.0, kls
  assert np.mean(kls[-3:]) < 0.25 * np.mean(kls[:3]), kls
  assert metrics[-1]["policy/entropy"] < 0.5 * metrics[0]["policy/entropy"]


def test_off_policy_distillation_trains_on_the_teachers_samples(tmp_path):
  """The "teacher_sft" stage: the teacher samples k completions of each pool problem once (written to the workdir,
  read back on resume without loading the teacher), SFT on them lowers their NLL, and held-out pass@k is measured
  before and after with the RL stage's draws."""
  config = distill_config.get_config("offpolicy_smoke")
  ctx = make_ctx(config, (1, 1, 1), str(tmp_path / "run"))
  sharp = jax.device_get(ctx.policy)
  sharp["final_norm"] = sharp["final_norm"] * 10.0
  with Checkpointer(str(tmp_path / "teacher")) as ckpt:
    ckpt.save(1, {"params": sharp})
  config.teacher.init_from = str(tmp_path / "teacher")
  task = task_from_config(config)
  lines: list[str] = []
  summary = offpolicy.train(ctx, task, lines.append)
  records = [json.loads(line) for line in open(tmp_path / "run" / offpolicy.SAMPLES_FILE)]
  k = config.teacher.samples_per_problem
  assert len(records) == k * len({r["id"] for r in records}) and len(records) >= 8 * k
  losses = [json.loads(line)["train/loss"] for line in open(tmp_path / "run" / "teacher_sft_metrics.jsonl")
            if "train/loss" in line]
  assert losses[-1] < 0.7 * losses[0], losses
  assert set(summary) >= {"before", "after"} and any(line.startswith("teacher_sft: after:") for line in lines)
  again = offpolicy.teacher_samples(ctx, [], lambda line: pytest.fail(f"the teacher was loaded again: {line}"))
  assert sum(len(v) for v in again.values()) == len(records)


# ------------------------------------------------------------------------------------------------
# The GKD family: the generalised JSD over the whole vocabulary, and the teacher's own samples


def _kl(p: np.ndarray, q: np.ndarray) -> float:
  return float(np.sum(p * np.log(p / q)))


def test_generalized_jsd_by_hand_and_at_its_two_ends():
  """V = 3: the divergence against hand-computed KLs and mixtures. beta = 0 is the forward KL(T || S) and beta = 1
  the reverse KL(S || T), their gradients in the student's logits the known closed forms; between, the
  mixture's formula, symmetric at 0.5, and near each end the matching KL times the small weight."""
  s_logits, t_logits = jnp.asarray([0.5, -1.0, 1.5]), jnp.asarray([2.0, 0.0, -0.5])
  p_s, p_t = np.asarray(jax.nn.softmax(s_logits)), np.asarray(jax.nn.softmax(t_logits))
  jsd = lambda beta, s=s_logits, t=t_logits: float(distill.generalized_jsd(s, t, beta))  # noqa: E731
  forward, reverse = _kl(p_t, p_s), _kl(p_s, p_t)
  assert forward > 0.5 and reverse > 0.5 and abs(forward - reverse) > 0.05  # the two ends are told apart
  assert jsd(0.0) == pytest.approx(forward, rel=1e-5)
  assert jsd(1.0) == pytest.approx(reverse, rel=1e-5)
  m = 0.3 * p_t + 0.7 * p_s
  assert jsd(0.3) == pytest.approx(0.3 * _kl(p_t, m) + 0.7 * _kl(p_s, m), rel=1e-5)
  assert jsd(0.5) == pytest.approx(jsd(0.5, t_logits, s_logits), rel=1e-5)  # Jensen-Shannon: symmetric
  assert jsd(0.5) <= np.log(2)  # and bounded
  assert jsd(1e-3) / 1e-3 == pytest.approx(forward, rel=2e-2)
  assert jsd(1 - 1e-3) / 1e-3 == pytest.approx(reverse, rel=2e-2)
  grad = lambda beta: np.asarray(jax.grad(lambda s: distill.generalized_jsd(s, t_logits, beta))(s_logits))  # noqa
  np.testing.assert_allclose(grad(0.0), p_s - p_t, atol=1e-6)
  np.testing.assert_allclose(grad(1.0), p_s * (np.log(p_s / p_t) - reverse), atol=1e-6)
  teacher_grad = jax.grad(lambda t: distill.generalized_jsd(s_logits, t, 0.5))(t_logits)
  assert np.all(np.asarray(teacher_grad) == 0)  # the teacher is a constant of the loss


@pytest.mark.parametrize("chunk", [0, 3])
def test_scores_against_a_teacher_equal_the_full_forwards(chunk):
  """The divergence `score_tokens` makes chunk by chunk equals the one of both models' full forwards, with the
  same alignment as the log-probs (column t: the distributions at t - 1), and its gradient too."""
  policy_cfg, teacher_cfg = presets.get("test", logit_chunk=chunk), presets.get("test", n_layers=3)
  policy, teacher_params = transformer.init(policy_cfg, jax.random.key(0)), transformer.init(teacher_cfg,
                                                                                             jax.random.key(1))
  B, T, temperature, beta = 2, 8, 0.7, 0.3
  tokens = jax.random.randint(jax.random.key(2), (B, T), 3, policy_cfg.vocab_size)
  mask = jnp.ones((B, T), bool).at[1, 6:].set(False)
  weights = jax.random.uniform(jax.random.key(3), (B, T))
  against = scoring.Teacher(teacher_cfg, teacher_params, beta)

  def ours(p):
    return scoring.score_tokens(policy_cfg, p, tokens, mask, temperature, against).divergence

  def full(p):
    s = transformer.forward(policy_cfg, p, tokens, mask)[:, :-1] / temperature
    t = transformer.forward(teacher_cfg, teacher_params, tokens, mask)[:, :-1] / temperature
    return jnp.concatenate([jnp.zeros((B, 1)), distill.generalized_jsd(s, t, beta)], 1)

  # Each side jitted with its gradient: one compile each, not an op-by-op dispatch of two transformers' backward.
  ours_and_grad, full_and_grad = (jax.jit(jax.value_and_grad(lambda p, f=f: jnp.sum(f(p) * weights)))
                                  for f in (ours, full))
  np.testing.assert_allclose(np.asarray(jax.jit(ours)(policy)), np.asarray(jax.jit(full)(policy)), atol=1e-5)
  assert float(jnp.max(jax.jit(full)(policy))) > 0.01
  (v_ours, g_ours), (v_full, g_full) = ours_and_grad(policy), full_and_grad(policy)
  assert float(v_ours) == pytest.approx(float(v_full), abs=1e-5)
  chex.assert_trees_all_close(g_ours, g_full, atol=1e-5)
  hidden = transformer.hidden_states(teacher_cfg, teacher_params, tokens, mask)[:, :-1]  # made beforehand: the same
  stored = scoring.score_tokens(policy_cfg, policy, tokens, mask, temperature, against._replace(hidden=hidden))
  np.testing.assert_allclose(np.asarray(stored.divergence), np.asarray(jax.jit(ours)(policy)), atol=1e-6)
  plain = scoring.score_tokens(policy_cfg, policy, tokens, mask, temperature)  # the log-probs are the same with it
  both = scoring.score_tokens(policy_cfg, policy, tokens, mask, temperature, against)
  assert plain.divergence is None
  np.testing.assert_allclose(np.asarray(both.logp), np.asarray(plain.logp), atol=1e-6)


def test_steps_on_the_teachers_samples_need_the_jsd_loss():
  config = _rl_config()
  config.stages, config.teacher.init_from = ("rl",), "/"
  config.rl.distill.on_policy = 0.5
  with pytest.raises(ConfigError, match="config.rl.distill.on_policy"):
    config_lib.validate(config, num_devices=1)
  config.rl.distill.loss = "jsd"
  config_lib.validate(config, num_devices=1)
  with pytest.raises(ConfigError, match="config.rl.distill.on_policy: < 1 samples the teacher"):
    teacher.check_samples(presets.get("test"), presets.get("test", n_layers=3))
  teacher.check_samples(presets.get("test"), presets.get("test", param_dtype="bfloat16"))


def _gkd_run(tmp_path, on_policy: float, learning_rate: float, steps: int, crash: frozenset[int] = frozenset()
             ) -> list[dict[str, float]]:
  """GKD with beta = 0.5 towards the sharpened teacher of the reward test above; the metrics of `steps` steps, the
  teacher's forward crashing at the steps `crash`."""
  config = smoke_config(distill__coef=1.0, distill__verifier=0.0, distill__loss="jsd", distill__beta=0.5,
                        distill__on_policy=on_policy, kl__placement="none", learning_rate=learning_rate)
  ctx = make_ctx(config, (1, 1, 1), str(tmp_path / f"run{on_policy}"))
  sharp = jax.device_get(ctx.policy)
  sharp["final_norm"] = sharp["final_norm"] * 10.0
  with Checkpointer(str(tmp_path / f"teacher{on_policy}")) as ckpt:
    ckpt.save(1, {"params": sharp})
  config.teacher.init_from, config.teacher.param_dtype = str(tmp_path / f"teacher{on_policy}"), "float32"
  trainer = RLTrainer(ctx, log=lambda *_: None)
  now, metrics = _crash_teacher(trainer, crash), []
  try:
    for step in range(1, steps + 1):
      now["step"] = step
      metrics.append(trainer.train_step(step))
    return metrics
  finally:
    trainer.source.close()


def test_gkd_trains_the_divergence_on_both_models_samples(tmp_path):
  """lambda = 0.5: the steps on the teacher's samples are the seed's coins, take no policy gradient (the divergence
  alone trains) and log their rollout apart. On the student's own samples the JSD falls fast (0.54 -> 0.07 in 11
  steps here: the student sharpens onto modes it shares with the teacher), while on the teacher's samples it stays
  near 0.5: the prefixes the student never visits, the mismatch that lambda trades off. lambda = 0 (supervised KD
  on the teacher's samples alone) lowers the JSD on them too, more slowly (0.54 -> 0.38 in 8 steps).

  The teacher's forward crashes at the student's third step: its rows are masked (the stand-in hidden states keep
  the divergence finite), counted, and the run goes on."""
  coins = [distill.teacher_step(smoke_config().seed, step, 0.5) for step in range(1, 13)]
  assert 2 <= sum(coins) <= 10
  crash = [step for step, t in enumerate(coins, 1) if not t][2]
  metrics = _gkd_run(tmp_path, 0.5, 3e-2, 12, frozenset({crash}))
  assert [m["distill/teacher_error"] for m in metrics] == [float(step == crash) for step in range(1, 13)]
  assert metrics[crash - 1]["distill/teacher_invalid_frac"] == 1.0
  assert all(np.isfinite(v) for v in metrics[crash - 1].values()) and metrics[crash - 1]["train/skipped"] == 0
  assert [bool(m["distill/teacher_step"]) for m in metrics] == coins
  for m, by_teacher in zip(metrics, coins, strict=True):
    assert ("teacher_samples/rollout/reward_mean" in m) == by_teacher == ("rollout/reward_mean" not in m)
    if by_teacher:
      assert m["policy/pg_loss"] == 0.0
  own = [m["distill/jsd"] for i, (m, t) in enumerate(zip(metrics, coins, strict=True), 1) if not t and i != crash]
  assert np.mean(own[-2:]) < 0.3 * np.mean(own[:2]), own
  supervised = [m["distill/jsd"] for m in _gkd_run(tmp_path, 0.0, 1e-2, 8)]
  assert np.mean(supervised[-2:]) < 0.85 * np.mean(supervised[:2]), supervised
