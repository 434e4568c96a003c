"""Ahead-of-time compilation for TPU slices and H100 GPUs, on a CPU: does a run fit, and how fast would it be.

  python -m rl_lm.aot --config=configs/gsm8k_qwen.py --topology=v5p-64 --config.model.preset=llama-3.1-8b ...
  python -m rl_lm.aot --config=configs/gsm8k_qwen.py --topology=h100-8 ...   # one host of 8 H100s

- chips.py     the chips and GPUs (memory, peak FLOP/s, bandwidths, with sources) and their names -> jax's devices
- h100_sxm.txtpb  the H100 as XLA:GPU compiles for it (NVIDIA's figures)
- programs.py  what a compiled program is made of, and abstract (sharded, unallocated) arguments
- stages.py    every jitted function of every configured stage, with the buffers the run holds beside them
- samplers.py  the samplers' generate call (memory) and its prefill and decode steps (cost)
- measure.py   compiles them: memory per chip; cost with loops accounted for (1- and 2-layer pieces, unrolled;
               a decode step with all its layers)
- flops.py     the analytic FLOP count each estimate is checked against; model FLOPs for MFU
- hlo.py       the collectives in a compiled program's HLO, and which of them cross hosts
- report.py    tables, JSON, and the one-line refusal of a run that does not fit
- search.py    the mesh shapes that divide a slice, ranked by XLA's estimate
- __main__.py  the command line
"""
