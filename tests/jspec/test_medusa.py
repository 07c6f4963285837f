"""Medusa drafter on a tiny random target: the heads against a per-head reference, the state at the
right committed position, greedy decoding equal to plain decoding, the export round trip, topk,
and clear errors."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, SpecDecoder, SpeculativeConfig, count_compiles
from jspec.drafters import heads, registry
from jspec.drafters.medusa import checkpoint as medusa_format
from jspec.drafters.base import Context
from jspec.drafters.medusa import MedusaConfig, MedusaDrafter, MedusaHead, MedusaOptions
from jspec.sampling import SamplingParams
from jspec.train.medusa import init_head
from models import KVCache, Llama, LlamaConfig

CFG = LlamaConfig.tiny(vocab_size=64)
IDS = np.arange(2, 62, 2)          # a sorted draft vocabulary of 30 tokens


@pytest.fixture(scope="module")
def target():
  return Llama(CFG, rngs=nnx.Rngs(1))


def _random_head(target, seed=2, num_heads=4, num_layers=2):
  """Non-trivial heads: random ResBlocks and LM heads (init_head starts at identity)."""
  head = init_head(target, IDS, num_heads=num_heads, num_layers=num_layers)
  rng = np.random.default_rng(seed)
  for var in (head.res_kernel, head.res_bias, head.lm_head):
    var[...] = jnp.asarray(rng.normal(0, 0.3, var[...].shape), jnp.float32)
  return head


def _prompts(seed, lengths):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, CFG.vocab_size, n).tolist() for n in lengths]


def test_heads_match_a_per_head_reference(target):
  head = _random_head(target)
  x = jax.random.normal(jax.random.key(0), (3, CFG.hidden_size))
  got = head(x)                                                          # [3, K, Vd]
  w, b, lm = (np.asarray(v[...], np.float64) for v in (head.res_kernel, head.res_bias,
                                                      head.lm_head))
  silu = lambda z: z / (1 + np.exp(-z))
  for k in range(4):
    y = np.asarray(x, np.float64)
    for l in range(2):
      y = y + silu(y @ w[k, l] + b[k, l])
    np.testing.assert_allclose(got[:, k], y @ lm[k], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(head(x, 2), got[:, :2], rtol=1e-6, atol=1e-6)
  # fresh heads: ResBlocks are the identity, LM heads the target's rows of the draft vocabulary
  fresh = init_head(target, IDS)
  want = target.logits(x[:, None])[:, 0][:, IDS]
  for k in range(4):
    np.testing.assert_allclose(fresh(x)[:, k], want, rtol=1e-5, atol=1e-5)


def test_state_is_the_normed_hidden_at_length_minus_2(target):
  head = _random_head(target)
  drafter, params = MedusaDrafter.from_head(head, target, 3, sample=False)
  assert drafter.target_taps == (CFG.num_layers,)
  toks = jnp.asarray(_prompts(3, [24])[0], jnp.int32).reshape(2, 12)
  raw = target(toks, KVCache.init(CFG, 2, 12), taps=(CFG.num_layers,)).hidden   # pre-norm taps
  ref = target.norm(raw[0])                       # reference: the final normed hidden [2, 12, H]
  plen = jnp.asarray([5, 9])
  ctx = Context(tokens=toks, length=plen + 1, prompt_len=plen, sampling=SamplingParams.make(2),
                target_hidden=raw)
  state = drafter.init_state(params, toks, ctx, 32)
  np.testing.assert_allclose(state.hidden, ref[jnp.arange(2), plen - 1], rtol=1e-5, atol=1e-5)
  # commit: the verified block starts at old length - 1; num_new = 0 keeps the old state
  start, num_new = jnp.asarray([3, 6]), jnp.asarray([3, 0])
  block = tuple(jnp.stack([h[r, s:s + 4] for r, s in enumerate([3, 6])]) for h in raw)
  ctx = Context(tokens=toks, length=start + 1 + num_new, prompt_len=plen,
                sampling=SamplingParams.make(2), target_hidden=block, num_new=num_new)
  new = drafter.commit(params, state, ctx)
  np.testing.assert_allclose(new.hidden[0], ref[0, 3 + 3 - 1], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(new.hidden[1], state.hidden[1])
  # propose: head i's argmax, in target ids
  draft, _ = drafter.propose(params, new, ctx, jax.random.split(jax.random.key(0), 2))
  want = IDS[np.argmax(np.asarray(head(new.hidden))[:, :3], -1)]
  np.testing.assert_array_equal(draft.tokens, want)
  assert draft.q is None


def test_topk_is_each_heads_best_in_target_ids(target):
  head = _random_head(target)
  drafter, params = MedusaDrafter.from_head(head, target, 2)
  hidden = jax.random.normal(jax.random.key(4), (3, CFG.hidden_size))
  state = drafter.init_state(params, None, Context(
      tokens=None, length=None, prompt_len=jnp.asarray([1, 1, 1]), sampling=None,
      target_hidden=(hidden[:, None],)), 8)
  ids, logp = drafter.topk(params, state, 5)
  assert ids.shape == logp.shape == (3, 4, 5) and ids.dtype == jnp.int32
  ref = jax.nn.log_softmax(head(state.hidden), -1)                       # [3, K, Vd]
  order = np.argsort(-np.asarray(ref), -1, kind="stable")[..., :5]
  np.testing.assert_array_equal(ids, IDS[order])
  np.testing.assert_allclose(logp, np.take_along_axis(np.asarray(ref), order, -1), rtol=1e-6)
  with pytest.raises(ValueError, match=r"topk k must be in \[1, 30\]"):
    drafter.topk(params, state, 31)


def _assert_same_drafts(target, head, other, *, num_draft, k, seed):
  """Both heads' greedy drafts and top-k candidates over random hidden states are equal."""
  hidden = (jax.random.normal(jax.random.key(seed), (4, 1, CFG.hidden_size)),)
  ctx = Context(tokens=None, length=None, prompt_len=jnp.ones((4,), jnp.int32),
                sampling=SamplingParams.make(4), target_hidden=hidden)
  outs = []
  for h in (head, other):
    drafter, params = MedusaDrafter.from_head(h, target, num_draft, sample=False)
    state = drafter.init_state(params, None, ctx, 8)
    outs.append((drafter.propose(params, state, ctx, None)[0].tokens,
                 drafter.topk(params, state, k)[0]))
  np.testing.assert_array_equal(outs[0][0], outs[1][0])
  np.testing.assert_array_equal(outs[0][1], outs[1][1])


