"""Monte-Carlo losslessness through the real jitted round (SpecDecoder -> spec_prefill ->
spec_generate) on a tiny random target with vocabulary 8, with per-row mixed sampling parameters.

The joint distribution of the first two generated tokens (64 cells) is compared with the target's,
computed by one-shot forwards of the target itself. Each drafter runs 80,000 rows (3 sampled
parameter groups of 25,000, and 5,000 greedy rows that must all take the argmax path). A chi-square test per sampled group at p < 1e-4 (62 tests in this file) gives a
false-alarm rate near 3e-3 per run; the seeds are fixed, so a run is also reproducible.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from jspec import SpecDecoder
from jspec.drafters.eagle3 import Eagle3Config, Eagle3Head
from jspec.sampling import SamplingParams, process_logits
from models import KVCache, Llama, LlamaConfig

CFG = LlamaConfig.tiny(vocab_size=8, num_layers=2)
PROMPT = [3, 1, 4, 1, 5]
GROUPS = [(1.0, 0, 1.0), (0.8, 3, 1.0), (1.3, 0, 0.75), (0.0, 0, 1.0)]   # (T, top_k, top_p)
PER_GROUP, CHUNK = 25_000, 20_000
SIZES = (PER_GROUP, PER_GROUP, PER_GROUP, 5_000)   # the greedy group is checked row by row
OFFSETS = np.concatenate([[0], np.cumsum(SIZES)])


@pytest.fixture(scope="module")
def target():
  model = Llama(CFG, rngs=nnx.Rngs(0))
  # Random init gives near-uniform logits; scale the head so distributions have structure.
  model.embed.embedding[...] = model.embed.embedding[...] * 6.0
  return model


@pytest.fixture(scope="module")
def moe_target():
  """The same tiny target with mixture-of-experts feed-forwards (4 experts, top-2, renormalised)."""
  cfg = dataclasses.replace(CFG, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
  model = Llama(cfg, rngs=nnx.Rngs(0))
  model.embed.embedding[...] = model.embed.embedding[...] * 6.0
  for layer in model.layers:   # a router with structure: tokens spread over different experts
    layer.mlp.router[...] = layer.mlp.router[...] * 50.0
  return model


@pytest.fixture(scope="module")
def bf16_cache_target(target):
  """The same target keeping its KV cache in bfloat16 (a different, equally exact target)."""
  model = nnx.clone(target)
  model.cache_dtype = jnp.dtype(jnp.bfloat16)
  return model


@pytest.fixture(scope="module")
def draft():
  model = Llama(CFG, rngs=nnx.Rngs(1))
  model.embed.embedding[...] = model.embed.embedding[...] * 6.0
  return model


def exact_joint(model, t, k, p):
  params = SamplingParams.make(1, t, k, p)
  seqs = np.array([PROMPT + [a] for a in range(8)])
  logits = model(jnp.asarray(seqs), model.init_cache(8, 8)).logits       # [8, 6, V]
  p1 = np.exp(np.asarray(process_logits(logits[:1, -2], params), np.float64))[0]
  p2 = np.exp(np.asarray(process_logits(logits[:, -1], SamplingParams.make(8, t, k, p)),
                         np.float64))
  return p1[:, None] * p2                                                   # [8, 8]


def sample_pairs(decoder, before_chunk=None, **extra):
  n = int(OFFSETS[-1])
  t, k, p = (np.repeat([g[i] for g in GROUPS], SIZES) for i in range(3))
  out, results = [], []
  for start in range(0, n, CHUNK):
    if before_chunk is not None:
      before_chunk(start // CHUNK)
    sl = slice(start, start + CHUNK)
    res = decoder.generate([PROMPT] * CHUNK, max_new_tokens=2, temperature=t[sl], top_k=k[sl],
                           top_p=p[sl], seed=list(range(start, start + CHUNK)), eos=False,
                           **extra)
    out += res.token_ids
    results.append(res)
  return np.asarray(out), results


@pytest.fixture(scope="module")
def eagle3_head():
  """A random tiny EAGLE-3 head with a reduced draft vocabulary (tokens 1 and 6 never proposed)."""
  cfg = Eagle3Config.for_target(CFG, draft_vocab_size=6, taps=(0, 1, 1))
  head = Eagle3Head(cfg, rngs=nnx.Rngs(2))
  head.lm_head.kernel[...] = head.lm_head.kernel[...] * 6.0
  head.draft_to_target[...] = jnp.asarray([0, 2, 3, 4, 5, 7], jnp.int32)
  return head


@pytest.fixture(scope="module")
def eagle3_shared_head(target):
  """A tiny EAGLE-3 head drafting with the target's own LM-head rows (lm_head="target")."""
  from jspec.train.eagle3 import init_head
  head = init_head(target, np.asarray([0, 2, 3, 4, 5, 7]), taps=(0, 1, 1), seed=2,
                   lm_head="target")
  head.norm.scale[...] = head.norm.scale[...] * 4.0        # peaked drafts
  return head


