"""MTP training on tiny configs: the training-time-test pass equals the drafting path it simulates,
the loss falls and the trained module accepts, a resumed run reproduces the uninterrupted one, the
feature cache's last slot is the final normed hidden state, the step weights are FastMTP's, and
`--init` continues an exported module."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import SpecDecoder
from jspec.drafters.shared import cache_attend
from jspec.drafters.mtp import MTPDrafter
from jspec.train import features, mtp, trainer
from jspec.train.shared import MixedDot
from jspec.train.shards import TokenShards
from models import KVCache, Llama, LlamaConfig
from tests.jspec.train.cli_run import assert_init_refused, cli_train, train_log
from tests.jspec.train.mixed import check_mixed_matches_float32
from tests.jspec.train.packed import check_packed_equals_apart
from tests.jspec.train.shards import random_prompts, write_greedy_shards

CFG = LlamaConfig.tiny(vocab_size=64, num_layers=3)
SEQ = 48


@pytest.fixture(scope="module")
def target():
  model = Llama(CFG, rngs=nnx.Rngs(0))
  model.embed.embedding[...] = model.embed.embedding[...] * 4.0   # peaked, repetitive greedy text
  return model


def _prompts(n, seed=0):
  return random_prompts(n, CFG.vocab_size, seed)


@pytest.fixture(scope="module")
def data_dir(target, tmp_path_factory):
  """Shards in `jspec train data`'s format (prompts answered greedily by the tiny target) and a
  feature cache with taps (1, 2) before the final normed hidden state."""
  d = tmp_path_factory.mktemp("mtp_data")
  prompts = _prompts(48)
  write_greedy_shards(d, target, prompts)
  feats = str(d / "feats")
  features.cache_features(target, str(d), feats, taps=(1, 2), batch_size=16,
                          progress=False)
  return str(d), feats, prompts


def test_step_weights_are_fastmtps():
  np.testing.assert_allclose(mtp.step_weights(3, 0.6), [0.5102, 0.3061, 0.1837], atol=1e-4)
  np.testing.assert_allclose(mtp.step_weights(1, 0.6), [1.0])


def test_training_time_test_equals_the_drafting_path(target):
  """Step k at anchor i sees what drafting token i+k+1 sees: step-1 K/V at positions <= i (from
  the target's hidden states) plus the module's own K/V at i+1 .. i+k-1."""
  module = mtp.init_module(target, np.arange(3, 60), seed=3)
  n, steps, anchor_list = 12, 3, (0, 4, 7)
  tokens = jnp.asarray(_prompts(1, 5)[0] * 3, jnp.int32)[None, :n]
  drafter, params = MTPDrafter.from_module(module, target, steps, sample=False)
  drafter = MTPDrafter(drafter.graphdef, steps, drafter.target_taps, False, "reference")
  tgraph, tweights = nnx.split(target)

  @jax.jit
  def training_pass(params, tweights, anchors):
    module, tgt = nnx.merge(drafter.graphdef, params["mtp"]), nnx.merge(tgraph, tweights)
    feats = mtp.target_features(tgt, tokens, module.draft_to_target[...])
    outs = mtp.mtp_forward(module, params["embed"], params["norm"], feats.final, tokens,
                           anchors, steps)
    tap = tgt(tokens, KVCache.init(CFG, 1, n), taps=(CFG.num_layers,)).hidden[0]  # [1, N, H]
    return [module.draft_logits(o, params["head"]) for o in outs], tap, feats.final

  @jax.jit
  def draft_path(params, tap, t):
    """Catch up over positions 0..t with the target's tap, then steps 2..K with true tokens."""
    module = nnx.merge(drafter.graphdef, params["mtp"])
    cache = KVCache.init(module.config.layer_config(), 1, 32)
    cache, prev, logits = drafter._catch_up(module, params, cache, tap, tokens[:, 1:],
                                            jnp.zeros((1,), jnp.int32), t[None] + 1)
    out = [logits]
    for k in range(2, steps + 1):
      a, cache = module(prev[:, None], params["embed"][tokens[:, t + k]][:, None],
                        cache.lengths[:, None], cache_attend(cache, "reference"))
      cache = cache.with_lengths(cache.lengths + 1)
      prev = module.shared_norm(a[:, 0], params["norm"])
      out.append(module.draft_logits(prev, params["head"]))
    return out

  train_logits, tap, final = training_pass(params, tweights, jnp.asarray([anchor_list]))
  np.testing.assert_allclose(final, target.norm(tap), atol=1e-6)     # h^0: the normed tap
  for i, t in enumerate(anchor_list):
    for k, got in enumerate(draft_path(params, tap[:, :n - 1], jnp.int32(t))):
      np.testing.assert_allclose(got, train_logits[k][:, i], atol=1e-4, rtol=1e-4)


def _config(**kw):
  base = dict(steps=40, batch_size=8, seq_len=SEQ, lr=1e-2, warmup=5, save_every=10,
              eval_every=20, holdout=8)
  base.update(kw)
  return trainer.TrainConfig(**base)


IDS = np.arange(2, 62)           # a draft vocabulary of 60 of the 64 tokens


@pytest.fixture(scope="module")
def trained(target, data_dir, tmp_path_factory):
  data, feats, _ = data_dir
  task = mtp.mtp_task(target, IDS)
  out = str(tmp_path_factory.mktemp("run") / "whole")
  history = trainer.train(task, data, out, _config(), progress=False, features=feats)
  return task, history, out


def test_feature_cache_last_slot_is_the_final_normed_hidden(target, data_dir):
  data, feats, _ = data_dir
  cached = features.FeatureShards(data, SEQ, feats)
  ids = jnp.asarray(IDS, jnp.int32)
  tgraph, tweights = nnx.split(target)
  rows = [0, 31]
  tokens = jnp.asarray(np.stack([TokenShards(data, SEQ)[i]["tokens"] for i in rows]))
  stored = jnp.asarray(np.stack([cached[i]["feats"] for i in rows]))       # [2, SEQ, 3, H]
  assert stored.shape[2] == 3                                               # taps 1, 2 + final
  want, got = jax.jit(lambda w: (mtp.target_features(nnx.merge(tgraph, w), tokens, ids),
                                 mtp.target_features(nnx.merge(tgraph, w), None, ids, stored)))(
                                     tweights)
  for r, i in enumerate(rows):
    n = int(TokenShards(data, SEQ)[i]["length"])
    for a, b in ((want.final, got.final), (want.target_logits, got.target_logits)):
      a, b = a[r, :n], b[r, :n]
      np.testing.assert_allclose(b, a, rtol=2e-2, atol=2e-2 * float(jnp.abs(a).max()))


def test_training_lowers_loss_and_the_module_accepts(target, data_dir, trained):
  _, _, prompts = data_dir
  task, history, _ = trained
  # the loss is a soft cross-entropy against the target's broad distribution: its floor is the
  # target's entropy, so the drop is measured in accuracy and acceptance
  first = np.mean([r["loss"] for r in history[:5]])
  last = np.mean([r["loss"] for r in history[-5:]])
  assert last < first - 0.4, (first, last)
  assert history[0]["step_acc"][0] < 0.15
  held = history[-1]["eval"]
  assert held["step_acc"][0] > 0.3 and held["al"] > 1.5, held       # the greedy estimate, D = 3
  spec = SpecDecoder(target, {"method": "mtp", "num_speculative_tokens": 3,
                              "draft_sampling": False}, draft_model=task.module(task.params))
  out = spec.generate(prompts[:8], max_new_tokens=32, eos=False)
  assert out.acceptance_length > 1.3, out.acceptance_length     # an untrained module: ~1.03


def test_resume_reproduces_the_uninterrupted_run(target, data_dir, trained, tmp_path):
  """The finished run's folder cut back to its step-20 checkpoint (params, optimizer, data order)
  resumes into the same losses as steps 21.. of the uninterrupted run."""
  data, feats, _ = data_dir
  _, whole, out = trained
  run = str(tmp_path / "cut")
  shutil.copytree(out, run)
  ckpts = os.path.join(run, "checkpoints")
  kept = sorted(int(c) for c in os.listdir(ckpts) if c.isdigit())
  assert kept == [20, 30, 40]                          # save_every 10, keep 3
  for step in (30, 40):
    shutil.rmtree(os.path.join(ckpts, str(step)))
  resumed = trainer.train(mtp.mtp_task(target, IDS), data, run, _config(), progress=False,
                          stop_after=4, features=feats)
  assert [r["step"] for r in resumed] == [21, 22, 23, 24]
  np.testing.assert_allclose([r["loss"] for r in resumed], [r["loss"] for r in whole[20:24]],
                             atol=1e-5, rtol=0)
  with pytest.raises(ValueError, match="checkpoints of another run"):
    trainer.train(mtp.mtp_task(target, IDS, steps=2), data, run, _config(), progress=False,
                  features=feats)


def test_mixed_precision_training_matches_float32_and_keeps_float32_results(target, data_dir):
  from jspec.train.loader import heldout_batches
  data, feats, _ = data_dir
  batch = {k: jnp.asarray(v) for k, v in heldout_batches(data, seq_len=SEQ, batch_size=4,
                                                         holdout=8, features=feats)[0].items()}
  check_mixed_matches_float32(lambda dt: mtp.mtp_task(target, IDS, seed=2, compute_dtype=dt),
                              batch, min_products=20)
  task = mtp.mtp_task(target, IDS, compute_dtype=jnp.bfloat16)
  module = task.module(task.params)
  assert all(m.dot_general != mixed for m in [module.eh_proj, module.block.mlp.down_proj]
             for mixed in [MixedDot(jnp.bfloat16)])      # the export is the float32 module


def test_a_packed_row_trains_as_its_sequences_apart(target, data_dir):
  """mtp_loss over one packed row equals mtp_loss over its sequences as separate rows (attention,
  RoPE positions and labels kept apart), and differs without the segments."""
  from jspec.train.features import FeatureShards
  from jspec.train.shards import PackedRows
  data, feats, _ = data_dir
  whole = TokenShards(data, 4096)
  n = 4 * max(len(whole.sequence(i)[0]) for i in range(len(whole)))   # any two fit a row
  src = FeatureShards(data, n, feats)
  packed = PackedRows(src, [0, 5])
  assert len(packed) == 1 and sorted(p[0] for p in packed.rows[0]) == [0, 5]
  check_packed_equals_apart(mtp.mtp_task(target, IDS, seed=3), packed)


def test_bad_settings_fail_early(target):
  with pytest.raises(ValueError, match="steps must be >= 1"):
    mtp.mtp_task(target, IDS, steps=0)
  with pytest.raises(ValueError, match=r"beta .* must be in \(0, 1\]"):
    mtp.mtp_task(target, IDS, beta=0.0)


def _cli_train(target, data, monkeypatch, *argv):
  """`jspec train mtp` on the tiny target (the loader returns it)."""
  cli_train("mtp", target, data, monkeypatch, *argv, lr="1e-2")


def test_init_continues_from_an_exported_module(target, data_dir, tmp_path, monkeypatch):
  """`--init HEAD` starts from the module's weights and vocabulary: the continued run's first loss
  is a trained module's, not a fresh one's, and its export keeps the vocabulary."""
  from jspec.drafters.mtp import checkpoint as mf
  data, _, _ = data_dir
  first, then = str(tmp_path / "a"), str(tmp_path / "b")
  _cli_train(target, data, monkeypatch, "--out", first, "--steps", "40", "--draft-vocab", "48")
  _cli_train(target, data, monkeypatch, "--out", then, "--steps", "6", "--init", first + "/head",
             "--draft-vocab", "48")                         # agreeing with the module is allowed
  a, b = train_log(first), train_log(then)
  assert a[-1]["loss"] < a[0]["loss"] - 0.5, (a[0]["loss"], a[-1]["loss"])
  assert b[0]["loss"] < (a[0]["loss"] + a[-1]["loss"]) / 2, (a[0]["loss"], a[-1]["loss"], b[0])
  x, y = mf.load_mtp(first + "/head"), mf.load_mtp(then + "/head")
  assert x.config == y.config and y.config.draft_vocab_size == 48
  np.testing.assert_array_equal(np.asarray(y.draft_to_target[...]),
                                np.asarray(x.draft_to_target[...]))


@pytest.mark.parametrize("argv, message", [
    (["--draft-vocab", "32"], "drop --draft-vocab 32 (the head has 60)"),
    (["--vocab-coverage", "0.9"], "drop --vocab-coverage"),
])
def test_init_refuses_flags_that_differ_from_the_module(target, data_dir, tmp_path, monkeypatch,
                                                        argv, message):
  from jspec.drafters.mtp import checkpoint as mf
  data, _, _ = data_dir
  head = str(tmp_path / "head")
  mf.save_mtp(mtp.init_module(target, IDS), head, dtype=jnp.float32, verifier="tiny")
  assert_init_refused(lambda out, *flags: _cli_train(target, data, monkeypatch, "--out", out,
                                                     "--steps", "2", *flags),
                      tmp_path, head, argv, message)


def test_init_from_a_module_of_another_target_is_refused(target, data_dir, tmp_path, monkeypatch):
  from jspec.drafters.mtp import checkpoint as mf
  data, _, _ = data_dir
  other = Llama(LlamaConfig.tiny(vocab_size=64, hidden_size=32, head_dim=8), rngs=nnx.Rngs(1))
  head = str(tmp_path / "other")
  mf.save_mtp(mtp.init_module(other, IDS), head, dtype=jnp.float32, verifier="tiny")
  with pytest.raises(SystemExit) as e:
    _cli_train(target, data, monkeypatch, "--out", str(tmp_path / "c"), "--steps", "6",
               "--init", head)
  assert "MTP module hidden size 32 differs" in str(e.value)
