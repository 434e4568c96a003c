"""Multi-turn episodes with long-tailed turns: continuous batching against the static driver, useful tokens/s in one
run.

  python -m experiments.benchmarks.multiturn [--episodes=128] [--slots=32] [--turns=3] [--turn_tokens=192]
      [--stop_frac=0.02] [--repeats=3] [--json=FILE]

Preset `bench` (4 layers, d 256, vocab 4096, float32), temperature 1, an environment in this process that answers
every turn with a short observation and ends the episode after `--turns` turns. A turn ends on a stop token, and a
`--stop_frac` share of the vocabulary stops, so the random model's turn lengths are geometric (mean about 1 /
stop_frac), cut at `--turn_tokens`: a long tail. Static: `EpisodeRunner` over batches of `--slots` episodes, each turn
of a batch decoding until its longest turn ends. Continuous: one `EpisodeRunner` over all the episodes with `--slots`
cache rows (`slots=`): a row whose turn ends goes back to the host while the others decode on, and takes the next
episode when its own ends. Useful tokens = the episodes' real tokens (observations and the policy's turns, no
padding); the two sides draw from the same distribution (a static batch keys its episodes by their row in the batch,
so its draws are not the continuous run's token for token). Medians of `--repeats` warm runs.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from experiments.benchmarks import useful
from rl_lm import sampling, tokenizer
from rl_lm.envs import base, episodes
from rl_lm.models import presets, transformer
from rl_lm.tasks.base import Problem


class EchoEnv(base.Environment):
  """`turns` turns; each answered with "ok;" until the last."""

  turns = 3

  def reset(self, problem: Problem, rng: np.random.Generator) -> str:
    self.t = 0
    return problem.prompt

  def step(self, action: str) -> base.Step:
    self.t += 1
    done = self.t >= self.turns
    return base.Step("" if done else "ok;", 1.0 if done else 0.0, done, {})


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--episodes", type=int, default=128)
  parser.add_argument("--slots", type=int, default=32)
  parser.add_argument("--turns", type=int, default=3)
  parser.add_argument("--turn_tokens", type=int, default=192)
  parser.add_argument("--stop_frac", type=float, default=0.02)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--json", default="", help="also write the figures here")
  args = parser.parse_args()
  EchoEnv.turns = args.turns
  cfg = presets.get("bench", max_seq_len=1024)
  params = transformer.init(cfg, jax.random.key(0))
  tok = tokenizer.CharTokenizer()
  Q, R = args.episodes, args.slots
  stops = tuple(int(i) for i in np.random.default_rng(0).choice(np.arange(3, cfg.vocab_size),
                                                                 int(args.stop_frac * cfg.vocab_size), replace=False))
  scfg = sampling.SamplingConfig(max_new_tokens=args.turn_tokens, temperature=1.0, stop_tokens=stops,
                                 pad_id=tok.pad_id)
  limits = episodes.EpisodeLimits(args.turns, args.turn_tokens, args.turns * (args.turn_tokens + 16) + 16)
  envs = episodes.LocalEnvs(EchoEnv)
  problems = [Problem(id=f"q{i}", prompt=f"{i}*{i}=", answer="") for i in range(Q)]
  static_runner = episodes.EpisodeRunner(cfg, scfg, tok, envs, limits, R)
  continuous_runner = episodes.EpisodeRunner(cfg, scfg, tok, envs, limits, Q, slots=R)
  key = jax.random.key(1)

  def static() -> tuple[np.ndarray, np.ndarray]:
    outs = []
    for s in range(0, Q, R):
      outs.append(static_runner.run(params, problems[s:s + R], key, seeds=list(range(s, s + R))))
    return np.concatenate([o.host.tokens for o in outs]), np.concatenate([o.host.fill for o in outs])

  def continuous() -> tuple[np.ndarray, np.ndarray]:
    out = continuous_runner.run(params, problems, key, seeds=list(range(Q)))
    return out.host.tokens, out.host.fill

  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {Q} episodes of {args.turns} turns, turns up to "
        f"{args.turn_tokens} tokens ({len(stops)} stop tokens); {R} cache rows")
  useful.compare((("static", lambda: int(static()[1].sum())), ("continuous", lambda: int(continuous()[1].sum()))),
                 args.repeats, args.json)

if __name__ == "__main__":
  main()
