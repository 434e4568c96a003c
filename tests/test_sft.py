"""Supervised fine-tuning (rl_lm.train.sft): hand-checked masks, the loss, and a short run that learns.

CharTokenizer ids: pad 0, bos 1, eos 2, "\\n" 3, then ASCII 32..126 from 4, so a printable character c
has id ord(c) - 28: "+" 15, "-" 17, "0".."9" 20..29, "=" 33.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default
from rl_lm.models import presets, transformer
from rl_lm.tasks.arithmetic import ArithmeticTask
from rl_lm.tokenizer import CharTokenizer
from rl_lm.train import sft
from rl_lm.train.context import make_context

T, F = True, False


def test_char_ids_used_below():
  tok = CharTokenizer()
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
  assert tok.encode("+-=0123456789") == [15, 17, 33] + list(range(20, 30))


def test_encode_examples_masks_by_hand():
  tok = CharTokenizer()
  pairs = [
    ("1+2=", "3"),  # bos 1 + 2 = | 3 eos | pad: fits in 8 with one pad
    ("9-12=", "-3"),  # exactly 8: bos 9 - 1 2 = | - 3 ... eos cut -> truncated
    ("12+34=", "46"),  # 10 tokens: only the first target token survives
    ("123456789=", "1"),  # the prompt alone overflows: nothing to learn from
  ]
  out = sft.encode_examples(tok, pairs, max_len=8)
  np.testing.assert_array_equal(out["tokens"], [
    [1, 21, 15, 22, 33, 23, 2, 0],
    [1, 29, 17, 21, 22, 33, 17, 23],
    [1, 21, 22, 15, 23, 24, 33, 24],
    [1, 21, 22, 23, 24, 25, 26, 27],
  ])
  np.testing.assert_array_equal(out["mask"], [
    [T, T, T, T, T, T, T, F],  # padding is not a real token
    [T] * 8,
    [T] * 8,
    [T] * 8,
  ])
  np.testing.assert_array_equal(out["loss_mask"], [
    [F, F, F, F, F, T, T, F],  # the target "3" and eos; prompt (with bos) and padding masked
    [F, F, F, F, F, F, T, T],
    [F, F, F, F, F, F, F, T],
    [F] * 8,
  ])
  assert int(out["truncated"]) == 3
  assert out["tokens"].dtype == np.int32

  fits = sft.encode_examples(tok, pairs[:1], max_len=12)
  assert int(fits["truncated"]) == 0
  np.testing.assert_array_equal(fits["tokens"][0], [1, 21, 15, 22, 33, 23, 2, 0, 0, 0, 0, 0])
  assert fits["loss_mask"][0].tolist() == [F] * 5 + [T, T] + [F] * 5


def test_sft_loss_counts_only_target_tokens():
  tok = CharTokenizer()
  cfg = presets.get("test")
  params = transformer.init(cfg, jax.random.key(0))
  batch = sft.encode_examples(tok, [("1+2=", "3"), ("7-9=", "-2"), ("4+4=", "8")], max_len=10)
  batch.pop("truncated")
  loss_fn = jax.jit(sft.sft_loss(cfg))
  loss, metrics = loss_fn(params, {k: jnp.asarray(v) for k, v in batch.items()}, None)

  forward = jax.jit(lambda p, t, m: transformer.forward(cfg, p, t, m))
  logits = np.asarray(forward(params, jnp.asarray(batch["tokens"]), jnp.asarray(batch["mask"])))
  logp = np.asarray(jax.nn.log_softmax(logits[:, :-1], axis=-1))  # position t predicts token t + 1
  want = [-logp[b, t - 1, batch["tokens"][b, t]] for b, t in zip(*np.nonzero(batch["loss_mask"]), strict=True)]
  assert len(want) == 2 + 3 + 2  # "3" eos, "-" "2" eos, "8" eos
  assert float(loss) == pytest.approx(np.mean(want), rel=1e-5)
  assert float(metrics["sft/tokens"]) == 7

  # Padding does not matter: other pad ids change neither the loss nor anything else.
  scrambled = dict(batch, tokens=np.where(batch["mask"], batch["tokens"], 77))
  loss2, _ = loss_fn(params, {k: jnp.asarray(v) for k, v in scrambled.items()}, None)
  assert float(loss2) == pytest.approx(float(loss), rel=1e-6)


def test_short_sft_run_learns_arithmetic(tmp_path):
  config = default.get_config("smoke")
  config.model.preset = "test"
  config.task.levels = (1,)
  config.sft.steps = 40
  config.sft.batch_size = 64
  config.sft.max_len = 12  # level 1: bos + at most 4 prompt chars + at most 2 answer digits + eos
  config.sft.learning_rate = 3e-3
  config.sft.warmup_steps = 4
  config.sft.weight_decay = 0.0
  config.sft.log_every = 20
  ctx = make_context(config, str(tmp_path))
  task = ArithmeticTask(levels=(1,))

  held_out = task.test_problems(16, seed=0)
  batch = sft.encode_examples(ctx.tokenizer, [(p.prompt, task.reference_completion(p)) for p in held_out], 12)
  assert int(batch.pop("truncated")) == 0
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  loss_fn = jax.jit(lambda params: sft.sft_loss(ctx.model_cfg)(params, batch, None))

  before, _ = loss_fn(ctx.policy)
  lines = []
  last = sft.train(ctx, task, config.sft, log=lines.append)
  after, metrics = loss_fn(ctx.policy)
  before, after = float(before), float(after)
  # A random model is near uniform over 128 ids (ln 128 = 4.85); after 40 steps it knows the answer
  # format (digits, a sign, eos after one or two digits) and part of the sums. Measured: 4.83 -> 1.65,
  # token accuracy 0.62.
  assert before > 4.0
  assert after < 0.5 * before, (before, after, lines)
  assert float(metrics["sft/accuracy"]) > 0.4, (after, lines)
  assert last["train/loss"] < 0.5 * before
  assert last["sft/truncated"] == 0
  assert len(lines) == 2 and "sft step 40/40" in lines[-1]


def test_batches_from_a_data_position_continue_the_same_stream():
  """A resumed run asks for batches from step k: they are the ones an uninterrupted run saw, including the
  demonstrations' own random choices (decimal answers)."""
  task = ArithmeticTask(levels=(1,), decimal_demos=0.5, seed=0)
  tok = CharTokenizer()
  whole = sft.batches(ArithmeticTask(levels=(1,), decimal_demos=0.5, seed=0), tok, 8, 16, seed=0)
  first = [next(whole) for _ in range(5)]
  resumed = sft.batches(task, tok, 8, 16, seed=0, start=3)
  for expected in first[3:]:
    got = next(resumed)
    np.testing.assert_array_equal(got["tokens"], expected["tokens"])