@pytest.fixture(scope="module")
def medusa_head(target):
  """Random tiny Medusa heads (2 heads, a reduced draft vocabulary: tokens 1 and 6 never
  proposed)."""
  from jspec.train.medusa import init_head
  head = init_head(target, np.asarray([0, 2, 3, 4, 5, 7]), num_heads=2)
  rng = np.random.default_rng(3)
  for var in (head.res_kernel, head.res_bias, head.lm_head):
    var[...] = jnp.asarray(rng.normal(0, 1.0, var[...].shape), jnp.float32)
  return head


@pytest.fixture(scope="module")
def medusa_shared_head(target):
  """Random tiny Medusa ResBlocks over the target's own LM-head rows (lm_head="target")."""
  from jspec.train.medusa import init_head
  head = init_head(target, np.asarray([0, 2, 3, 4, 5, 7]), num_heads=2, lm_head="target")
  rng = np.random.default_rng(5)
  for var in (head.res_kernel, head.res_bias):
    var[...] = jnp.asarray(rng.normal(0, 1.0, var[...].shape), jnp.float32)
  return head


@pytest.fixture(scope="module")
def mtp_module():
  """A random tiny MTP module (drafts through the target's own head, recursively for D = 2)."""
  from jspec.drafters.mtp import MTPConfig, MTPModule
  return MTPModule(MTPConfig.for_target(CFG), rngs=nnx.Rngs(4))


@pytest.fixture(scope="module")
def block_modules(target):
  """Random tiny DFlash and DSpark modules (blocks of 3 and 2; DSpark with a random Markov bias and
  random confidences, so that the scheduler cuts rows at different prefixes)."""
  from jspec.train.dflash import init_module
  ids = np.asarray([0, 2, 3, 4, 5, 7])
  dfl = init_module(target, ids, "dflash", block_size=3, mask_token_id=1, seed=5)
  dsp = init_module(target, ids, "dspark", block_size=2, mask_token_id=1, markov_rank=4, seed=6)
  rng = np.random.default_rng(7)
  for var in (dsp.markov_proj.kernel, dsp.confidence_head.kernel):
    var[...] = jnp.asarray(rng.normal(0, 2.0, var[...].shape), jnp.float32)
  return {"dflash": dfl, "dspark": dsp}


@pytest.mark.parametrize("method", ["draft_model", "ngram", "layer_skip", "eagle3",
                                    "eagle3-shared", "suffix",
                                    "lookahead", "prediction", "draft_model-auto",
                                    "draft_model-moe", "draft_model-auto-bf16cache",
                                    "eagle3-tree", "medusa", "medusa-tree",
                                    "medusa-shared", "mtp",
                                    "dflash", "dspark-schedule", "hybrid", "hybrid-tree",
                                    "hybrid-auto", "ngram-auto-rows"])
