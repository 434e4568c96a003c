"""Useful tokens/s of two ways of producing the same work, measured in one run (the continuous-batching benchmarks)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence


def compare(sides: Sequence[tuple[str, Callable[[], int]]], repeats: int, json_path: str = ""
            ) -> tuple[dict[str, float], dict[str, int]]:
  """Each side's useful tokens/s: its first call compiles and returns the tokens it produced, then the median of
  `repeats` timed calls. Prints a line per side and the second side's rate over the first's; writes the rates to
  `json_path` (`<side>_tokens_per_s`) when given. -> (rates, tokens)."""
  rates, tokens = {}, {}
  for name, fn in sides:
    tokens[name] = fn()  # and compile
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      fn()
      times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    rates[name] = tokens[name] / seconds
    print(f"{name}: {tokens[name]} useful tokens in {seconds:.2f} s = {rates[name]:,.0f} tokens/s", flush=True)
  (first, _), (second, _) = sides[0], sides[-1]
  print(f"{second} / {first}: {rates[second] / rates[first]:.2f}x")
  if json_path:
    with open(json_path, "w") as f:
      json.dump({f"{k}_tokens_per_s": v for k, v in rates.items()}, f, indent=1)
  return rates, tokens
