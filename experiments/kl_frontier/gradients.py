"""What each KL estimator's gradient is in expectation, in the loss and in the reward, computed exactly.

  python -m experiments.kl_frontier.gradients [--vocab=16] [--draws=200] [--scales=0.3,1,3]

One token x drawn from a categorical pi = softmax(theta), a reference ref = softmax(phi), log r = log ref(x) -
log pi(x). The RL loop uses an estimator k(x) of KL(pi || ref) (rl_lm/rl/kl.py: k1 = -log r, k2 = (log r)^2 / 2,
k3 = r - 1 - log r) in one of two places:

  loss    coef * k(x) is added to the loss and differentiated through log pi(x), the sample x held fixed:
          expected gradient  E_pi[grad k(x)] = sum_x pi(x) grad k(x)
  reward  -coef * k(x) is a reward (no gradient through it), so it enters as a score-function term:
          expected gradient  E_pi[k(x) grad log pi(x)]

Both are summed over the support, so the figures are exact, not Monte Carlo. Each is compared with the
gradient of the KL the leash is meant to shrink, KL(pi || ref), and of the other direction, KL(ref || pi).
What comes out (and tests/test_kl_frontier.py checks against the algebra):
  loss k1    0: E_pi[grad log pi] = 0, so k1 in the loss is no leash at all (only noise);
  loss k2    grad KL(pi || ref) exactly (on-policy);
  loss k3    grad KL(ref || pi): the mass-covering direction, not the KL it estimates;
  reward k1  grad KL(pi || ref) exactly;
  reward k2, reward k3  neither; k3 as a reward is grad KL(pi || ref) - grad KL(ref || pi).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from rl_lm.rl import kl as kl_lib

PLACEMENTS = ("loss", "reward")


def kl_forward(theta: jax.Array, phi: jax.Array) -> jax.Array:
  """KL(pi || ref) for pi = softmax(theta), ref = softmax(phi) ([V] logits)."""
  logp, logq = jax.nn.log_softmax(theta), jax.nn.log_softmax(phi)
  return jnp.sum(jnp.exp(logp) * (logp - logq))


def kl_reverse(theta: jax.Array, phi: jax.Array) -> jax.Array:
  """KL(ref || pi)."""
  logp, logq = jax.nn.log_softmax(theta), jax.nn.log_softmax(phi)
  return jnp.sum(jnp.exp(logq) * (logq - logp))


def expected_gradient(theta: jax.Array, phi: jax.Array, placement: str, kind: str) -> jax.Array:
  """The expected gradient in theta [V] of estimator `kind` placed in the `placement` ("loss" or "reward")."""
  if placement not in PLACEMENTS:
    raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
  logq = jax.nn.log_softmax(phi)  # [V]
  probs = jax.lax.stop_gradient(jax.nn.softmax(theta))  # the sampling distribution: no gradient through it

  def objective(t: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(t)  # [V], one entry per possible sample x
    k = kl_lib.estimate(logp[None], logq[None], kind)[0]  # [V]
    if placement == "loss":
      return jnp.sum(probs * k)  # sum_x pi(x) k(x; theta), differentiated with pi held fixed
    return jnp.sum(probs * jax.lax.stop_gradient(k) * logp)  # the score-function term only

  return jax.grad(objective)(theta)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
  """Cosine of a and b; 0 where either is zero to float32 rounding (k1 in the loss: a sum that cancels)."""
  na, nb = np.linalg.norm(a), np.linalg.norm(b)
  return float(a @ b / (na * nb)) if na > 1e-4 * max(nb, 1e-30) and nb > 0 else 0.0


def table(vocab: int = 16, draws: int = 200, scale: float = 1.0, seed: int = 0) -> list[dict[str, float | str]]:
  """For each placement and estimator, over `draws` random (pi, ref) pairs: the mean cosine of its expected gradient
  with grad KL(pi || ref) and with grad KL(ref || pi), and its mean norm relative to grad KL(pi || ref)'s."""
  rng = np.random.default_rng(seed)
  rows = []
  fwd, rev = jax.jit(jax.grad(kl_forward)), jax.jit(jax.grad(kl_reverse))
  pairs = [(rng.normal(size=vocab) * 2.0, None) for _ in range(draws)]
  pairs = [(t, t + rng.normal(size=vocab) * scale) for t, _ in pairs]  # ref: the policy's logits moved by `scale`
  for placement in PLACEMENTS:
    for kind in kl_lib.KINDS:
      grad = jax.jit(lambda t, p, pl=placement, k=kind: expected_gradient(t, p, pl, k))
      cf, cr, rel = [], [], []
      for t, p in pairs:
        t, p = jnp.asarray(t, jnp.float32), jnp.asarray(p, jnp.float32)
        g, gf, gr = (np.asarray(x, np.float64) for x in (grad(t, p), fwd(t, p), rev(t, p)))
        cf.append(_cos(g, gf))
        cr.append(_cos(g, gr))
        rel.append(np.linalg.norm(g) / max(np.linalg.norm(gf), 1e-12))
      rows.append({"placement": placement, "estimator": kind, "cos_forward": float(np.mean(cf)),
                   "cos_reverse": float(np.mean(cr)), "norm_ratio": float(np.mean(rel))})
  return rows


def format_table(rows: list[dict[str, float | str]]) -> str:
  lines = ["| KL placed in | estimator | cos with grad KL(pi‖ref) | cos with grad KL(ref‖pi) | "
           "norm / grad KL(pi‖ref) |",
           "| --- | --- | --- | --- | --- |"]
  lines += [f"| {r['placement']} | {r['estimator']} | {r['cos_forward']:.3f} | {r['cos_reverse']:.3f} | "
            f"{r['norm_ratio']:.3f} |" for r in rows]
  return "\n".join(lines)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--vocab", type=int, default=16)
  ap.add_argument("--draws", type=int, default=200)
  ap.add_argument("--scales", default="0.3,1,3", help="stds of the reference's logit offsets from the policy's")
  args = ap.parse_args()
  for scale in (float(s) for s in args.scales.split(",")):
    print(f"reference logits = policy logits + N(0, {scale:g}^2), vocabulary {args.vocab}, {args.draws} draws:")
    print(format_table(table(args.vocab, args.draws, scale)))


if __name__ == "__main__":
  main()
