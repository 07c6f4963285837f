"""DFlash and DSpark training on tiny configs: anchors are distinct, sorted and valid, the packed
attention equals a dense masked reference, the loss falls and the trained drafter accepts on its
training prompts, and a resumed run reproduces the uninterrupted one."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import SpecDecoder
from jspec.train import dflash, features, trainer
from models import Llama, LlamaConfig
from tests.jspec.train.mixed import check_mixed_matches_float32
from tests.jspec.train.shards import random_prompts, write_greedy_shards

CFG = LlamaConfig.tiny(vocab_size=64, num_layers=3)
SEQ = 48
IDS = np.arange(64)                # the whole vocabulary (the greedy replies repeat token 1)
KINDS = ("dflash", "dspark")


@pytest.fixture(scope="module")
def target():
  model = Llama(CFG, rngs=nnx.Rngs(0))
  model.embed.embedding[...] = model.embed.embedding[...] * 4.0   # peaked, repetitive greedy text
  return model


@pytest.fixture(scope="module")
def data_dir(target, tmp_path_factory):
  """Shards answered greedily by the tiny target and a feature cache with the drafters' taps."""
  d = tmp_path_factory.mktemp("dflash_data")
  prompts = random_prompts(48, CFG.vocab_size)
  write_greedy_shards(d, target, prompts)
  feats = str(d / "feats")
  taps = dflash.init_module(target, IDS, "dflash").config.taps
  features.cache_features(target, str(d), feats, taps=taps, batch_size=16,
                          progress=False)
  return str(d), feats, prompts


def test_anchors_are_distinct_sorted_and_valid():
  valid = jnp.asarray(np.random.default_rng(0).random((3, 40)) < 0.3).at[2].set(False)
  valid = valid.at[2, 7].set(True)
  anchors, used = dflash.sample_anchors(jax.random.key(1), valid, 6)
  for r in range(3):
    a = np.asarray(anchors[r])[np.asarray(used[r])]
    assert np.all(np.diff(a) > 0) and np.all(np.asarray(valid[r])[a])
    assert len(a) == min(6, int(valid[r].sum()))
  other, _ = dflash.sample_anchors(jax.random.key(2), valid, 6)
  assert not np.array_equal(anchors[:2], other[:2])              # a fresh draw per key


