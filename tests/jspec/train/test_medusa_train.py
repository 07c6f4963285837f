"""Medusa training on tiny configs: the loss against a per-position reference, the loss falls and
the trained heads accept on their own training prompts (speculative output equal to plain), a
resumed run reproduces the uninterrupted one, and a feature cache's last slot serves."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, SpecDecoder
from jspec.train import eagle3, medusa, trainer
from tests.jspec.train.cli_run import assert_init_refused, cli_train, train_log
from tests.jspec.train.shards import random_prompts, write_greedy_shards
from models import Llama, LlamaConfig

CFG = LlamaConfig.tiny(vocab_size=64, num_layers=3)


@pytest.fixture(scope="module")
def target():
  model = Llama(CFG, rngs=nnx.Rngs(0))
  model.embed.embedding[...] = model.embed.embedding[...] * 4.0   # peaked, repetitive greedy text
  return model


def _prompts(n, seed=0):
  return random_prompts(n, CFG.vocab_size, seed)


@pytest.fixture(scope="module")
def data_dir(target, tmp_path_factory):
  """Shards in `jspec train data`'s format: prompts answered greedily by the tiny target."""
  d = tmp_path_factory.mktemp("medusa_data")
  prompts = _prompts(40)
  write_greedy_shards(d, target, prompts)
  return str(d), prompts


IDS = eagle3.draft_vocab(np.arange(CFG.vocab_size)[::-1].copy(), 56)     # ids 0..55


@pytest.mark.parametrize("max_anchors", [16, None])
def test_loss_matches_a_per_position_reference(target, max_anchors):
  head = medusa.init_head(target, IDS, num_heads=3)
  head.res_bias[...] = jax.random.normal(jax.random.key(1), head.res_bias[...].shape)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 64, (2, 16)), jnp.int32)
  mask = jnp.asarray(np.arange(16)[None] >= np.asarray([[4], [7]]), jnp.int32)
  length = jnp.asarray([16, 12])
  hidden = jax.jit(lambda t: medusa.final_hidden(target, t))(tokens)
  loss, m = jax.jit(lambda h, t, lm, n: medusa.medusa_loss(
      head, h, t, lm, n, decay=0.5, max_anchors=max_anchors))(hidden, tokens, mask, length)
  logp = np.asarray(jax.nn.log_softmax(head(hidden), -1))                 # [B, N, K, Vd]
  label = lambda b, t, k: (t + k + 2 < int(length[b]) and bool(mask[b, t + k + 2])
                           and int(tokens[b, t + k + 2]) < 56)
  # positions labelled for some head; the default computes only the first N/2 of them per row
  anchors = [[t for t in range(16) if any(label(b, t, k) for k in range(3))][:max_anchors or 8]
             for b in range(2)]
  want = []
  for k in range(3):
    ce = [-logp[b, t, k, int(tokens[b, t + k + 2])] for b in range(2) for t in anchors[b]
          if label(b, t, k)]
    want.append(np.mean(ce))
    assert m["step_count"][k] == len(ce)
  np.testing.assert_allclose(m["step_loss"], want, rtol=1e-5)
  np.testing.assert_allclose(loss, sum(0.5 ** k * w for k, w in enumerate(want)), rtol=1e-5)


def _config(**kw):
  base = dict(steps=60, batch_size=8, seq_len=64, lr=3e-3, warmup=5, save_every=20,
              eval_every=30, holdout=8)
  base.update(kw)
  return trainer.TrainConfig(**base)


@pytest.mark.parametrize("lm_head", ["own", "target"])
def test_training_lowers_loss_and_the_heads_accept(target, data_dir, tmp_path, lm_head):
  data, prompts = data_dir
  task = medusa.medusa_task(target, IDS, num_heads=3, lm_head=lm_head)
  history = trainer.train(task, data, str(tmp_path / "run"), _config(lr=1e-2), progress=False)
  if lm_head == "target":      # the shared rows stay the target's: only the ResBlocks train
    trained = task.module(task.params)
    np.testing.assert_array_equal(trained.lm_head.rows[...], target.head_rows(jnp.asarray(IDS)))
  first, last = np.mean([r["loss"] for r in history[:5]]), np.mean([r["loss"] for r in history[-5:]])
  assert last < first - 1.0, (first, last)
  held = history[-1]["eval"]
  assert held["al"] > 1.5 and min(held["step_acc"]) > 0.3, held        # held-out greedy estimate
  spec = lambda head: SpecDecoder(target, {"method": "medusa", "num_speculative_tokens": 3},
                                  draft_model=head)
  out = spec(task.module(task.params)).generate(prompts[:8], max_new_tokens=32, eos=False)
  base = spec(medusa.init_head(target, IDS, num_heads=3, lm_head=lm_head)).generate(
      prompts[:8], max_new_tokens=32, eos=False)
  # frozen shared rows leave the tiny heads less to learn with (ResBlocks only)
  floor, gain = (1.5, 0.3) if lm_head == "own" else (1.4, 0.15)
  assert out.acceptance_length > floor and out.acceptance_length > base.acceptance_length + gain, \
      (out.acceptance_length, base.acceptance_length)
  assert out.token_ids == Decoder(target).generate(prompts[:8], max_new_tokens=32,
                                                   eos=False).token_ids


