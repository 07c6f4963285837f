"""Exact-enumeration losslessness: for a toy target/draft pair (V = 6, D <= 3) the exact distribution
of the first 3 emitted tokens equals the target's, to 1e-6.

Every draft sequence is enumerated with its probability under q, the acceptance probabilities and
final-token distributions come from `jspec.rejection.chain_outcomes` (the deterministic half of
`verify_chain`; its random half is checked by the Monte-Carlo test through the real round), p and
q come from `jspec.sampling.process_logits`, and rounds chain until 3 tokens are out. The
model-free drafters (suffix, lookahead, prediction, and docs/examples' bigram drafter) are
enumerated through their own `propose`: deterministic drafts (q = None) of per-context length.
"""

import dataclasses
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
# Block drafters (DFlash / DSpark, D <= 3): slot k's logits depend on the round's context only
# (parallel), DSpark adds a Markov bias on the token before the slot; its confidences give the
# survival the scheduler (jspec.confidence.prefix_lengths) cuts each draft at.
BLOCK = _rng.normal(0, 1.5, size=(V, 3, V)).astype(np.float32)            # [ctx[-1], slot, V]
MARKOV = _rng.normal(0, 1.0, size=(V, V)).astype(np.float32)              # [previous token, V]
CONF = _rng.uniform(0.2, 0.95, size=(V, 3, V)).astype(np.float32)         # [ctx[-1], slot, prev]
WIDTHS, WIDTH_COST = (0, 1, 2, 3), np.asarray([1.0, 1.5, 1.8, 2.0], np.float32)


_process = jax.jit(process_logits)
_outcomes = jax.jit(chain_outcomes)

# Model-free drafters' fixed inputs: what each knows besides the context (a global cache of
# earlier outputs, a background text seeding the n-gram pool, a prediction).
_BACKGROUND = (1, 2, 3, 1, 2, 0, 5, 0, 1, 2, 3, 3, 0, 5, 2, 4)   # no n-gram starts with 4
_CACHED = [[1, 2, 3, 4, 5, 0, 2], [2, 3, 4, 1, 2, 3, 0]]
_PREDICTION = (0, 2, 5, 1, 3, 3, 4, 2)
_SLOTS = 8                                       # context buffer of the drafters' propose


@functools.lru_cache(maxsize=None)
def _model_free_drafter(name, d):
  from jspec.drafters.base import Context
  from jspec.drafters.model_free.lookahead import LookaheadDrafter
  from jspec.drafters.model_free.prediction import Prediction, PredictionDrafter
  from jspec.drafters.model_free.suffix import SuffixCache, SuffixDrafter, pack_cache

  def context(tokens, length):
    return Context(tokens=tokens, length=length, prompt_len=length,
                   sampling=SamplingParams.make(1))

  if name == "bigram":                           # docs/examples/bigram_drafter.py
    from bigram_drafter import BigramDrafter
    drafter = BigramDrafter(d, V)

    def fn(tokens, length):
      state = drafter.init_state(None, tokens, context(tokens, length), 32)
      return drafter.propose(None, state, context(tokens, length), None)[0]
  elif name in ("ngram", "hybrid"):   # n-gram lookup; the hybrid: it, else a table's argmax chain
    from jspec.drafters.hybrid import HybridDrafter
    from jspec.drafters.model_free.ngram import NgramDrafter
    drafter = NgramDrafter(d, 1, 4)
    if name == "hybrid":
      drafter = HybridDrafter(drafter, TableDrafter(d))
    params = {"copy": None, "learned": None} if name == "hybrid" else None

    def fn(tokens, length):
      state = drafter.init_state(params, tokens, context(tokens, length), 32)
      return drafter.propose(params, state, context(tokens, length), None)[0]
  elif name == "suffix":
    drafter = SuffixDrafter(d, max_depth=4, cache_tokens=32)
    params = SuffixCache(jnp.asarray(pack_cache(_CACHED, 32)))
    fn = lambda tokens, length: drafter.propose(params, (), context(tokens, length), None)[0]
  elif name == "lookahead":
    drafter = LookaheadDrafter(d, window=2, ngram=d + 1, pool_size=16, candidates=4)

    def fn(tokens, length):
      bg = jnp.asarray([_BACKGROUND], jnp.int32)
      state = drafter.init_state(None, bg, context(bg, jnp.asarray([len(_BACKGROUND)])), 32)
      return drafter.propose(None, state, context(tokens, length), None)[0]
  else:
    drafter = PredictionDrafter(d, 1, 3)

    def fn(tokens, length):
      pred = Prediction(jnp.asarray([_PREDICTION], jnp.int32),
                        jnp.asarray([len(_PREDICTION)], jnp.int32))
      state = drafter.init_state(None, tokens, dataclasses.replace(context(tokens, length),
                                                                    request=pred), 32)
      state = dataclasses.replace(state, pos=jnp.full((1,), -1, jnp.int32))   # resync from ctx
      return drafter.propose(None, state, context(tokens, length), None)[0]
  return jax.jit(fn)