@pytest.fixture
def saved(target, tmp_path):
  head = _random_head(target, num_layers=1)
  folder = str(tmp_path / "head")
  sums = medusa_format.save_medusa(head, folder, verifier="tiny")
  return head, folder, sums


def test_greedy_medusa_equals_plain_decoding(target, saved):
  _, folder, _ = saved
  prompts = _prompts(5, [6, 11, 3])
  plain = Decoder(target).generate(prompts, max_new_tokens=24, eos=False).token_ids
  spec = SpecDecoder(target, {"method": "medusa", "num_speculative_tokens": 4, "head": folder})
  out = spec.generate(prompts, max_new_tokens=24, eos=False)
  assert out.token_ids == plain
  assert out.rounds > 0 and len(out.per_position_acceptance) == 4


def test_export_round_trips_in_bf16(target, saved):
  head, folder, sums = saved
  cfg = json.load(open(os.path.join(folder, "config.json")))
  assert (cfg["medusa_num_heads"], cfg["medusa_num_layers"], cfg["draft_vocab_size"]) == (4, 1, 30)
  assert json.load(open(os.path.join(folder, "checksums.json"))) == sums
  from safetensors.numpy import load_file
  w = load_file(os.path.join(folder, "model.safetensors"))
  assert w["medusa_head.2.0.linear.weight"].shape == (CFG.hidden_size, CFG.hidden_size)
  assert w["medusa_head.2.1.weight"].shape == (30, CFG.hidden_size)       # [Vd, H]
  assert str(w["medusa_head.2.1.weight"].dtype) == "bfloat16"
  np.testing.assert_array_equal(w["d2t"] + np.arange(30), IDS)
  assert w["t2d"].sum() == 30 and w["t2d"][IDS].all()
  loaded = medusa_format.load_medusa(folder, expected_sha256=sums["model.safetensors"])
  assert loaded.config == head.config
  rounded = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16).astype(x.dtype),
                                   nnx.state(head))
  for a, b in zip(jax.tree_util.tree_leaves(rounded), jax.tree_util.tree_leaves(nnx.state(loaded))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # the same drafts (and top-k) as the bf16-rounded heads
  nnx.update(head, rounded)
  _assert_same_drafts(target, head, loaded, num_draft=4, k=3, seed=7)


def _corrupt(folder, how):
  w = os.path.join(folder, "model.safetensors")
  c = os.path.join(folder, "config.json")
  if how == "missing":
    os.remove(w)
  elif how == "checksum":
    data = bytearray(open(w, "rb").read())
    data[-3] ^= 0xFF
    open(w, "wb").write(bytes(data))
  else:
    cfg = json.load(open(c))
    cfg[how] *= 2
    open(c, "w").write(json.dumps(cfg))
    os.remove(os.path.join(folder, "checksums.json"))


@pytest.mark.parametrize("how, message", [
    ("missing", "model.safetensors is missing"),
    ("checksum", "has sha256 .* expected"),
    ("hidden_size", "has shape|hidden size 128 differs from the target's 64"),
    ("vocab_size", "vocabulary 128 differs from the target's 64"),
])
def test_bad_head_fails_before_compiling(target, saved, how, message):
  _, folder, _ = saved
  _corrupt(folder, how)
  with count_compiles() as c:
    with pytest.raises(ValueError, match=message):
      SpecDecoder(target, {"method": "medusa", "num_speculative_tokens": 2, "head": folder})
  assert c.count == 0


def test_head_for_another_target_and_too_many_drafts(target):
  other = MedusaHead(MedusaConfig(hidden_size=32, vocab_size=64, draft_vocab_size=64))
  with pytest.raises(ValueError, match="hidden size 32 differs from the target's 64"):
    SpecDecoder(target, {"method": "medusa", "num_speculative_tokens": 2}, draft_model=other)
  with pytest.raises(ValueError, match=r"num_speculative_tokens=5 exceeds the head's 4 heads"):
    SpecDecoder(target, {"method": "medusa", "num_speculative_tokens": 5},
                draft_model=_random_head(target))
  with pytest.raises(ValueError, match="no Medusa head is shipped for this target"):
    SpecDecoder(target, {"method": "medusa", "num_speculative_tokens": 2})


def test_registered_with_its_cli_flag():
  entry = registry.get("medusa")
  assert entry.options is MedusaOptions
  assert [(f.flag, f.field) for f in entry.cli_flags] == [("--medusa-head", "head"),
                                                          ("--medusa-tree", "tree_choices")]
  cfg = SpeculativeConfig.from_dict({"method": "medusa", "num_speculative_tokens": 3,
                                     "head": "/x", "draft_sampling": False})
  assert cfg.options == MedusaOptions(head="/x", draft_sampling=False)
  shipped = heads.shipped("medusa", LlamaConfig.smollm2_135m())
  assert shipped is not None and os.path.basename(shipped[0]) == "smollm2-135m-instruct-medusa"


CHOICES = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 2)]


