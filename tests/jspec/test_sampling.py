"""The logits-processing path against an independent numpy reference, and sampling frequencies
against the processed distribution (chi-square)."""

import unittest.mock as mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jspec import sampling
from jspec.sampling import SamplingParams, process_logits, sample


def reference_probs(logits, temperature, top_k, top_p):
  """Plain numpy, one row at a time: temperature, then top-k, then top-p (smallest prefix of the
  sorted distribution whose mass reaches top_p)."""
  if temperature == 0:
    out = np.zeros_like(logits)
    out[np.argmax(logits)] = 1.0
    return out
  z = logits / temperature
  order = np.argsort(-z)
  keep = np.zeros(len(z), bool)
  k = len(z) if top_k == 0 else min(top_k, len(z))
  keep[order[:k]] = True
  if top_p < 1.0:
    zk = np.where(keep, z, -np.inf)
    pk = np.exp(zk - zk.max())
    pk /= pk.sum()
    mass = 0.0
    keep_p = np.zeros(len(z), bool)
    for idx in order:
      if not keep[idx]:
        break
      keep_p[idx] = True
      mass += pk[idx]
      if mass >= top_p:
        break
    keep &= keep_p
  e = np.where(keep, np.exp(z - z[keep].max()), 0.0)
  return e / e.sum()


ROWS = [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.5, 12, 0.6),
        (2.0, 1, 1.0), (1.0, 0, 0.05), (1.0, 40, 0.95)]


def test_process_logits_matches_reference():
  rng = np.random.default_rng(0)
  logits = rng.normal(0, 2.5, size=(len(ROWS), 32)).astype(np.float32)
  params = SamplingParams.make(len(ROWS), *map(list, zip(*ROWS)))
  got = np.exp(np.asarray(process_logits(jnp.asarray(logits), params)))
  for row, (t, k, p) in enumerate(ROWS):
    np.testing.assert_allclose(got[row], reference_probs(logits[row].astype(np.float64), t, k, p),
                               atol=2e-6, err_msg=f"row {row}: T={t} top_k={k} top_p={p}")


def test_process_logits_broadcasts_over_positions():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(3, 4, 16)).astype(np.float32)   # [B, D+1, V] as in verification
  params = SamplingParams.make(3, [0.0, 0.9, 1.2], [0, 4, 0], [1.0, 1.0, 0.7])
  got = np.asarray(process_logits(jnp.asarray(logits), params))
  for b in range(3):
    sub = SamplingParams.make(4, float(params.temperature[b]), int(params.top_k[b]),
                              float(params.top_p[b]))
    np.testing.assert_allclose(got[b], np.asarray(process_logits(jnp.asarray(logits[b]), sub)),
                               atol=1e-6)


# V larger than the candidates looked at first: peaked rows cut among them, flat rows and
# top_k > TOP_CANDIDATES cut by bisection over the whole row
WIDE_ROWS = [(1.0, 0, 0.9, 6.0), (1.0, 0, 0.95, 0.05), (0.8, 300, 1.0, 1.0), (1.0, 5, 1.0, 3.0),
             (1.2, 400, 0.99, 0.3), (1.0, 0, 0.3, 4.0), (0.0, 0, 0.5, 1.0), (1.0, 0, 1.0, 1.0)]


def _wide_logits(seed: int, v: int = 1000) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return np.stack([rng.normal(0, scale, v) for *_, scale in WIDE_ROWS]).astype(np.float32)


def test_process_logits_matches_reference_past_the_candidates():
  logits = _wide_logits(3)
  params = SamplingParams.make(len(WIDE_ROWS), *[[r[i] for r in WIDE_ROWS] for i in range(3)])
  got = np.exp(np.asarray(process_logits(jnp.asarray(logits), params), np.float64))
  for row, (t, k, p, _) in enumerate(WIDE_ROWS):
    want = reference_probs(logits[row].astype(np.float64), t, k, p)
    np.testing.assert_array_equal(got[row] > 0, want > 0, err_msg=f"row {row} keeps another set")
    np.testing.assert_allclose(got[row], want, atol=2e-6, err_msg=f"row {row}")


def test_bisection_and_candidate_cuts_agree(monkeypatch):
  """Every row cut by bisection (2 candidates) keeps exactly what the candidate cut keeps."""
  logits = jnp.asarray(_wide_logits(4))
  params = SamplingParams.make(len(WIDE_ROWS), [1.0] * 8, [r[1] for r in WIDE_ROWS],
                               [r[2] for r in WIDE_ROWS])
  first = np.asarray(process_logits(logits, params))
  monkeypatch.setattr(sampling, "TOP_CANDIDATES", 2)
  second = np.asarray(process_logits(logits, params))
  np.testing.assert_array_equal(np.isfinite(first), np.isfinite(second))
  np.testing.assert_allclose(first, second, atol=1e-6)


def test_a_row_is_cut_the_same_whatever_its_batch():
  """A peaked row (cut among the candidates) is bit-identical alone and beside a flat row (which
  sends the batch through the bisection)."""
  logits = _wide_logits(5)
  alone = process_logits(jnp.asarray(logits[:1]), SamplingParams.make(1, 1.0, 0, 0.9))
  pair = process_logits(jnp.asarray(logits[:2]), SamplingParams.make(2, 1.0, 0, [0.9, 0.95]))
  np.testing.assert_array_equal(np.asarray(alone)[0], np.asarray(pair)[0])