@dataclasses.dataclass(frozen=True)
class TableDrafter:
  """The hybrid's learned side in the enumeration: DRAFT's argmax chain (deterministic, q None)."""
  num_draft: int
  target_taps: tuple = ()
  tree = False
  num_extra = 0
  confidence_schedule = False
  variable_length = False

  def init_state(self, params, prompt, ctx, max_len):
    return ()

  def commit(self, params, state, ctx):
    return state

  def propose(self, params, state, ctx, key):
    from jspec.drafters.base import Draft
    table = jnp.asarray(DRAFT)
    rows = jnp.arange(ctx.tokens.shape[0])
    a, b = ctx.tokens[rows, ctx.length - 2], ctx.tokens[rows, ctx.length - 1]
    out = []
    for _ in range(self.num_draft):
      a, b = b, jnp.argmax(table[a, b], axis=-1).astype(jnp.int32)
      out.append(b)
    return Draft(tokens=jnp.stack(out, axis=1)), state


@functools.lru_cache(maxsize=None)
def model_free_draft(name, ctx, d):
  """The drafter's deterministic draft at context ctx: (tokens of length d, valid length)."""
  tokens = jnp.asarray([list(ctx) + [0] * (_SLOTS - len(ctx))], jnp.int32)
  draft = _model_free_drafter(name, d)(tokens, jnp.asarray([len(ctx)], jnp.int32))
  assert draft.q is None
  return tuple(np.asarray(draft.tokens[0]).tolist()), int(draft.length[0])