def test_packed_attention_equals_a_dense_masked_reference():
  rng = np.random.default_rng(1)
  b, n, m, bs, hq, kvh, dh = 2, 10, 3, 4, 4, 2, 8
  q = jnp.asarray(rng.normal(size=(b, m * bs, hq, dh)), jnp.float32)
  kc, vc = (jnp.asarray(rng.normal(size=(b, n, kvh, dh)), jnp.float32) for _ in range(2))
  kb, vb = (jnp.asarray(rng.normal(size=(b, m * bs, kvh, dh)), jnp.float32) for _ in range(2))
  anchors = jnp.asarray([[0, 4, 9], [2, 3, 7]], jnp.int32)
  got = dflash.packed_attend(q, kc, vc, kb, vb, anchors, bs)
  k = np.concatenate([kc, kb], 1).repeat(hq // kvh, 2)
  v = np.concatenate([vc, vb], 1).repeat(hq // kvh, 2)
  for r in range(b):
    for t in range(m * bs):
      j = t // bs
      see = np.concatenate([np.arange(n) < int(anchors[r, j]), np.arange(m * bs) // bs == j])
      s = np.einsum("hd,shd->hs", np.asarray(q[r, t]), k[r]) / np.sqrt(dh)
      s = np.where(see[None], s, -np.inf)
      p = np.exp(s - s.max(-1, keepdims=True))
      p /= p.sum(-1, keepdims=True)
      np.testing.assert_allclose(got[r, t], np.einsum("hs,shd->hd", p, v[r]), atol=1e-5)


def _config(**kw):
  base = dict(steps=40, batch_size=8, seq_len=SEQ, lr=3e-3, warmup=5, save_every=10,
              eval_every=20, holdout=8)
  base.update(kw)
  return trainer.TrainConfig(**base)


def _task(target, kind):
  return dflash.block_task(target, IDS, kind, num_layers=1, block_size=4, mask_token_id=1,
                           markov_rank=16, max_anchors=12)


@pytest.fixture(scope="module", params=KINDS)
def trained(request, target, data_dir, tmp_path_factory):
  data, feats, _ = data_dir
  task = _task(target, request.param)
  out = str(tmp_path_factory.mktemp("run") / request.param)
  history = trainer.train(task, data, out, _config(), progress=False, features=feats)
  return request.param, task, history, out


def test_training_lowers_loss_and_the_drafter_accepts(target, data_dir, trained):
  _, _, prompts = data_dir
  kind, task, history, _ = trained
  first = np.mean([r["loss"] for r in history[:5]])
  last = np.mean([r["loss"] for r in history[-5:]])
  assert last < 0.8 * first, (first, last)     # measured 0.59 (DFlash), 0.73 (DSpark)
  held = history[-1]["eval"]
  assert held["step_acc"][0] > 0.2 and held["al"] > 1.3, held
  if kind == "dspark":      # the confidence head learns the survival (1 - TV) it is fit to
    assert abs(history[-1]["confidence"][0] - history[-1]["survival"][0]) < 0.25
  cfg = {"method": kind, "num_speculative_tokens": 3 if kind == "dflash" else 4}
  spec = SpecDecoder(target, cfg, draft_model=task.module(task.params))
  out = spec.generate(prompts[:8], max_new_tokens=32, eos=False)
  assert out.acceptance_length > 1.25, out.acceptance_length   # measured 1.39 for both


def test_resume_reproduces_the_uninterrupted_run(target, data_dir, trained, tmp_path):
  """The finished run cut back to its step-20 checkpoint resumes into the same losses (the anchor
  draws are keyed by the batch, so they repeat too)."""
  data, feats, _ = data_dir
  kind, _, whole, out = trained
  run = str(tmp_path / "cut")
  shutil.copytree(out, run)
  ckpts = os.path.join(run, "checkpoints")
  for step in (30, 40):
    shutil.rmtree(os.path.join(ckpts, str(step)))
  resumed = trainer.train(_task(target, kind), data, run, _config(), progress=False,
                          stop_after=3, features=feats)
  assert [r["step"] for r in resumed] == [21, 22, 23]
  np.testing.assert_allclose([r["loss"] for r in resumed], [r["loss"] for r in whole[20:23]],
                             atol=1e-5, rtol=0)


def test_bad_settings_fail_early(target):
  with pytest.raises(ValueError, match="gamma .* must be > 0"):
    dflash.block_task(target, IDS, "dflash", gamma=0.0)
  with pytest.raises(ValueError, match="kind must be 'dflash' or 'dspark'"):
    dflash.block_task(target, IDS, "eagle")
  with pytest.raises(ValueError, match="block_size must be >= 2"):
    dflash.block_task(target, IDS, "dflash", block_size=1)


@pytest.mark.parametrize("kind", KINDS)
def test_mixed_precision_training_matches_float32_and_keeps_float32_results(target, data_dir,
                                                                            kind):
  from jspec.train.loader import heldout_batches
  data, feats = data_dir[0], data_dir[1]
  batch = {k: jnp.asarray(v) for k, v in heldout_batches(data, seq_len=SEQ, batch_size=4,
                                                         holdout=8, features=feats)[0].items()}
  check_mixed_matches_float32(
      lambda dt: dflash.block_task(target, IDS, kind, max_anchors=8, seed=2, compute_dtype=dt),
      batch, min_products=12)


def _cli_train(kind, target, data, monkeypatch, *argv):
  """`jspec train dflash | dspark` on the tiny target (the loader returns it)."""
  from tests.jspec.train.cli_run import cli_train
  cli_train(kind, target, data, monkeypatch, "--max-anchors", "12", *argv, lr="3e-3")


@pytest.mark.parametrize("kind", KINDS)
def test_init_continues_from_an_exported_head(target, data_dir, tmp_path, monkeypatch, kind):
  """`--init HEAD` starts from the head's weights, shape, vocabulary and MASK token: the continued
  run's first loss is a trained head's, not a fresh one's, and its export keeps the config."""
  from jspec.drafters.dflash import checkpoint as fmt
  from tests.jspec.train.cli_run import train_log
  data, feats, _ = data_dir
  first, then = str(tmp_path / "a"), str(tmp_path / "b")
  shape = ["--block-size", "4", "--draft-vocab", "48", "--mask-token", "1"] + (
      ["--markov-rank", "16"] if kind == "dspark" else [])
  _cli_train(kind, target, data, monkeypatch, "--out", first, "--steps", "40",
             "--features", feats, *shape)
  _cli_train(kind, target, data, monkeypatch, "--out", then, "--steps", "6", "--features", feats,
             "--init", first + "/head", "--block-size", "4")    # agreeing is allowed
  a, b = train_log(first), train_log(then)
  assert a[-1]["loss"] < 0.8 * a[0]["loss"], (a[0]["loss"], a[-1]["loss"])
  assert b[0]["loss"] < (a[0]["loss"] + a[-1]["loss"]) / 2, (a[0]["loss"], a[-1]["loss"], b[0])
  x, y = fmt.load(first + "/head", kind), fmt.load(then + "/head", kind)
  assert x.config == y.config and y.config.block_size == 4 and y.config.draft_vocab_size == 48
  ids = lambda m: np.asarray((m.backbone if kind == "dspark" else m).draft_to_target[...])
  np.testing.assert_array_equal(ids(x), ids(y))


@pytest.mark.parametrize("argv, message", [
    (["--block-size", "3"], "drop --block-size 3 (the head has 8)"),
    (["--draft-vocab", "32"], "drop --draft-vocab 32 (the head has 64)"),
    (["--sliding-window", "16"], "drop --sliding-window 16 (the head has 0)"),
    (["--taps", "1,2,3"], "drop --taps 1,2,3"),
    (["--mask-token", "5"], "drop --mask-token 5 (the head has 1)"),
    (["--markov-rank", "8"], "drop --markov-rank 8 (the head has 256)"),
    (["--vocab-coverage", "0.9"], "drop --vocab-coverage"),
])
def test_init_refuses_flags_that_differ_from_the_head(target, data_dir, tmp_path, monkeypatch,
                                                      argv, message):
  from jspec.drafters.dflash import checkpoint as fmt
  data, _, _ = data_dir
  head = str(tmp_path / "head")
  fmt.save(dflash.init_module(target, IDS, "dspark", mask_token_id=1), head, dtype=jnp.float32,
           verifier="tiny")
  with pytest.raises(SystemExit) as e:
    _cli_train("dspark", target, data, monkeypatch, "--out", str(tmp_path / "c"), "--steps", "2",
               "--init", head, *argv)
  assert message in str(e.value)
  assert not os.path.exists(tmp_path / "c")        # refused before anything was written
  with pytest.raises(SystemExit) as e:             # a head of the other kind
    _cli_train("dflash", target, data, monkeypatch, "--out", str(tmp_path / "d"), "--steps", "2",
               "--init", head)
  assert "not 'dflash'" in str(e.value)


def test_init_from_a_head_of_another_target_is_refused(target, data_dir, tmp_path, monkeypatch):
  from jspec.drafters.dflash import checkpoint as fmt
  data, feats, _ = data_dir
  other = Llama(LlamaConfig.tiny(vocab_size=64, hidden_size=32, head_dim=8, num_layers=3),
                rngs=nnx.Rngs(1))
  head = str(tmp_path / "other")
  fmt.save(dflash.init_module(other, IDS, "dflash", mask_token_id=1), head, dtype=jnp.float32,
           verifier="tiny")
  with pytest.raises(SystemExit) as e:
    _cli_train("dflash", target, data, monkeypatch, "--out", str(tmp_path / "c"), "--steps", "6",
               "--features", feats, "--init", head)
  assert "was trained for another target (hidden 32" in str(e.value)
