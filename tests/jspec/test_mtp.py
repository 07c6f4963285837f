"""The MTP drafter on a tiny random target: its decoder layer equals the target's Block, commit
keeps the module's cache equal to a from-scratch run over the committed sequence, greedy speculative
decoding equals plain decoding, the head folder and checkpoint-layer loaders round-trip, and bad
modules fail early."""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from jspec import Decoder, SpecDecoder, count_compiles
from jspec.drafters import heads
from jspec.drafters.mtp import checkpoint as mtp_format
from jspec.drafters.base import Context
from jspec.drafters.shared import cache_attend
from jspec.drafters.mtp import MTPConfig, MTPDrafter, MTPModule
from jspec.sampling import SamplingParams
from models import KVCache, Llama, LlamaConfig

CFG = LlamaConfig.tiny(vocab_size=64, num_layers=3)


@pytest.fixture(scope="module")
def target():
  return Llama(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def module():
  m = MTPModule(MTPConfig.for_target(CFG, draft_vocab_size=40), rngs=nnx.Rngs(2))
  m.draft_to_target[...] = jnp.arange(40, dtype=jnp.int32) + 11
  return m


def _prompts(n, seed=0, lo=4, hi=9):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, CFG.vocab_size, int(rng.integers(lo, hi))).tolist() for _ in range(n)]


def test_decoder_layer_equals_the_targets_block(module):
  """x = eh_proj([enorm(emb); hnorm(prev)]) then models.llama.Block through the module's cache."""
  rng = np.random.default_rng(1)
  prev, emb = (jnp.asarray(rng.normal(size=(2, 5, CFG.hidden_size)), jnp.float32)
               for _ in range(2))
  cache = KVCache.init(module.config.layer_config(), 2, 16).with_lengths(jnp.asarray([0, 3]))
  positions = cache.lengths[:, None] + jnp.arange(5)[None]

  @nnx.jit
  def both(module, cache):
    got, written = module(prev, emb, positions, cache_attend(cache, "reference"))
    x = jnp.concatenate([module.enorm(emb), module.hnorm(prev)], -1) @ module.eh_proj.kernel[...]
    want, ref_cache = module.block(x, positions, cache, 0, None)
    return got, written, want, ref_cache
  got, written, want, ref_cache = both(module, cache)
  np.testing.assert_allclose(got, want, atol=1e-5)
  np.testing.assert_allclose(written.k[0], ref_cache.k[0], atol=1e-6)


@functools.partial(jax.jit, static_argnums=0)
def _final(graphdef, weights, tokens):
  b, s = tokens.shape
  out = nnx.merge(graphdef, weights)(tokens, KVCache.init(CFG, b, s), taps=(CFG.num_layers,))
  return out.hidden[0]


def _target_final(target, tokens):
  """The tap the engine hands MTP: the last layer's output (before the final norm), [B, S, H]."""
  return _final(*nnx.split(target), tokens)


def _ctx(tokens, length, prompt_len, hidden, num_new=None):
  b = tokens.shape[0]
  return Context(tokens=tokens, length=jnp.asarray(length, jnp.int32),
                 prompt_len=jnp.asarray(prompt_len, jnp.int32),
                 sampling=SamplingParams.make(b), target_hidden=(hidden,),
                 num_new=None if num_new is None else jnp.asarray(num_new, jnp.int32))


@pytest.mark.parametrize("num", [None, 2])
def test_commit_equals_a_from_scratch_run(target, module, num):
  """After propose (which writes drafted K/V) and commit of n tokens per row, the module's cache,
  hidden and logits equal init_state over the whole committed sequence; a finished row (n = 0)
  keeps its state."""
  d, p, max_len = 3, 6, 24
  drafter, params = MTPDrafter.from_module(module, target, d, sample=False)
  drafter = MTPDrafter(drafter.graphdef, d, drafter.target_taps, False, "reference")
  rng = np.random.default_rng(3)
  seq = jnp.asarray(rng.integers(0, CFG.vocab_size, (4, max_len)), jnp.int32)
  hidden = _target_final(target, seq)                          # [B, S, H]
  b = seq.shape[0]
  init = jax.jit(drafter.init_state, static_argnums=3)
  w = p + d + 1                                                # one prompt width: one compile
  ctx = _ctx(seq, [p + 1] * b, [p] * b, hidden[:, :w])
  state = init(params, seq[:, :w], ctx, max_len)
  _, state = jax.jit(drafter.propose)(params, state, ctx, jnp.zeros((b,), jnp.uint32), num)
  n = np.asarray([1, 2, d + 1, 0])
  length = p + 1 + n
  block = hidden[:, p:p + d + 1]                               # positions length-1-n ...
  after = jax.jit(drafter.commit)(params, state, _ctx(seq, length, [p] * b, block, n))
  scratch = init(params, seq[:, :w], _ctx(seq, length, p + n, hidden[:, :w]), max_len)
  for r in range(3):
    m = int(length[r] - 1)
    assert int(after.cache.lengths[r]) == m
    np.testing.assert_allclose(after.cache.k[0][r, :m], scratch.cache.k[0][r, :m], atol=1e-5)
    np.testing.assert_allclose(after.cache.v[0][r, :m], scratch.cache.v[0][r, :m], atol=1e-5)
    np.testing.assert_allclose(after.hidden[r], scratch.hidden[r], atol=1e-5)
    np.testing.assert_allclose(after.logits[r], scratch.logits[r], atol=1e-4)
  np.testing.assert_array_equal(after.logits[3], state.logits[3])      # the finished row
  assert int(after.cache.lengths[3]) == p