def _dist(table, ctxs, params, logits=None):
  """Processed distributions [len(ctxs), V] at each context (one jitted call); or of the given
  logits rows."""
  logits = jnp.asarray(np.stack([table[c[-2], c[-1]] for c in ctxs]) if logits is None
                       else np.stack(logits))
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
  "deterministic", with "-reduced" for a drafter restricted to a draft vocabulary,
  "drafter:<name>" for a model-free drafter's own drafts, "block" (DFlash: argmax of each slot's
  context-only logits), "markov" (DSpark: sampled left to right from slot logits + a Markov bias,
  q recorded) or "markov-scheduled" (each draft cut at the prefix the confidence scheduler picks)."""
  table = DRAFT_REDUCED if mode.endswith("-reduced") else DRAFT
  mode = mode.removesuffix("-reduced")

  @functools.lru_cache(maxsize=None)
  def from_ctx(ctx, need):
    # Enumerate draft sequences with their probability under the drafter.
    drafts = [((), 1.0)]
    lengths = None
    if mode.startswith("drafter:"):
      tokens, n = model_free_draft(mode.split(":")[1], ctx, d)
      drafts, lengths = [(tokens, 1.0)], jnp.asarray([n], jnp.int32)
    copied = False
    if mode == "hybrid-sampled":   # the hybrid over a sampled learned drafter: copy, else sample
      tokens, n = model_free_draft("ngram", ctx, d)
      if n > 0:
        drafts, lengths, copied = [(tokens, 1.0)], jnp.asarray([n], jnp.int32), True
    markov = mode.startswith("markov")
    slot_logits = lambda s: BLOCK[ctx[-1], len(s)] + MARKOV[(ctx + s)[-1]]
    for _ in range(d if lengths is None else 0):
      nxt = []
      ctxs = [ctx + s for s, _ in drafts]
      q = _dist(table, ctxs, params, [slot_logits(s) for s, _ in drafts] if markov else None)
      for (s, w), qrow in zip(drafts, q):
        if mode in ("sampled", "hybrid-sampled") or markov:   # all V branches (zero-weight
          # ones too: fixed shapes)
          nxt += [(s + (x,), w * qrow[x]) for x in range(V)]
        elif mode == "block":   # DFlash: each slot's argmax, whatever the drafts before it
          nxt.append((s + (int(np.argmax(BLOCK[ctx[-1], len(s)])),), w))
        else:   # deterministic: the draft's argmax
          nxt.append((s + (int(np.argmax(table[(ctx + s)[-2], (ctx + s)[-1]])),), w))
      drafts = nxt
    if mode in ("markov-scheduled", "markov-anticipating"):
      a = np.cumprod([[CONF[ctx[-1], k, s[k - 1] if k else ctx[-1]] for k in range(d)]
                      for s, _ in drafts], axis=1)
      if mode == "markov-scheduled":
        lengths = jnp.concatenate([_schedule(jnp.asarray(a[i:i + 1], jnp.float32), d)
                                   for i in range(len(drafts))])
      else:   # negative control: the best width in hindsight reads survivals past the cut
        gain = (1 + np.concatenate([np.zeros((len(a), 1)), np.cumsum(a, 1)], 1)[:, :d + 1]
                ) / WIDTH_COST[:d + 1]
        lengths = jnp.asarray(np.argmax(gain, 1), jnp.int32)
    seqs = [s for s, _ in drafts]
    p = _dist(TARGET, [ctx + s[:i] for s in seqs for i in range(d + 1)], params)
    p = p.reshape(len(seqs), d + 1, V)
    q = None
    if (mode in ("sampled", "hybrid-sampled") and not copied) or markov:
      q = _dist(table, [ctx + s[:i] for s in seqs for i in range(d)], params,
                [slot_logits(s[:i]) for s in seqs for i in range(d)] if markov else None)
      q = jnp.asarray(q.reshape(len(seqs), d, V), jnp.float32)
    draft_len = None if limit is None else jnp.full((len(seqs),), limit, jnp.int32)
    draft_len = lengths if lengths is not None else draft_len
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


@functools.partial(jax.jit, static_argnums=1)
def _schedule(a, d):
  from jspec.confidence import prefix_lengths
  widths = tuple(w for w in WIDTHS if w <= d)
  return prefix_lengths(a, widths, jnp.asarray(WIDTH_COST[:len(widths)]))


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
                                             (2, "deterministic-reduced", None),
                                             (3, "drafter:suffix", None),
                                             (3, "drafter:lookahead", None),
                                             (3, "drafter:prediction", None),
                                             (3, "drafter:bigram", None),
                                             (3, "drafter:hybrid", None),
                                             (3, "hybrid-sampled", None),
                                             (3, "block", None), (3, "markov", None),
                                             (3, "markov-scheduled", None)])
def test_first_three_tokens_are_distributed_as_the_target(name, d, mode, limit):
  t, k, p = PARAMS[name]
  params = SamplingParams(jnp.float32(t), jnp.int32(k), jnp.float32(p))
  want = target_joint(params)
  got = spec_joint(params, d, mode, limit)
  assert abs(sum(got.values()) - 1.0) < 1e-6
  for seq, prob in want.items():
    assert abs(got.get(seq, 0.0) - prob) < 1e-6, (seq, got.get(seq, 0.0), prob)


def test_a_scheduler_that_reads_past_the_cut_is_not_lossless():
  """Negative control for the confidence scheduler: cutting each draft at the best prefix in
  hindsight (which reads survivals of drafts past the cut) changes the output distribution."""
  params = SamplingParams(jnp.float32(1.0), jnp.int32(0), jnp.float32(1.0))
  want = target_joint(params)
  got = spec_joint(params, 3, "markov-anticipating")
  assert max(abs(got.get(s, 0.0) - p) for s, p in want.items()) > 1e-3


@pytest.mark.parametrize("name", ["suffix", "lookahead", "prediction", "bigram"])
def test_model_free_drafters_propose_in_the_enumeration(name):
  """The enumerated contexts do exercise the drafters: most get a draft (the bigram walk: a third,
  where the last token occurred before), of varied lengths."""
  ctxs = [PROMPT + s for n in range(NEED) for s in itertools.product(range(V), repeat=n)]
  lengths = [model_free_draft(name, c, 3)[1] for c in ctxs]
  share = 3 if name == "bigram" else 2
  assert sum(n > 0 for n in lengths) > len(ctxs) // share and len(set(lengths)) >= 2, lengths


def test_the_hybrid_mixes_both_drafters_in_the_enumeration():
  """In the enumerated contexts the hybrid copies (the n-gram's draft) in some and drafts DRAFT's
  argmax chain (all 3 tokens) in the others."""
  ctxs = [PROMPT + s for n in range(NEED) for s in itertools.product(range(V), repeat=n)]
  copied = learned = 0
  for c in ctxs:
    tokens, n = model_free_draft("hybrid", c, 3)
    copy, m = model_free_draft("ngram", c, 3)
    if m > 0:
      copied += (tokens, n) == (copy, m)
    else:
      learned += n == 3
  assert copied + learned == len(ctxs) and min(copied, learned) > len(ctxs) // 5, (copied, learned)


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


# Adaptive draft length (jspec.adaptive): each round verifies lengths[k] of D_max = 3 drafts, k
# chosen by the real `choose_length` from running estimates that the real `update_estimates` folds
# each enumerated outcome into; a plain round (length 0) decodes ADAPT_PLAIN target steps, the
# first of them observed against the first draft. The cost makes all three lengths occur.
ADAPT_LENGTHS, ADAPT_COST, ADAPT_DECAY, ADAPT_PLAIN = (0, 1, 3), (2.0, 1.2, 1.4), 0.5, 2


def spec_joint_adaptive(params, deterministic):
  from jspec.adaptive import choose_length, update_estimates
  d = ADAPT_LENGTHS[-1]
  choose = jax.jit(lambda est: choose_length(est, jnp.full((1,), d, jnp.int32), jnp.ones((1,), bool),
                                             ADAPT_LENGTHS, jnp.asarray(ADAPT_COST), ADAPT_PLAIN))
  update = jax.jit(lambda est, w, n, emitted, draft: update_estimates(
      est, w, n, emitted, draft, jnp.full(n.shape, d, jnp.int32), jnp.ones(n.shape, bool),
      ADAPT_DECAY))
  used = set()

  @functools.lru_cache(maxsize=None)
  def from_ctx(ctx, need, est):
    w = ADAPT_LENGTHS[int(choose(jnp.asarray([est], jnp.float32)))]
    used.add(w)
    drafts = [((), 1.0)]
    for _ in range(min(w + 1, d)):      # the verified drafts and the one after them (observed)
      q = _dist(DRAFT, [ctx + s for s, _ in drafts], params)
      nxt = []
      for (s, wt), qrow in zip(drafts, q):
        if deterministic:
          nxt.append((s + (int(np.argmax(DRAFT[(ctx + s)[-2], (ctx + s)[-1]])),), wt))
        else:
          nxt += [(s + (x,), wt * qrow[x]) for x in range(V)]
      drafts = [(s, wt) for s, wt in nxt if wt > 0]
    seqs = [s for s, _ in drafts]
    p = _dist(TARGET, [ctx + s[:i] for s in seqs for i in range(w + 1)], params)
    p = jnp.asarray(p.reshape(len(seqs), w + 1, V), jnp.float32)
    q = None
    if not deterministic and w:
      q = _dist(DRAFT, [ctx + s[:i] for s in seqs for i in range(w)], params)
      q = jnp.asarray(q.reshape(len(seqs), w, V), jnp.float32)
    verified = jnp.asarray([s[:w] for s in seqs], jnp.int32).reshape(len(seqs), w)
    accept, final = _outcomes(p, verified, q, None)
    accept, final = np.asarray(accept, np.float64), np.asarray(final, np.float64)
    # every outcome (draft, k accepted, final token x) with its probability
    rows = []
    for (s, wt), a, f in zip(drafts, accept, final):
      reach = wt
      for k in range(w + 1):
        stop = 1.0 - a[k] if k < w else 1.0
        rows += [(s, k, x, reach * stop * f[k, x]) for x in range(V) if reach * stop * f[k, x] > 0]
        if k < w:
          reach *= a[k]
    pad = lambda t, n: list(t) + [0] * (n - len(t))
    new_est = np.asarray(update(
        jnp.full((len(rows), d), jnp.asarray(est, jnp.float32)), jnp.int32(w),
        jnp.asarray([k for _, k, _, _ in rows], jnp.int32),
        jnp.asarray([pad(s[:k] + (x,), d + 1) for s, k, x, _ in rows], jnp.int32),
        jnp.asarray([pad(s, d) for s, _, _, _ in rows], jnp.int32)))
    out = {}
    for (s, k, x, pr), e in zip(rows, new_est):
      for emitted, pr in plain_steps(ctx, (x,), pr) if w == 0 else [(s[:k] + (x,), pr)]:
        add(out, ctx, emitted, pr, need, tuple(float(v) for v in e))
    return out

  def plain_steps(ctx, emitted, pr):
    """The plain round's further target steps after its first token."""
    outs = [(emitted, pr)]
    for _ in range(ADAPT_PLAIN - 1):
      p = _dist(TARGET, [ctx + em for em, _ in outs], params)
      outs = [(em + (y,), w * p[i, y]) for i, (em, w) in enumerate(outs) for y in range(V)
              if w * p[i, y] > 0]
    return outs

  def add(out, ctx, emitted, pr, need, est):
    if len(emitted) >= need:
      out[emitted[:need]] = out.get(emitted[:need], 0.0) + pr
      return
    for rest, pr2 in from_ctx(ctx + emitted, need - len(emitted), est).items():
      out[emitted + rest] = out.get(emitted + rest, 0.0) + pr * pr2

  return from_ctx(PROMPT, NEED, (0.5,) * d), used


@pytest.mark.parametrize("name", list(PARAMS))
@pytest.mark.parametrize("deterministic", [False, True])
def test_adaptive_draft_length_is_lossless(name, deterministic):
  t, k, p = PARAMS[name]
  params = SamplingParams(jnp.float32(t), jnp.int32(k), jnp.float32(p))
  want = target_joint(params)
  got, used = spec_joint_adaptive(params, deterministic)
  assert abs(sum(got.values()) - 1.0) < 1e-6
  for seq, prob in want.items():
    assert abs(got.get(seq, 0.0) - prob) < 1e-6, (seq, got.get(seq, 0.0), prob)
  if name != "greedy":
    assert used == set(ADAPT_LENGTHS), used    # the choice did change along the way
