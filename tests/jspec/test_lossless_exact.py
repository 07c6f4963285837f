"""Exact-enumeration losslessness: for a toy target/draft pair (V = 6, D <= 3) the exact distribution
of the first 3 emitted tokens equals the target's, to 1e-6.

Every draft sequence is enumerated with its probability under q, the acceptance probabilities and
final-token distributions come from `jspec.rejection.chain_outcomes` (the deterministic half of
`verify_chain`; its random half is checked by the Monte-Carlo test through the real round), p and
q come from `jspec.sampling.process_logits`, and rounds chain until 3 tokens are out.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.rejection import chain_outcomes
from jspec.sampling import SamplingParams, process_logits

V, NEED = 6, 3
_rng = np.random.default_rng(0)
TARGET = _rng.normal(0, 1.5, size=(V, V, V)).astype(np.float32)           # logits[ctx[-2], ctx[-1]]
DRAFT = (TARGET + _rng.normal(0, 1.0, size=TARGET.shape)).astype(np.float32)
# A reduced draft vocabulary (EAGLE-3's d2t): the drafter never proposes tokens 1 and 4.
DRAFT_REDUCED = np.where(np.isin(np.arange(V), [0, 2, 3, 5]), DRAFT, -np.inf).astype(np.float32)
PROMPT = (1, 2)


_process = jax.jit(process_logits)
_outcomes = jax.jit(chain_outcomes)


def _dist(table, ctxs, params):
  """Processed distributions [len(ctxs), V] at each context (one jitted call)."""
  logits = jnp.asarray(np.stack([table[c[-2], c[-1]] for c in ctxs]))
  rows = SamplingParams(*(jnp.broadcast_to(x, (len(ctxs),)) for x in
                          (params.temperature, params.top_k, params.top_p)))
  return np.exp(np.asarray(_process(logits, rows), np.float64))


def target_joint(params):
  seqs = list(itertools.product(range(V), repeat=NEED))
  ctxs = [PROMPT + s[:i] for s in seqs for i in range(NEED)]
  p = _dist(TARGET, ctxs, params).reshape(len(seqs), NEED, V)
  return {s: float(np.prod([p[n, i, t] for i, t in enumerate(s)])) for n, s in enumerate(seqs)}


def spec_joint(params, d, mode, limit=None):
  """Distribution of the first NEED emitted tokens under speculative decoding. mode: "sampled" or
  "deterministic", with "-reduced" for a drafter restricted to a draft vocabulary."""
  table = DRAFT_REDUCED if mode.endswith("-reduced") else DRAFT
  mode = mode.removesuffix("-reduced")

  @functools.lru_cache(maxsize=None)
  def from_ctx(ctx, need):
    # Enumerate draft sequences with their probability under the drafter.
    drafts = [((), 1.0)]
    for _ in range(d):
      nxt = []
      ctxs = [ctx + s for s, _ in drafts]
      q = _dist(table, ctxs, params)
      for (s, w), qrow in zip(drafts, q):
        if mode == "sampled":   # all V branches (zero-weight ones too: fixed shapes, few compiles)
          nxt += [(s + (x,), w * qrow[x]) for x in range(V)]
        else:   # deterministic: the draft's argmax
          nxt.append((s + (int(np.argmax(table[(ctx + s)[-2], (ctx + s)[-1]])),), w))
      drafts = nxt
    seqs = [s for s, _ in drafts]
    p = _dist(TARGET, [ctx + s[:i] for s in seqs for i in range(d + 1)], params)
    p = p.reshape(len(seqs), d + 1, V)
    q = None
    if mode == "sampled":
      q = _dist(table, [ctx + s[:i] for s in seqs for i in range(d)], params)
      q = jnp.asarray(q.reshape(len(seqs), d, V), jnp.float32)
    draft_len = None if limit is None else jnp.full((len(seqs),), limit, jnp.int32)
    accept, final = _outcomes(jnp.asarray(p, jnp.float32), jnp.asarray(seqs, jnp.int32), q,
                              draft_len)
    accept, final = np.asarray(accept, np.float64), np.asarray(final, np.float64)
    out = {}
    for (s, w), a, f in zip(drafts, accept, final):
      if w == 0:
        continue
      reach = w
      for k in range(d + 1):            # exactly k drafts accepted, then the final token
        stop = 1.0 - a[k] if k < d else 1.0
        for x in range(V):
          pr = reach * stop * f[k, x]
          if pr == 0:
            continue
          emitted = s[:k] + (x,)
          if len(emitted) >= need:
            key = emitted[:need]
            out[key] = out.get(key, 0.0) + pr
          else:
            for rest, pr2 in from_ctx(ctx + emitted, need - len(emitted)).items():
              out[emitted + rest] = out.get(emitted + rest, 0.0) + pr * pr2
        if k < d:
          reach *= a[k]
    return out

  return from_ctx(PROMPT, NEED)


PARAMS = {
    "greedy": (0.0, 0, 1.0),
    "T=1": (1.0, 0, 1.0),
    "T=0.7,top-k=3": (0.7, 3, 1.0),
    "T=1.2,top-p=0.7": (1.2, 0, 0.7),
    "top-k=4,top-p=0.8": (1.0, 4, 0.8),
}


@pytest.mark.parametrize("name", list(PARAMS))
@pytest.mark.parametrize("d, mode, limit", [(1, "sampled", None), (3, "sampled", None),
                                             (2, "deterministic", None),
                                             (3, "deterministic", 1),
                                             (2, "sampled-reduced", None),
                                             (2, "deterministic-reduced", None)])
def test_first_three_tokens_are_distributed_as_the_target(name, d, mode, limit):
  t, k, p = PARAMS[name]
  params = SamplingParams(jnp.float32(t), jnp.int32(k), jnp.float32(p))
  want = target_joint(params)
  got = spec_joint(params, d, mode, limit)
  assert abs(sum(got.values()) - 1.0) < 1e-6
  for seq, prob in want.items():
    assert abs(got.get(seq, 0.0) - prob) < 1e-6, (seq, got.get(seq, 0.0), prob)


def test_verifying_a_sampled_draft_as_one_hot_loses_acceptance():
  """Design note made concrete: treating a sampled draft as one-hot stays lossless but accepts
  with p(d) instead of min(1, p(d)/q(d))."""
  p = jnp.asarray([[[0.5, 0.5], [0.5, 0.5]]])
  q = jnp.asarray([[[0.5, 0.5]]])
  a_recorded, _ = chain_outcomes(p, jnp.asarray([[0]]), q)
  a_onehot, _ = chain_outcomes(p, jnp.asarray([[0]]), None)
  assert float(a_recorded[0, 0]) == 1.0 and float(a_onehot[0, 0]) == 0.5


def test_greedy_fast_path_equals_general_verification():
  """`verify` takes `verify_chain_greedy` for all-greedy batches; it must equal `verify_chain`."""
  from jspec.rejection import verify_chain, verify_chain_greedy
  rng = np.random.default_rng(3)
  b, d, v = 64, 4, 7
  logits = jnp.asarray(rng.normal(size=(b, d + 1, v)), jnp.float32)
  target = np.asarray(jnp.argmax(logits, -1))
  draft = np.where(rng.random((b, d)) < 0.7, target[:, :d], rng.integers(0, v, (b, d)))
  draft_len = jnp.asarray(rng.integers(0, d + 1, b), jnp.int32)
  params = SamplingParams.make(b)
  p = jnp.exp(process_logits(logits, params))
  keys = jax.random.split(jax.random.key(0), b)
  for q in (None, jax.nn.one_hot(jnp.asarray(draft), v)):
    n1, t1 = verify_chain(keys, p, jnp.asarray(draft, jnp.int32), q, draft_len)
    n2, t2 = verify_chain_greedy(logits, jnp.asarray(draft, jnp.int32), draft_len)
    np.testing.assert_array_equal(np.asarray(n1), np.asarray(n2))
    for r in range(b):
      k = int(n1[r])
      assert np.asarray(t1[r, :k + 1]).tolist() == np.asarray(t2[r, :k + 1]).tolist()
  assert 0 < int(n2.sum()) < b * d        # both acceptance and rejection occurred
