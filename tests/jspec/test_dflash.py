"""DFlash and DSpark on a tiny random target: the packed training forward equals the drafting
forward, commit keeps the context cache equal to a from-scratch prefill, DSpark's draws follow
U_k + Markov bias with q recorded, greedy speculative decoding equals plain decoding without
recompiling, the head folders round-trip, and bad heads fail before compiling."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, SpecDecoder, count_compiles
from jspec.drafters.dflash import checkpoint as dflash_format
from jspec.drafters.base import Context
from jspec.drafters.dflash import DFlashConfig, DFlashDrafter, DFlashModule
from jspec.drafters.dspark import DSparkDrafter, DSparkModule
from jspec.sampling import SamplingParams, process_logits
from jspec.train import dflash as train_dflash
from models import KVCache, Llama, LlamaConfig

CFG = LlamaConfig.tiny(vocab_size=64, num_layers=3)
IDS = np.arange(10, 50)
KINDS = ("dflash", "dspark")


@pytest.fixture(scope="module")
def target():
  return Llama(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def modules(target):
  """Untrained modules (2 draft layers, blocks of 4; DSpark gated with a confidence head) with
  their Markov projection randomised (it starts at zero)."""
  out = {}
  for kind in KINDS + ("dflash-window",):
    m = train_dflash.init_module(target, IDS, kind.split("-")[0], num_layers=2, block_size=4,
                                 mask_token_id=3, markov_rank=8, markov_gated=True, seed=1,
                                 sliding_window=5 if kind.endswith("window") else 0)
    if kind == "dspark":
      rng = np.random.default_rng(2)
      m.markov_proj.kernel[...] = jnp.asarray(rng.normal(0, 1.0, m.markov_proj.kernel.shape),
                                              jnp.float32)
    out[kind] = m
  return out


def _drafter(kind, module, target, d, **kw):
  cls = DSparkDrafter if kind.startswith("dspark") else DFlashDrafter
  return cls.from_module(module, target, d, **kw)


def _ctx(tokens, length, prompt_len, taps, num_new=None, sampling=None):
  b = tokens.shape[0]
  return Context(tokens=tokens, length=jnp.asarray(length, jnp.int32),
                 prompt_len=jnp.asarray(prompt_len, jnp.int32),
                 sampling=sampling or SamplingParams.make(b), target_hidden=tuple(taps),
                 num_new=None if num_new is None else jnp.asarray(num_new, jnp.int32))


def _taps(target, module, seq):
  b, n = seq.shape
  return target(seq, KVCache.init(CFG, b, n), taps=module.config.taps).hidden


@pytest.mark.parametrize("kind", KINDS + ("dflash-window",))
def test_packed_training_forward_equals_drafting(target, modules, kind):
  """Blocks at two anchors per row through the packed training attention give the drafter's
  block hidden states after a prefill of the positions before each anchor (with a sliding window
  of 5 over the context, too)."""
  module = modules[kind]
  seq = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 20)), jnp.int32)
  taps = _taps(target, module, seq)
  anchors = jnp.asarray([[5, 9], [3, 12]], jnp.int32)
  backbone = module.backbone if kind == "dspark" else module
  if kind.endswith("window"):    # the window matters: without it the result differs
    full = train_dflash.block_forward(train_dflash.init_module(
        target, IDS, "dflash", num_layers=2, block_size=4, mask_token_id=3, seed=1),
        target.embed.embedding[...], taps, seq, anchors)
  packed = train_dflash.block_forward(backbone, target.embed.embedding[...], taps, seq, anchors)
  drafter, params = _drafter(kind, module, target, 3)
  for j in range(2):
    a = anchors[:, j]
    ctx = _ctx(seq, a + 1, a, taps)
    state = drafter.init_state(params, seq, ctx, 32)
    _, h = drafter.block_hidden(drafter.backbone(params), params, state, ctx, 4)
    np.testing.assert_allclose(h, packed[:, j], atol=2e-5)
  if kind.endswith("window"):
    assert float(jnp.abs(full - packed).max()) > 1e-3


def test_commit_equals_a_from_scratch_prefill(target, modules):
  """After commit of n tokens per row the context cache equals init_state over the committed
  sequence (positions < length - 1); a finished row (n = 0) keeps its length."""
  module = modules["dflash"]
  d, p = 3, 6
  drafter, params = _drafter("dflash", module, target, d)
  seq = jnp.asarray(np.random.default_rng(3).integers(0, 64, (4, 20)), jnp.int32)
  taps = _taps(target, module, seq)
  state = drafter.init_state(params, seq[:, :p], _ctx(seq, [p + 1] * 4, [p] * 4,
                                                       [t[:, :p] for t in taps]), 24)
  n = np.asarray([1, 2, d + 1, 0])
  length = p + 1 + n
  after = drafter.commit(params, state, _ctx(seq, length, [p] * 4,
                                             [t[:, p:p + d + 1] for t in taps], n))
  scratch = drafter.init_state(params, seq, _ctx(seq, length, length - 1, taps), 24)
  np.testing.assert_array_equal(after.cache.lengths, [p + 1, p + 2, p + d + 1, p])
  for r in range(4):
    m = int(after.cache.lengths[r])
    for layer in range(2):
      np.testing.assert_allclose(after.cache.k[layer][r, :m], scratch.cache.k[layer][r, :m],
                                 atol=1e-5)
      np.testing.assert_allclose(after.cache.v[layer][r, :m], scratch.cache.v[layer][r, :m],
                                 atol=1e-5)


def test_dspark_draws_follow_the_markov_chain(target, modules):
  """Each slot's recorded q is the processed softmax of U_k + B(previous token) (the anchor for
  slot 0), restricted to the draft vocabulary; greedy rows draw its argmax."""
  module = modules["dspark"]
  d = 4
  drafter, params = _drafter("dspark", module, target, d)
  seq = jnp.asarray(np.random.default_rng(4).integers(0, 64, (3, 12)), jnp.int32)
  taps = _taps(target, module, seq)
  sampling = SamplingParams.make(3, [1.0, 0.7, 0.0], [0, 5, 0], [1.0, 0.9, 1.0])
  ctx = _ctx(seq, [8, 8, 8], [7, 7, 7], taps, sampling=sampling)
  state = drafter.init_state(params, seq, ctx, 24)
  keys = jax.random.split(jax.random.key(0), 3)
  draft, conf = drafter.propose_with_confidence(params, state, ctx, keys)
  anchor, h = drafter.block_hidden(module.backbone, params, state, ctx, d)
  prev = module.draft_index(anchor)
  assert conf.shape == (3, d)
  for k in range(d):
    bias, _ = module.markov_bias(h[:, k], prev)
    u = module.backbone.draft_logits(h[:, k], params["head"]) + bias
    want = np.exp(np.asarray(process_logits(module.backbone.target_logits(u), sampling)))
    np.testing.assert_allclose(draft.q[:2, k], want[:2], atol=1e-5)
    assert int(draft.tokens[2, k]) == int(np.argmax(want[2]))
    assert np.all(np.isin(np.asarray(draft.tokens[:, k]), IDS))
    prev = module.draft_index(draft.tokens[:, k])


@pytest.fixture(scope="module")
def plain(target):
  decoder = Decoder(target)
  return lambda prompts, n: decoder.generate(prompts, max_new_tokens=n, eos=False).token_ids


def _prompts(n, seed=0, lo=4, hi=9):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, CFG.vocab_size, int(rng.integers(lo, hi))).tolist() for _ in range(n)]


@pytest.mark.parametrize("kind, d", [("dflash", 3), ("dflash-window", 2), ("dspark", 4)])
def test_greedy_rows_equal_plain_decoding_without_recompiling(target, modules, plain, kind, d):
  """Greedy rows equal plain decoding beside a sampled row; a second call with other prompts and
  seeds compiles nothing."""
  spec = SpecDecoder(target, {"method": kind.split("-")[0], "num_speculative_tokens": d},
                     draft_model=modules[kind])
  kw = dict(max_new_tokens=30, temperature=[0.0, 0.0, 1.0], eos=False)
  spec.generate(_prompts(3, 2), **kw)
  prompts = _prompts(3, 3)
  with count_compiles() as c:
    out = spec.generate(prompts, seed=4, **kw)
  assert c.count == 0 and out.rounds > 5
  assert out.token_ids[:2] == plain(prompts, 30)[:2]


def _leaves(m):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(nnx.state(m))]


@pytest.mark.parametrize("name", KINDS + ("dflash-window",))
def test_head_folder_round_trips(target, modules, name, tmp_path):
  module = modules[name]
  kind = name.split("-")[0]
  folder = str(tmp_path / "head")
  dflash_format.save(module, folder, dtype=jnp.float32, verifier="tiny")
  raw = json.load(open(os.path.join(folder, "config.json")))
  assert raw["speculators_model_type"] == kind and raw["block_size"] == 4
  assert raw["aux_hidden_state_layer_ids"] == [t - 1 for t in module.config.taps]
  assert raw["sample_from_anchor"] == (kind == "dspark")
  assert raw["transformer_layer_config"].get("sliding_window", 0) == module.config.sliding_window
  from safetensors.numpy import load_file
  w = load_file(os.path.join(folder, "model.safetensors"))
  assert w["fc.weight"].shape == (CFG.hidden_size, 3 * CFG.hidden_size)          # [out, in]
  assert "embed_tokens.weight" not in w and "lm_head.weight" not in w
  assert ("markov_head.W1.weight" in w) == (kind == "dspark")
  loaded = dflash_format.load(folder, kind)
  assert loaded.config == module.config
  for a, b in zip(_leaves(module), _leaves(loaded)):
    np.testing.assert_array_equal(a, b)
  small = str(tmp_path / "bf16")
  dflash_format.save(module, small)                          # the default: bf16 weights
  size = lambda f: os.path.getsize(os.path.join(f, "model.safetensors"))
  assert size(small) < 0.6 * size(folder)


def _corrupt(folder, how):
  w, c = os.path.join(folder, "model.safetensors"), os.path.join(folder, "config.json")
  if how == "missing":
    os.remove(w)
  elif how == "checksum":
    data = bytearray(open(w, "rb").read())
    data[-3] ^= 0xFF
    open(w, "wb").write(bytes(data))
  else:
    cfg = json.load(open(c))
    if how == "kind":
      cfg["speculators_model_type"] = "eagle3"
    else:
      cfg["transformer_layer_config"]["hidden_size" if how == "hidden" else "vocab_size"] *= 2
    open(c, "w").write(json.dumps(cfg))
    os.remove(os.path.join(folder, "checksums.json"))


@pytest.mark.parametrize("how, message", [
    ("missing", "model.safetensors is missing"),
    ("checksum", "has sha256 .* expected"),
    ("kind", "speculators_model_type is 'eagle3', not 'dflash'"),
    ("hidden", "has shape"),
    ("vocab", "vocabulary 128 differs from the target's 64: .*jspec train dflash"),
])
def test_bad_head_fails_before_compiling(target, modules, tmp_path, how, message):
  folder = str(tmp_path / "head")
  dflash_format.save(modules["dflash"], folder, dtype=jnp.float32)
  _corrupt(folder, how)
  with count_compiles() as c:
    with pytest.raises(ValueError, match=message):
      SpecDecoder(target, {"method": "dflash", "num_speculative_tokens": 2, "head": folder})
  assert c.count == 0


def test_block_too_long_other_target_and_no_shipped_head(target, modules):
  with pytest.raises(ValueError, match=r"num_speculative_tokens must be in \[1, 3\] for this "
                                       "DFlash head \\(trained on blocks of 4\\)"):
    SpecDecoder(target, {"method": "dflash", "num_speculative_tokens": 4},
                draft_model=modules["dflash"])
  with pytest.raises(ValueError, match=r"must be in \[1, 4\] for this DSpark head"):
    SpecDecoder(target, {"method": "dspark", "num_speculative_tokens": 5},
                draft_model=modules["dspark"])
  other = DFlashModule(DFlashConfig.for_target(LlamaConfig.tiny(vocab_size=64, hidden_size=32,
                                                                head_dim=8)))
  with pytest.raises(ValueError, match="hidden size 32 differs from the target's 64"):
    SpecDecoder(target, {"method": "dflash", "num_speculative_tokens": 2}, draft_model=other)
  for kind in KINDS:
    with pytest.raises(ValueError, match=f"no {kind} head is shipped for this target"):
      SpecDecoder(target, {"method": kind, "num_speculative_tokens": 2})
  with pytest.raises(ValueError, match="sample_from_anchor=True and markov_rank >= 1"):
    DSparkModule(DFlashConfig.for_target(CFG))
