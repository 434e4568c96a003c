"""The "sample" stage: draw completions from the policy for fixed prompts and report throughput.

Until the RL loop lands this is what the embedded default runs: it exercises the whole path a
run takes (config -> mesh -> sharded parameters -> jitted KV-cache sampler -> decode) and writes
`samples.jsonl` in the workdir.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from typing import Any

import jax
import numpy as np

from rl_lm import mesh as mesh_lib
from rl_lm import sampling, tokenizer
from rl_lm.models import build


def run(config: Any, workdir: str) -> None:
  mesh = mesh_lib.mesh_from_config(config.mesh)
  rules = mesh_lib.rules_from_config(config.mesh)
  key = jax.random.key(config.seed)
  model_cfg, params = build.load_or_init(config.model, mesh, rules, jax.random.fold_in(key, 0))
  tok = tokenizer.from_config(config)
  source = "random init" if not config.model.hf_checkpoint else config.model.hf_checkpoint
  print(f"rl_lm: model {config.model.preset if not config.model.hf_checkpoint else 'hf'} "
        f"({model_cfg.num_params() / 1e6:.2f}M params, {source}) on mesh {dict(mesh.shape)}", flush=True)
  print("rl_lm: the RL loop is not built yet; this config samples from the policy as it is.", flush=True)

  texts = list(itertools.islice(itertools.cycle(config.sample.prompts), config.sample.batch_size))
  prompts, lengths = sampling.pad_prompts([tokenizer.encode_prompt(tok, t) for t in texts], tok.pad_id, multiple=8)
  batch_sharding = mesh_lib.batch_sharding(mesh, rules, prompts.shape)
  prompts = jax.device_put(prompts, batch_sharding)
  lengths = jax.device_put(lengths, mesh_lib.batch_sharding(mesh, rules, lengths.shape))
  scfg = sampling.config_from(config.sampling, tok.eos_id, tok.pad_id)
  generate = sampling.make_generate_fn(model_cfg, scfg, mesh, rules)

  records, timings = [], []
  for b in range(config.sample.num_batches):
    start = time.perf_counter()
    out = jax.block_until_ready(generate(params, prompts, lengths, jax.random.fold_in(key, b + 1)))
    seconds = time.perf_counter() - start
    n_tokens = int(np.asarray(out.lengths).sum())
    timings.append((seconds, n_tokens))
    tag = " (includes compilation)" if b == 0 else ""
    print(f"rl_lm: batch {b + 1}/{config.sample.num_batches}: {n_tokens} tokens in {seconds:.2f}s{tag}", flush=True)
    tokens = np.asarray(out.tokens)
    P = prompts.shape[1]
    for i, text in enumerate(texts):
      completion = tok.decode(tokens[i, P: P + int(out.lengths[i])])
      records.append({"batch": b, "prompt": text, "completion": completion, "length": int(out.lengths[i]),
                      "finished": bool(out.finished[i]),
                      "sum_logprob": float(np.asarray(out.logprobs[i]).sum())})

  for r in records[: min(4, len(records))]:
    print(f"  {r['prompt']!r} -> {r['completion']!r}", flush=True)
  steady = timings[1:] or timings
  tps = sum(n for _, n in steady) / max(sum(s for s, _ in steady), 1e-9)
  print(f"rl_lm: decode throughput {tps:.0f} tokens/s over {len(steady)} batch(es) after compilation", flush=True)
  path = os.path.join(workdir, "samples.jsonl")
  with open(path, "w") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  print(f"rl_lm: wrote {len(records)} samples to {path}", flush=True)