def test_resume_continues_from_the_checkpoint(target, data_dir, tmp_path):
  data, _ = data_dir
  cfg = _config(steps=8, save_every=3, eval_every=100)
  whole = trainer.train(medusa.medusa_task(target, IDS), data, str(tmp_path / "a"), cfg,
                        progress=False)
  part1 = trainer.train(medusa.medusa_task(target, IDS), data, str(tmp_path / "b"), cfg,
                        progress=False, stop_after=4)      # stops between two periodic saves
  part2 = trainer.train(medusa.medusa_task(target, IDS), data, str(tmp_path / "b"), cfg,
                        progress=False)                    # resumes from the step-4 checkpoint
  assert [r["step"] for r in part1 + part2] == list(range(1, 9))
  np.testing.assert_allclose([r["loss"] for r in part1 + part2], [r["loss"] for r in whole],
                             atol=1e-5, rtol=0)
  with pytest.raises(ValueError, match="checkpoints of another run"):
    trainer.train(medusa.medusa_task(target, IDS, num_heads=2), data, str(tmp_path / "b"), cfg,
                  progress=False)


def test_feature_cache_last_slot_serves(target, data_dir, tmp_path):
  """An EAGLE-3 cache (taps + final hidden) is reused as is; its last slot is the target's final
  normed hidden state."""
  from jspec.train import features
  from jspec.train.shards import TokenShards
  data, _ = data_dir
  folder = str(tmp_path / "feats")
  features.cache_features(target, data, folder, taps=(1, 2), batch_size=16,
                          progress=False)
  features.last_slot_features(target, data, folder, progress=False)   # reused, no error
  cached = features.FeatureShards(data, 64, folder)
  for i in (0, 23):
    item = TokenShards(data, 64)[i]
    n = int(item["length"])
    want = medusa.final_hidden(target, jnp.asarray(item["tokens"][None, :n]))
    got = medusa.final_hidden(target, None, jnp.asarray(cached[i]["feats"][None, :n]))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * float(jnp.abs(want).max()))
  fresh = str(tmp_path / "fresh")                      # no cache yet: the final hidden only
  features.last_slot_features(target, data, fresh, progress=False)
  item = features.FeatureShards(data, 64, fresh)[23]
  assert item["feats"].shape == (64, 1, CFG.hidden_size)
  np.testing.assert_array_equal(item["feats"][:, 0], cached[23]["feats"][:, -1])


def _cli_train(target, data, monkeypatch, *argv):
  """`jspec train medusa` on the tiny target (the loader returns it)."""
  cli_train("medusa", target, data, monkeypatch, *argv, lr="1e-2")


@pytest.mark.parametrize("lm_head", ["own", "target"])
def test_init_continues_from_exported_heads(target, data_dir, tmp_path, monkeypatch, lm_head):
  """`--init HEAD` starts from the heads' weights, shape and vocabulary: the continued run's
  first loss is a trained head's, not a fresh one's, and its export keeps shape and vocabulary."""
  from jspec.drafters.medusa import checkpoint as mf
  data, _ = data_dir
  first, then = str(tmp_path / "a"), str(tmp_path / "b")
  _cli_train(target, data, monkeypatch, "--out", first, "--steps", "40", "--draft-vocab", "48",
             "--num-heads", "3", "--lm-head", lm_head)
  _cli_train(target, data, monkeypatch, "--out", then, "--steps", "6", "--init", first + "/head",
             "--num-heads", "3")                           # agreeing with the head is allowed
  a, b = train_log(first), train_log(then)
  assert a[-1]["loss"] < a[0]["loss"] - 1.0, (a[0]["loss"], a[-1]["loss"])
  assert b[0]["loss"] < (a[0]["loss"] + a[-1]["loss"]) / 2, (a[0]["loss"], a[-1]["loss"], b[0])
  x, y = mf.load_medusa(first + "/head"), mf.load_medusa(then + "/head")
  assert x.config == y.config and y.config.lm_head == lm_head and y.config.num_heads == 3
  np.testing.assert_array_equal(np.asarray(y.draft_to_target[...]),
                                np.asarray(x.draft_to_target[...]))


@pytest.mark.parametrize("argv, message", [
    (["--num-heads", "2"], "drop --num-heads 2 (the head has 4)"),
    (["--draft-vocab", "32"], "drop --draft-vocab 32 (the head has 56)"),
    (["--lm-head", "target"], "drop --lm-head target (the head has own)"),
    (["--vocab-coverage", "0.9"], "drop --vocab-coverage"),
])
def test_init_refuses_flags_that_differ_from_the_head(target, data_dir, tmp_path, monkeypatch,
                                                      argv, message):
  from jspec.drafters.medusa import checkpoint as mf
  data, _ = data_dir
  head = str(tmp_path / "head")
  mf.save_medusa(medusa.init_head(target, IDS), head, dtype=jnp.float32, verifier="tiny")
  assert_init_refused(lambda out, *flags: _cli_train(target, data, monkeypatch, "--out", out,
                                                     "--steps", "2", *flags),
                      tmp_path, head, argv, message)


def test_init_from_heads_of_another_target_is_refused(target, data_dir, tmp_path, monkeypatch):
  from jspec.drafters.medusa import checkpoint as mf
  data, _ = data_dir
  other = Llama(LlamaConfig.tiny(vocab_size=64, hidden_size=32, head_dim=8), rngs=nnx.Rngs(1))
  head = str(tmp_path / "other")
  mf.save_medusa(medusa.init_head(other, IDS), head, dtype=jnp.float32, verifier="tiny")
  with pytest.raises(SystemExit) as e:
    _cli_train(target, data, monkeypatch, "--out", str(tmp_path / "c"), "--steps", "6",
               "--init", head)
  assert "was trained for another target (hidden 32" in str(e.value)