def test_first_two_tokens_match_target_distribution(target, moe_target, bf16_cache_target,
                                                     draft, eagle3_head,
                                                     eagle3_shared_head, medusa_head,
                                                     medusa_shared_head, mtp_module,
                                                     block_modules, method):
  cfg = {"method": method, "num_speculative_tokens": 2}
  drafts = {"draft_model": draft, "eagle3": eagle3_head, "medusa": medusa_head,
            "mtp": mtp_module, "hybrid": eagle3_head, **block_modules}
  if method == "eagle3-shared":  # drafting with the target's LM-head rows
    method = cfg["method"] = "eagle3"
    drafts["eagle3"] = eagle3_shared_head
  if method == "medusa-shared":  # Medusa ResBlocks over the target's LM-head rows
    method = cfg["method"] = "medusa"
    drafts["medusa"] = medusa_shared_head
  if method.endswith("-bf16cache"):   # a target whose KV cache is bf16 (written and unwritten
    method = cfg["method"] = method.removesuffix("-bf16cache")   # blocks: the adaptive round)
    target = bf16_cache_target
  if method.endswith("-moe"):    # an MoE target verified against a dense draft model
    method = cfg["method"] = method.removesuffix("-moe")
    target = moe_target
  if method == "eagle3-tree":    # EAGLE-2 trees: 4 nodes, top-2 children, depth 2
    method = cfg["method"] = "eagle3"
    cfg.update(num_speculative_tokens=4, tree_top_k=2, tree_depth=2)
  if method == "medusa-tree":    # a static tree of 4 nodes over 2 heads
    method = cfg["method"] = "medusa"
    cfg.update(num_speculative_tokens=4, tree_choices=[[0], [1], [0, 0], [1, 0]])
  if method == "dspark-schedule":   # sampled Markov drafts, prefixes cut by the confidences
    method = cfg["method"] = "dspark"
    cfg["confidence_schedule"] = True
  if method.endswith("-rows"):
    # per-row widths: a row whose first token occurs in the prompt has n-gram drafts, the others
    # none, so a round's drafts go to the former and rows verify 0, 1 or 2 in one batch
    method = cfg["method"] = method.removesuffix("-rows")
    cfg.update(per_row=True, prompt_lookup_min=1)
  if method.endswith("-auto"):   # adaptive over draft lengths {0, 1, 2}
    method = cfg["method"] = method.removesuffix("-auto")
    cfg.update(num_speculative_tokens="auto", draft_lengths=[0, 1, 2])
  if method == "layer_skip":
    cfg["num_layers"] = 1
  if method == "hybrid-tree":   # EAGLE-2 trees (4 nodes), or the n-gram's chain as a tree
    method = cfg["method"] = "hybrid"
    cfg.update(num_speculative_tokens=4, tree_top_k=2, tree_depth=2)
  if method == "hybrid":     # sampled EAGLE-3 drafts, or the n-gram's where the last token repeats
    cfg["prompt_lookup_min"] = 1
  if method == "suffix":     # a small global cache, refilled between chunks from their outputs
    cfg.update(cache_tokens=16, max_tree_depth=4)
  if method == "lookahead":  # 20,000 rows: a small pool
    cfg.update(pool_size=16)
  costs = None
  if cfg.get("confidence_schedule"):
    # one round of 20,000 rows: a width-2 round is too dear, so the scheduler cuts each row at
    # 0 or 1 by comparing its survival with the best second-position survival of the batch
    from jspec.costs import CostTable
    costs = CostTable({1: {1: 1.0, 2: 1.0, 3: 1.0}}, round={1: {0: 1.0, 1: 1.00001, 2: 10.0}})
  # time_rounds=False: the chunks' cost tables below force the lengths
  decoder = SpecDecoder(target, cfg, draft_model=drafts.get(method), cost_table=costs,
                        time_rounds=False)
  before_chunk = None
  if cfg["num_speculative_tokens"] == "auto":
    # one round per row, its last token (any length finishes the row: the cheapest round wins):
    # verify costs that make successive chunks verify 2, 1 and 0 drafts (a plain round: 3 steps)
    from jspec.costs import CostTable
    tables = [{1: 1.0, 2: 5.0, 3: 1.0}, {1: 1.0, 2: 1.0, 3: 10.0}, {1: 1.0, 2: 5.0, 3: 10.0}]
    inner = decoder.drafter_params.inner

    def before_chunk(i):
      decoder.drafter_params = decoder.drafter.make_params(inner, CostTable({1: tables[i % 3]}))
  # predictions: a few per row, cycling (rows whose first token differs re-synchronise or fall back)
  extra = dict(prediction=[[(3 + i) % 8, (5 * i) % 8, 1] for i in range(CHUNK)]) \
      if method == "prediction" else {}
  pairs, results = sample_pairs(decoder, before_chunk, **extra)
  assert pairs.shape == (int(OFFSETS[-1]), 2)
  assert results[-1].rounds > 0
  if before_chunk is not None:
    assert [max(r.verified_lengths, key=r.verified_lengths.get) for r in results] == [2, 1, 0, 2]
  if cfg.get("per_row"):   # rounds of one draft per row on average verified second drafts
    assert results[1].offered_at[1] > 0
  if cfg.get("confidence_schedule"):     # sampled rows were cut at both 0 and 1
    assert all(0.1 < r.drafted / CHUNK < 0.9 for r in results), [r.drafted for r in results]
  for g, (t, k, p) in enumerate(GROUPS):
    want = exact_joint(target, t, k, p).ravel()
    got = pairs[OFFSETS[g]:OFFSETS[g + 1]]
    counts = np.bincount(got[:, 0] * 8 + got[:, 1], minlength=64)
    assert counts[want == 0].sum() == 0, f"group {g}: tokens outside the top-k/top-p set"
    if t == 0:
      assert counts[np.argmax(want)] == SIZES[g]    # greedy rows: always the argmax path
      continue
    keep = want > 0
    _, pvalue = stats.chisquare(counts[keep], SIZES[g] * want[keep] / want[keep].sum())
    assert pvalue > 1e-4, f"{method} group {g} (T={t}, top_k={k}, top_p={p}): p={pvalue:.2e}"