@pytest.fixture(scope="module")
def plain(target):
  decoder = Decoder(target)
  return lambda prompts, n: decoder.generate(prompts, max_new_tokens=n, eos=False).token_ids


def test_greedy_rows_equal_plain_decoding_without_recompiling(target, module, plain):
  """D = 3, sampled drafts (q recorded) on a sampled row: the greedy rows equal plain decoding,
  and a second call with other prompts and seeds compiles nothing."""
  spec = SpecDecoder(target, {"method": "mtp", "num_speculative_tokens": 3}, draft_model=module)
  kw = dict(max_new_tokens=40, temperature=[0.0, 0.0, 1.0], eos=False)
  spec.generate(_prompts(3, 2), **kw)
  prompts = _prompts(3, 3)
  with count_compiles() as c:
    out = spec.generate(prompts, seed=4, **kw)
  assert c.count == 0 and out.rounds > 10
  assert out.token_ids[:2] == plain(prompts, 40)[:2]


def _leaves(m):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(nnx.state(m))]


@functools.partial(jax.jit, static_argnums=0)
def _init_and_propose(drafter, params, ctx):
  state = drafter.init_state(params, ctx.tokens[:, :8], ctx, 32)
  return state.logits, drafter.propose(params, state, ctx, jnp.zeros((1,), jnp.uint32))[0].tokens


def _first_drafts(target, m):
  """(draft logits after the prompt, the 3 greedy drafts) for one fixed prompt."""
  drafter, params = MTPDrafter.from_module(m, target, 3, sample=False)
  seq = jnp.asarray(_prompts(1, 7, 10, 11)[0] * 2, jnp.int32)[None]
  ctx = _ctx(seq, [9], [8], _target_final(target, seq)[:, :8])
  return tuple(np.asarray(x) for x in _init_and_propose(drafter, params, ctx))