def test_static_tree_drafts_and_greedy_identity(target):
  head = _random_head(target)
  sd = SpecDecoder(target, {"method": "medusa", "num_speculative_tokens": len(CHOICES),
                            "tree_choices": [list(c) for c in CHOICES]}, draft_model=head)
  assert sd.drafter.tree
  prompts = _prompts(3, [7, 12, 4])
  plain = Decoder(target).generate(prompts, max_new_tokens=20, eos=False).token_ids
  assert sd.generate(prompts, max_new_tokens=20, eos=False).token_ids == plain
  # each node is its head's candidate of its rank: head depth-1, rank = the path's last entry
  state, sampling = sd.prefill(prompts, max_new_tokens=4)
  ctx = Context(tokens=state.tokens, length=state.length, prompt_len=state.prompt_len,
                sampling=sampling)
  draft, _ = sd.drafter.propose(sd.drafter_params, state.drafter_state, ctx, None)
  ids, _ = sd.drafter.topk(sd.drafter_params, state.drafter_state, 3)
  for i, c in enumerate(sorted(CHOICES, key=lambda c: (len(c), c))):
    np.testing.assert_array_equal(draft.tokens[:, i], ids[:, len(c) - 1, c[-1]])
  np.testing.assert_array_equal(draft.parent[0], [0, 0, 1, 1, 2, 3, 3, 6])