@pytest.mark.parametrize("t, k, p", [GROUPS[0], GROUPS[2]])
def test_plain_rounds_sample_the_target(target, t, k, p):
  """A plain round of the adaptive round (length 0) decodes several target steps in one round:
  the joint of generated tokens 2 and 3 (both from one plain round, after the prefill's token 1)
  against the target's, marginalised over token 1 exactly."""
  from jspec.costs import CostTable
  decoder = SpecDecoder(target, {"method": "ngram", "num_speculative_tokens": 3,
                                 "draft_lengths": [0, 3]},
                        cost_table=CostTable({1: {1: 1.0}}, round={1: {0: 0.01, 3: 100.0}}),
                        time_rounds=False)
  res = decoder.generate([PROMPT] * CHUNK, max_new_tokens=3, temperature=t, top_k=k, top_p=p,
                         seed=list(range(CHUNK)), eos=False)
  assert res.verified_lengths == {0: 1, 3: 0} and res.steps == 1   # one plain round per row
  got = np.asarray(res.token_ids)
  params = SamplingParams.make(64, t, k, p)
  seqs = np.array([PROMPT + [a, b] for a in range(8) for b in range(8)])
  logits = target(jnp.asarray(seqs), KVCache.init(CFG, 64, 8)).logits       # [64, 7, V]
  probs = lambda i: np.exp(np.asarray(process_logits(logits[:, i], params), np.float64))
  p1, p2, p3 = probs(-3)[0], probs(-2)[::8], probs(-1).reshape(8, 8, 8)      # [8], [8, 8], [8, 8, 8]
  want = np.einsum("a,ab,abc->bc", p1, p2, p3).ravel()
  counts = np.bincount(got[:, 1] * 8 + got[:, 2], minlength=64)
  assert counts[want == 0].sum() == 0
  keep = want > 0
  _, pvalue = stats.chisquare(counts[keep], CHUNK * want[keep] / want[keep].sum())
  assert pvalue > 1e-4, f"T={t}, top_k={k}, top_p={p}: p={pvalue:.2e}"