@pytest.mark.parametrize("candidates", [256, 2])
def test_ties_at_a_cut_are_kept(monkeypatch, candidates):
  monkeypatch.setattr(sampling, "TOP_CANDIDATES", candidates)
  logits = np.full((2, 600), -5.0, np.float32)
  logits[:, 0], logits[:, 1:4] = 3.0, 2.0                # one top value, three tied below it
  params = SamplingParams.make(2, 1.0, [2, 0], [1.0, 0.5])
  kept = np.isfinite(np.asarray(process_logits(jnp.asarray(logits), params)))
  want = np.zeros(600, bool)
  want[:4] = True
  np.testing.assert_array_equal(kept[0], want)           # top-2 keeps 3.0 and every tied 2.0
  # top-p 0.5: mass above a 2.0 is p(3.0) < 0.5, so the tied 2.0s are all kept
  assert np.exp(3.0) / (np.exp(3.0) + 3 * np.exp(2.0) + 596 * np.exp(-5.0)) < 0.5
  np.testing.assert_array_equal(kept[1], want)


def test_sample_frequencies_match_processed_distribution():
  """1e5 draws per row through `sample`, chi-square against the processed distribution. The
  threshold p < 1e-4 per row (8 rows) gives a false-alarm rate below 1e-3 per run."""
  rng = np.random.default_rng(2)
  v, n = 12, 100_000
  logits = rng.normal(0, 1.5, size=(len(ROWS), v)).astype(np.float32)
  params = SamplingParams.make(len(ROWS), *map(list, zip(*ROWS)))
  probs = np.exp(np.asarray(process_logits(jnp.asarray(logits), params), np.float64))
  draw = jax.jit(jax.vmap(lambda k: sample(jax.random.split(k, len(ROWS)), jnp.asarray(logits),
                                           params)))
  tokens = np.asarray(draw(jax.random.split(jax.random.key(0), n)))   # [n, B]
  for row in range(len(ROWS)):
    counts = np.bincount(tokens[:, row], minlength=v)
    support = probs[row] > 0
    assert counts[~support].sum() == 0, f"row {row} sampled outside the top-k/top-p set"
    if support.sum() == 1:
      continue
    _, pvalue = stats.chisquare(counts[support], n * probs[row][support] / probs[row][support].sum())
    assert pvalue > 1e-4, f"row {row} {ROWS[row]}: p={pvalue}"


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-0.5), "temperature must be >= 0"),
    (dict(top_k=-1), "top_k must be >= 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(temperature=[0.1, 0.2, 0.3]), "temperature has 3 values for a batch of 2"),
])
def test_bad_sampling_parameters(kwargs, message):
  with pytest.raises(ValueError, match=message):
    SamplingParams.make(2, **kwargs)


@pytest.mark.parametrize("v", [7, 256, 700])
def test_categorical_frequencies_and_zeros(v):
  """Two-level inverse-CDF draws: chi-square against the probabilities (one block, several, a
  ragged last block), zero-probability tokens (whole blocks too) never drawn."""
  rng = np.random.default_rng(v)
  probs = rng.gamma(0.3, size=(3, v)).astype(np.float32)
  probs[0, ::3] = 0.0                                  # scattered zeros
  probs[1, : v // 2] = 0.0                             # a zero prefix (whole blocks when v > 512)
  probs[2] *= 7.5                                      # unnormalised
  n = 60_000
  draw = jax.jit(jax.vmap(lambda k: sampling.categorical(jax.random.split(k, 3),
                                                         jnp.asarray(probs))))
  tokens = np.asarray(draw(jax.random.split(jax.random.key(v), n)))     # [n, 3]
  for row in range(3):
    counts = np.bincount(tokens[:, row], minlength=v)
    assert counts.shape == (v,) and counts[probs[row] == 0].sum() == 0
    support = probs[row] > 0
    p64 = probs[row][support].astype(np.float64)
    expected = n * p64 / p64.sum()
    big = expected >= 5                                  # chi-square over the well-populated cells
    obs, exp = counts[support][big], expected[big]
    if (~big).any():                                     # the rest pooled into one cell
      obs, exp = np.append(obs, counts[support][~big].sum()), np.append(exp, expected[~big].sum())
    _, pvalue = stats.chisquare(obs, exp * obs.sum() / exp.sum())
    assert pvalue > 1e-4, f"row {row}: p={pvalue}"


def test_categorical_edge_uniforms():
  """u = 0 takes the first token with mass; a target at the very end takes the last one."""
  probs = jnp.asarray([[0.0, 0.0, 0.5, 0.0, 0.5, 0.0, 0.0]], jnp.float32)
  for u, want in ((0.0, 2), (np.nextafter(np.float32(1), np.float32(0)), 4)):
    with mock.patch.object(jax.random, "uniform", lambda k, shape, dtype: jnp.asarray(u, dtype)):
      got = sampling.categorical(jax.random.split(jax.random.key(0), 1), probs)
    assert int(got[0]) == want