def test_head_folder_round_trips(target, module, tmp_path):
  folder = str(tmp_path / "head")
  sums = mtp_format.save_mtp(module, folder, dtype=jnp.float32, verifier="tiny")
  assert set(sums) == {"config.json", "model.safetensors"}
  from safetensors.numpy import load_file
  w = load_file(os.path.join(folder, "model.safetensors"))
  assert w["eh_proj.weight"].shape == (CFG.hidden_size, 2 * CFG.hidden_size)      # [out, in]
  assert "shared_head.head.weight" not in w and "embed_tokens.weight" not in w
  np.testing.assert_array_equal(w["d2t"] + np.arange(40), np.arange(40) + 11)
  loaded = mtp_format.load_mtp(folder)
  for a, b in zip(_leaves(module), _leaves(loaded)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(_first_drafts(target, module), _first_drafts(target, loaded)):
    np.testing.assert_array_equal(a, b)
  small = str(tmp_path / "bf16")
  mtp_format.save_mtp(module, small)                          # the default: bf16 weights
  size = lambda f: os.path.getsize(os.path.join(f, "model.safetensors"))
  assert size(small) < 0.6 * size(folder)
  for a, b in zip(_leaves(module), _leaves(mtp_format.load_mtp(small))):
    np.testing.assert_allclose(b, a, rtol=1e-2, atol=1e-2)


def _checkpoint(tmp_path, module, target, *, head_norm=True, nextn=1, extra=None):
  """A checkpoint in the num_nextn_predict_layers layout: config.json and a shard with main-model
  tensors plus the MTP layer at index L (its enorm/hnorm/eh_proj, decoder layer, shared head)."""
  folder = tmp_path / "ckpt"
  folder.mkdir(exist_ok=True)
  hf = dict(model_type="llama", hidden_size=CFG.hidden_size, num_hidden_layers=CFG.num_layers,
            num_attention_heads=CFG.num_heads, num_key_value_heads=CFG.num_kv_heads,
            intermediate_size=CFG.intermediate_size, vocab_size=CFG.vocab_size,
            num_nextn_predict_layers=nextn)
  (folder / "config.json").write_text(json.dumps(hf))
  L = CFG.num_layers
  tensors = mtp_format.to_tensors(module, prefix=f"model.layers.{L}.", dtype=jnp.float32)
  emb = np.asarray(target.embed.embedding[...])
  tensors[f"model.layers.{L}.embed_tokens.weight"] = emb
  tensors[f"model.layers.{L}.shared_head.head.weight"] = emb
  if head_norm:
    tensors[f"model.layers.{L}.shared_head.norm.weight"] = np.asarray(target.norm.scale[...])
  tensors["model.norm.weight"] = np.asarray(target.norm.scale[...])        # main model: skipped
  tensors["model.layers.0.input_layernorm.weight"] = np.ones(CFG.hidden_size, np.float32)
  tensors.update(extra or {})
  save_file(tensors, str(folder / "model-00001-of-00001.safetensors"))
  return str(folder)


def test_checkpoint_mtp_layer_round_trips(target, tmp_path):
  """Saved under model.layers.{L}.* and read back: the same drafts (over the full vocabulary);
  its shared_head.norm replaces the target's final norm (here equal to it)."""
  module = MTPModule(MTPConfig.for_target(CFG), rngs=nnx.Rngs(5))
  folder = _checkpoint(tmp_path, module, target)
  loaded = mtp_format.load_checkpoint_mtp(folder, CFG)
  assert loaded.config.own_head_norm and loaded.config.draft_vocab_size == CFG.vocab_size
  for a, b in zip(_first_drafts(target, module), _first_drafts(target, loaded)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("how, message", [
    ("no_layers", "num_nextn_predict_layers = 0: the checkpoint carries no MTP layers"),
    ("moe", "weights jspec cannot read, e.g. .*experts"),
    ("other_model", "num_hidden_layers = 3 but the target has 4"),
])
def test_bad_checkpoint_fails_early(target, tmp_path, how, message):
  module = MTPModule(MTPConfig.for_target(CFG), rngs=nnx.Rngs(5))
  extra = {f"model.layers.{CFG.num_layers}.mlp.experts.0.gate_proj.weight":
           np.zeros((4, CFG.hidden_size), np.float32)} if how == "moe" else None
  folder = _checkpoint(tmp_path, module, target, nextn=0 if how == "no_layers" else 1,
                       extra=extra)
  other = Llama(LlamaConfig.tiny(vocab_size=64, num_layers=4)) if how == "other_model" else target
  with count_compiles() as c:
    with pytest.raises(ValueError, match=message):
      SpecDecoder(other, {"method": "mtp", "num_speculative_tokens": 2, "checkpoint": folder})
  assert c.count == 0


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
    cfg["hidden_size" if how == "hidden" else "vocab_size"] *= 2
    open(c, "w").write(json.dumps(cfg))
    os.remove(os.path.join(folder, "checksums.json"))


@pytest.mark.parametrize("how, message", [
    ("missing", "model.safetensors is missing"),
    ("checksum", "has sha256 .* expected"),
    ("hidden", "has shape"),
    ("vocab", "vocabulary 128 differs from the target's 64: .*jspec train mtp"),
])
def test_bad_head_fails_before_compiling(target, module, tmp_path, how, message):
  folder = str(tmp_path / "head")
  mtp_format.save_mtp(module, folder, dtype=jnp.float32)
  _corrupt(folder, how)
  with count_compiles() as c:
    with pytest.raises(ValueError, match=message):
      SpecDecoder(target, {"method": "mtp", "num_speculative_tokens": 2, "head": folder})
  assert c.count == 0


def test_module_for_another_target_and_no_shipped_head(target):
  other = MTPModule(MTPConfig.for_target(LlamaConfig.tiny(vocab_size=64, hidden_size=32,
                                                          head_dim=8)))
  with pytest.raises(ValueError, match="hidden size 32 differs from the target's 64"):
    SpecDecoder(target, {"method": "mtp", "num_speculative_tokens": 2}, draft_model=other)
  with pytest.raises(ValueError, match="no MTP module is shipped for this target"):
    SpecDecoder(target, {"method": "mtp", "num_speculative_tokens": 2})
  with pytest.raises(ValueError, match="either an MTP head folder"):
    SpecDecoder(target, {"method": "mtp", "num_speculative_tokens": 2, "head": "a",
                         "checkpoint": "b"})


@pytest.mark.slow
def test_shipped_module_on_the_default_model(smollm, chat_ids):
  """The shipped module drafts for SmolLM2-135M-Instruct: greedy output equals plain decoding up
  to the plain path's first near-tie (top-2 gap < 1e-4), and it accepts."""
  if heads.shipped("mtp", smollm.model.config) is None:
    pytest.skip("no MTP module is shipped for the default model")
  ref = Decoder(smollm.model).generate(chat_ids, max_new_tokens=32, eos=False)
  out = SpecDecoder(smollm.model, {"method": "mtp", "num_speculative_tokens": 3}).generate(
      chat_ids, max_new_tokens=32, eos=False)
  for spec, plain, margins in zip(out.token_ids, ref.token_ids, ref.margins):
    upto = next((j for j, m in enumerate(margins) if m < 1e-4), len(plain))
    assert spec[:upto] == plain[:upto]
  assert out.acceptance_length > 1.1, out.acceptance_length      # measured 1.20; untrained ~1.0


def test_target_and_mtp_from_one_checkpoint(tmp_path):
  """A transformers Llama checkpoint plus an MTP layer at model.layers.{L} and
  num_nextn_predict_layers = 1: the target loads without the layer (equal to the same checkpoint
  without it), the drafter loads it, and greedy MTP decoding equals plain decoding."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from models.hf_loader import load_hf_folder
  from models.weights import llama_from_hf_tensors
  torch.manual_seed(0)
  hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
      vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)).eval()
  hf.save_pretrained(tmp_path)
  cfg, tensors = load_hf_folder(str(tmp_path))
  plain_target = llama_from_hf_tensors(cfg, tensors)
  module = MTPModule(MTPConfig.for_target(cfg), rngs=nnx.Rngs(5))
  extra = mtp_format.to_tensors(module, prefix=f"model.layers.{cfg.num_layers}.",
                                dtype=jnp.float32)
  save_file(extra, str(tmp_path / "mtp.safetensors"))
  hf_cfg = json.loads((tmp_path / "config.json").read_text())
  (tmp_path / "config.json").write_text(json.dumps(dict(hf_cfg, num_nextn_predict_layers=1)))
  cfg2, tensors2 = load_hf_folder(str(tmp_path))
  assert cfg2.num_nextn_predict_layers == 1 and any(".layers.2." in n for n in tensors2)
  target = llama_from_hf_tensors(cfg2, tensors2)
  ids = jnp.asarray([[3, 1, 4, 1, 5, 9]])
  np.testing.assert_array_equal(target(ids, KVCache.init(cfg2, 1, 8)).logits,
                                plain_target(ids, KVCache.init(cfg, 1, 8)).logits)
  prompts = [[3, 1, 4, 1, 5], [2, 7, 1, 8, 2, 8, 1]]
  sd = SpecDecoder(target, {"method": "mtp", "num_speculative_tokens": 2,
                            "checkpoint": str(tmp_path)})
  assert sd.generate(prompts, max_new_tokens=12, eos=False).token_ids == \
      Decoder(target).generate(prompts, max_new_tokens=12, eos=False).token_ids


def test_eagle2_trees_on_the_mtp_module(target, module, plain):
  """EAGLE-2 trees built from the MTP module: greedy rows equal plain decoding, a sampled row
  runs, nothing recompiles; the tree is topologically ordered with the root's top-k first."""
  from jspec import tree
  spec = SpecDecoder(target, {"method": "mtp", "num_speculative_tokens": 6, "tree_top_k": 2,
                              "tree_depth": 3}, draft_model=module)
  assert spec.drafter.tree
  kw = dict(max_new_tokens=30, temperature=[0.0, 0.0, 1.0], eos=False)
  spec.generate(_prompts(3, 2), **kw)
  prompts = _prompts(3, 3)
  with count_compiles() as c:
    out = spec.generate(prompts, seed=4, **kw)
  assert c.count == 0 and out.token_ids[:2] == plain(prompts, 30)[:2]
  # greedy rows draft the tree, the sampled row the sampled chain (its q recorded)
  state, sampling = spec.prefill(prompts, max_new_tokens=4, temperature=[0.0, 0.0, 1.0])
  ctx = Context(tokens=state.tokens, length=state.length, prompt_len=state.prompt_len,
                sampling=sampling)
  draft, _ = spec.drafter.propose(spec.drafter_params, state.drafter_state, ctx, state.keys)
  parent = np.asarray(draft.parent)
  tree.check_parents(parent)
  d2t = np.asarray(module.draft_to_target[...])
  top = d2t[np.argsort(-np.asarray(state.drafter_state.logits), axis=1)[:, :2]]
  for b in range(2):
    assert set(np.asarray(draft.tokens)[b][parent[b] == 0]) <= set(top[b])
    np.testing.assert_array_equal(np.asarray(draft.q)[b], np.eye(draft.q.shape[-1])[
        np.asarray(draft.tokens)[b]])
  np.testing.assert_array_equal(parent[2], np.arange(6))
  q = np.asarray(draft.q)[2]
  assert np.all(q[np.arange(6), np.asarray(draft.tokens)[2]] > 0) and np.all(q.max(-1) < 1)
  with pytest.raises(ValueError, match="both tree_top_k"):
    SpecDecoder(target, {"method": "mtp", "num_speculative_tokens": 4, "tree_depth": 2},
                draft_model=module)