def test_tree_choice_errors(target, saved):
  head = _random_head(target)
  with pytest.raises(ValueError, match="node count: 8 choices given with num_speculative_tokens=4"):
    SpecDecoder(target, {"method": "medusa", "num_speculative_tokens": 4,
                         "tree_choices": [list(c) for c in CHOICES]}, draft_model=head)
  with pytest.raises(ValueError, match="every prefix"):
    SpecDecoder(target, {"method": "medusa", "num_speculative_tokens": 2,
                         "tree_choices": [[0], [1, 1]]}, draft_model=head)
  with pytest.raises(ValueError, match="go 5 deep"):
    SpecDecoder(target, {"method": "medusa", "num_speculative_tokens": 5,
                         "tree_choices": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0],
                                          [0, 0, 0, 0, 0]]}, draft_model=head)
  _, folder, _ = saved
  with pytest.raises(ValueError, match="rank_accuracy.json is missing"):
    SpecDecoder(target, {"method": "medusa", "num_speculative_tokens": 3, "head": folder,
                         "tree_choices": "auto"})
  medusa_format.save_rank_accuracy(folder, [[0.5, 0.2], [0.3, 0.1], [0.2, 0.1], [0.1, 0.1]])
  sd = SpecDecoder(target, {"method": "medusa", "num_speculative_tokens": 3, "head": folder,
                            "tree_choices": "auto"})
  assert sd.drafter.tree_depth == (1, 1, 2) and sd.drafter.tree_rank == (0, 1, 0)


def test_heads_sharing_the_targets_lm_head_save_no_lm_head_and_draft_the_same(target, tmp_path):
  """lm_head="target": the heads project through the target's own LM-head rows of the draft
  vocabulary (shared, frozen); the folder stores none of them, and a loaded head, given its rows by
  the drafter, drafts exactly as the head it was saved from (and decodes as plain decoding does)."""
  head = init_head(target, IDS, num_heads=3, num_layers=1, lm_head="target")
  rng = np.random.default_rng(11)
  for var in (head.res_kernel, head.res_bias):
    var[...] = jnp.asarray(rng.normal(0, 0.3, var[...].shape), jnp.float32)
  assert not any("lm_head" in "/".join(map(str, p)) for p, _ in
                 nnx.to_flat_state(nnx.state(head, nnx.Param)))     # the rows are not trained
  x = jax.random.normal(jax.random.key(3), (5, CFG.hidden_size))
  w, b = (np.asarray(v[...], np.float64) for v in (head.res_kernel, head.res_bias))
  rows = np.asarray(target.head_rows(jnp.asarray(IDS)), np.float64)             # [Vd, H]
  silu = lambda z: z / (1 + np.exp(-z))
  for k in range(3):
    y = np.asarray(x, np.float64)
    y = y + silu(y @ w[k, 0] + b[k, 0])
    np.testing.assert_allclose(head(x)[:, k], y @ rows.T, rtol=1e-4, atol=1e-4)

  folder = str(tmp_path / "shared")
  medusa_format.save_medusa(head, folder, dtype=jnp.float32, verifier="tiny")
  from safetensors.numpy import load_file
  names = set(load_file(os.path.join(folder, "model.safetensors")))
  assert not [n for n in names if n.startswith("medusa_head.") and n.endswith(".1.weight")]
  assert json.load(open(os.path.join(folder, "config.json")))["jspec_lm_head"] == "target"
  loaded = medusa_format.load_medusa(folder)
  assert loaded.config == head.config
  _assert_same_drafts(target, head, loaded, num_draft=3, k=4, seed=8)
  prompts = _prompts(9, [5, 10])
  plain = Decoder(target).generate(prompts, max_new_tokens=16, eos=False).token_ids
  spec = SpecDecoder(target, {"method": "medusa", "num_speculative_tokens": 3, "head": folder})
  assert spec.generate(prompts, max_new_tokens=16, eos=False).token_ids == plain
  with pytest.raises(ValueError, match="lm_head must be one of"):
    MedusaConfig(hidden_size=8, vocab_size=16, draft_vocab_size=4, lm_head="tied")
