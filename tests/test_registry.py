"""One registry style (rl_lm/registry.py) for policy losses, advantage estimators, rewards, environments, tasks and
stages: a part registered with its decorator is a valid config value, an unknown name fails naming the key and the
known names, a name is taken once, and every registry still holds the built-ins it had."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from rl_lm import config as config_lib
from rl_lm import rewards, tasks
from rl_lm.config import ConfigError
from rl_lm.config.rl import Correction, Rl
from rl_lm.envs import base
from rl_lm.registry import Registry, UnknownNameError
from rl_lm.rl import advantages, correction, losses, policy_losses
from rl_lm.rl.masked import masked_mean
from rl_lm.train import rl_update, stages

REGISTRIES = {
  "policy loss": policy_losses.LOSSES, "advantage estimator": advantages.ESTIMATORS, "reward": rewards.REWARDS,
  "environment": base.ENVIRONMENTS, "task": tasks.TASKS, "stage": stages.STAGES,
}
BUILTINS = {  # what each held before the registries were unified
  "policy loss": {"ppo", "gspo", "cispo", "gmpo", "clip_cov", "kl_cov"},
  "advantage estimator": {"grpo", "dr_grpo", "rloo", "reinforce_pp", "ppo"},
  "reward": {"correctness", "arithmetic", "maths", "code", "format", "length", "preference_gold",
             "preference_correct"},
  "environment": {"calculator", "python_tool"},
  "task": {"arithmetic", "gsm8k", "humaneval", "preferences", "products"},
  "stage": {"sample", "sft", "reward_model", "dpo", "rl"},
}


@pytest.fixture
def scratch(monkeypatch):
  """What a test registers is gone after it: each registry works on a copy of its entries (built-ins loaded)."""
  for registry in REGISTRIES.values():
    registry.names()  # loads the lazily registered built-ins into the entries that are copied
    monkeypatch.setattr(registry, "_entries", dict(registry._entries))


def _config(stages_: tuple[str, ...] = ("rl",), **overrides):
  config = config_lib.base_config()
  config.stages = stages_
  for key, value in overrides.items():
    *path, leaf = key.split(".")
    node = config
    for part in path:
      node = node[part]
    node[leaf] = value
  return config


def _rejected(config, key: str) -> str:
  with pytest.raises(ConfigError) as e:
    config_lib.validate(config, num_devices=1)
  assert e.value.key == key, str(e.value)
  return str(e.value)


@pytest.mark.parametrize("kind", sorted(REGISTRIES))
def test_every_registry_keeps_its_builtins(kind):
  registry = REGISTRIES[kind]
  assert registry.kind == kind
  assert BUILTINS[kind] <= set(registry.names())
  assert list(registry.names()) == sorted(registry.names())
  for name in BUILTINS[kind]:
    assert name in registry and registry.get(name) is registry[name]


def test_builtin_properties_that_were_constants():
  group = {n for n in advantages.ESTIMATORS if advantages.ESTIMATORS.get(n).group}
  assert group == {"grpo", "dr_grpo", "rloo"}  # was GROUP_ALGORITHMS, in two modules
  sequence = {n for n in policy_losses.LOSSES if policy_losses.LOSSES.get(n).sequence_level}
  assert sequence == {"gspo", "gmpo"}  # was SEQUENCE_LEVEL, and a literal in config/rl.py
  assert policy_losses.LOSSES.get("ppo").fn is policy_losses.ppo_loss  # PPO is registered like the others
  assert tasks.TASKS.get("arithmetic") is tasks.ArithmeticTask
  assert base.locate("calculator") == ("rl_lm.envs.calculator", "CalculatorEnv")
  # The config's fixed choices are the implementing modules' constants, not copies.
  assert Rl.__dataclass_fields__["loss_mode"].metadata["allowed"] is losses.MODES
  assert Correction.__dataclass_fields__["level"].metadata["allowed"] is correction.LEVELS


def test_registry_refuses_a_second_value_and_names_the_known_ones():
  loaded = []
  registry: Registry[int] = Registry("widget", load=lambda: loaded.append(registry.add("builtin", 0)))
  assert registry.register("b")(2) == 2  # the decorator hands back what it decorates
  registry.register("a")(1)
  with pytest.raises(ValueError, match="widget 'a' is already registered"):
    registry.register("a")(3)
  registry.register("a")(1)  # the same value again (a module imported twice) is a no-op
  assert registry.get("a") == 1 and registry["b"] == 2
  assert registry.names() == ("a", "b", "builtin") and loaded == [None]  # built-ins loaded once, at the first look
  assert "a" in registry and "c" not in registry and 3 not in registry
  with pytest.raises(UnknownNameError) as e:
    registry.get("c")
  assert str(e.value) == "unknown widget 'c'; known widgets: a, b, builtin"
  assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError) and e.value.user_facing
  assert registry.problem("c") == str(e.value) and registry.problem("a") is None
  with pytest.raises(ValueError, match="non-empty string"):
    registry.register("")(4)


def test_a_failed_builtin_load_is_retried():
  calls = []

  def load():
    calls.append(1)
    if len(calls) == 1:
      raise ImportError("half-installed plug-in")
    registry.add("builtin", 0)

  registry: Registry[int] = Registry("widget", load=load)
  with pytest.raises(ImportError):
    registry.names()
  assert registry.names() == ("builtin",) and len(calls) == 2


def test_a_registered_policy_loss_is_a_config_choice_with_its_own_options(scratch):
  @policy_losses.register("test_scaled_pg", options={"scale": "cov_kl_coef"})
  def scaled_pg(logp, old_logp, advantages_, mask, clip_low, clip_high, mode="token-mean", is_weights=None,
                norm_constant=None, scale=1.0):
    return scale * masked_mean(-advantages_[:, None] * logp, mask), {}

  config = _config(**{"rl.policy_loss": "test_scaled_pg", "rl.cov_kl_coef": 3.0})
  config_lib.validate(config, num_devices=1)
  options = policy_losses.options(config.rl)
  assert options == {"scale": 3.0}
  logp, mask = jnp.asarray([[-1.0, -2.0], [-0.5, -4.0]]), jnp.asarray([[True, True], [True, False]])
  loss, _ = policy_losses.compute("test_scaled_pg", logp, logp, jnp.asarray([1.0, 2.0]), mask, 0.2, 0.2, **options)
  np.testing.assert_allclose(float(loss), 3.0 * (1.0 + 2.0 + 1.0) / 3)
  message = _rejected(_config(**{"rl.policy_loss": "test_scaled_pgg"}), "config.rl.policy_loss")
  assert "unknown policy loss 'test_scaled_pgg'; known policy losses: cispo, clip_cov" in message
  assert "test_scaled_pg" in message.split("known policy losses: ")[1].split(", ")
  _rejected(_config(**{"rl.policy_loss": "test_scaled_pg", "rl.dual_clip": 2.0}), "config.rl.dual_clip")
  with pytest.raises(ValueError, match="policy loss 'ppo' is already registered"):
    policy_losses.register("ppo")(scaled_pg)
  with pytest.raises(UnknownNameError, match="known policy losses: .*ppo"):
    policy_losses.compute("nope", logp, logp, jnp.ones(2), mask, 0.2, 0.2)


def test_a_registered_advantage_estimator_is_a_config_choice(scratch):
  @advantages.register("test_constant", group=True)
  def constant(x: advantages.Inputs, rl):
    return jnp.where(x.completion_mask, 1.0, 0.0), None

  config_lib.validate(_config(**{"rl.algorithm": "test_constant"}), num_devices=1)
  _rejected(_config(**{"rl.algorithm": "test_constant", "rl.group_size": 1}), "config.rl.group_size")  # a group one
  message = _rejected(_config(**{"rl.algorithm": "a3c"}), "config.rl.algorithm")
  assert "unknown advantage estimator 'a3c'; known advantage estimators: dr_grpo, grpo, ppo" in message
  assert "test_constant" in message
  comp = jnp.asarray([[True, True, False], [True, False, False]])
  rl = _config(**{"rl.algorithm": "test_constant"}).rl
  zeros = jnp.zeros((2, 3))
  adv, returns = rl_update.advantages(rl, jnp.zeros(2), jnp.asarray([True, False]), comp, zeros, zeros, None,
                                      jnp.float32(0.0))
  assert returns is None and np.asarray(adv).tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]  # row 1 does not train
  with pytest.raises(ValueError, match="advantage estimator 'grpo' is already registered"):
    advantages.register("grpo", group=True)(constant)


def test_a_registered_task_reward_and_environment_are_config_choices(scratch):
  @tasks.register("test_task")
  class TestTask(tasks.ArithmeticTask):
    pass

  rewards.register("test_reward")(lambda: rewards.REWARDS.get("format")())
  base.register("test_env")(_QuietEnv)
  config = _config(**{"task.name": "test_task", "reward.weights": {"correctness": 1.0, "test_reward": 0.1},
                      "env.name": "test_env"})
  config_lib.validate(config, num_devices=1)
  assert isinstance(tasks.make_task("test_task"), TestTask)
  assert base.locate("test_env") == (__name__, "_QuietEnv")
  message = _rejected(_config(**{"task.name": "chess"}), "config.task.name")
  # Other test modules in the same process may have registered names of their own: the lists hold at least these.
  known = message.split("unknown task 'chess'; known tasks: ")[1].split(", ")
  assert {"arithmetic", "gsm8k", "humaneval", "preferences", "products", "test_task"} <= set(known)
  message = _rejected(_config(**{"reward.weights": {"test_rewardd": 1.0}}), "config.reward.weights.test_rewardd")
  assert "test_reward" in message.split("unknown reward 'test_rewardd'; known rewards: ")[1].split(", ")
  message = _rejected(_config(**{"env.name": "chess"}), "config.env.name")
  known = message.split("unknown environment 'chess'; known environments: ")[1].split(", ")
  assert {"calculator", "python_tool", "test_env"} <= set(known) and known == sorted(known)
  with pytest.raises(ValueError, match="task 'arithmetic' is already registered"):
    tasks.register("arithmetic")(TestTask)
  with pytest.raises(ValueError, match="reward 'format' is already registered"):
    rewards.register("format")(lambda: None)
  with pytest.raises(ValueError, match="environment 'calculator' is already registered"):
    base.register("calculator")(_QuietEnv)


def test_a_registered_stage_is_a_config_choice_and_what_main_runs(scratch):
  @stages.register("test_stage")
  def test_stage(ctx):
    return ctx

  config_lib.validate(_config(("sample", "test_stage")), num_devices=1)
  assert stages.STAGES["test_stage"] is test_stage  # rl_lm.main runs STAGES[name](ctx)
  message = _rejected(_config(("sample", "fly")), "config.stages[1]")
  known = "cai_sft, dpo, reward_model, rl, sample, sft, teacher_sft, test_stage"
  assert message.endswith(f"unknown stage 'fly'; known stages: {known}")
  with pytest.raises(ValueError, match="stage 'rl' is already registered"):
    stages.register("rl")(test_stage)


class _QuietEnv(base.Environment):
  """An environment that ends at once (only registered here, never run)."""

  def reset(self, problem, rng):
    return problem.prompt

  def step(self, action):
    return base.Step("", 0.0, True)
