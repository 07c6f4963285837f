"""EAGLE-3 training on tiny configs: TTT attention equals the drafting path it simulates, the loss
falls and the trained head accepts on its own training prompts, a resumed run reproduces the
uninterrupted loss curve, the speculators export round-trips, and bad heads fail early."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, SpecDecoder, count_compiles
from jspec.drafters.eagle3 import checkpoint as sf
from jspec.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head
from jspec.drafters.shared import cache_attend
from jspec.train import eagle3, trainer
from tests.jspec.train.cli_run import cli_train, train_log
from tests.jspec.train.mixed import check_mixed_matches_float32
from tests.jspec.train.packed import check_packed_equals_apart
from tests.jspec.train.shards import random_prompts, write_greedy_shards
from models import KVCache, Llama, LlamaConfig

CFG = LlamaConfig.tiny(vocab_size=64, num_layers=4)


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
  d = tmp_path_factory.mktemp("eagle3_data")
  prompts = _prompts(48)
  write_greedy_shards(d, target, prompts)
  return str(d), prompts


def test_ttt_attention_equals_the_drafting_path(target):
  """TTT step j at anchor t must see exactly what drafting token t+2+j sees: step-0 K/V at
  positions <= t (the target's features) plus the head's own K/V at t+1 .. t+j."""
  head = Eagle3Head(Eagle3Config.for_target(CFG, draft_vocab_size=50), rngs=nnx.Rngs(3))
  head.draft_to_target[...] = jnp.arange(50, dtype=jnp.int32) + 7
  n, steps = 12, 3
  tokens = jnp.asarray(_prompts(1, 5)[0] * 3, jnp.int32)[None, :n]
  feats = eagle3.target_features(target, tokens, head.config.taps,
                                 head.draft_to_target[...])
  embed = target.embed.embedding[...]
  anchors = jnp.asarray([[0, 4, 7]], jnp.int32)
  outs = [head.draft_logits(a) for a in eagle3.ttt_forward(head, embed, feats.taps, tokens,
                                                            anchors, steps)]
  drafter = Eagle3Drafter(None, steps, head.config.taps, attention_impl="reference")
  for i, t in enumerate((0, 4, 7)):
    cache = KVCache.init(head.config.layer_config(), 1, 32)
    cache, feat, logits = drafter._catch_up(
        head, embed, cache, tuple(x[:, :t + 1] for x in feats.taps), tokens[:, 1:t + 2],
        jnp.zeros((1,), jnp.int32), jnp.asarray([t + 1]))
    np.testing.assert_allclose(logits, outs[0][:, i], atol=2e-5)
    for j in range(1, steps):
      a, cache = head.layer(feat[:, None], embed[tokens[:, t + 1 + j]][:, None],
                            cache.lengths[:, None], cache_attend(cache, "reference"))
      cache = cache.with_lengths(cache.lengths + 1)
      feat = a[:, 0]
      np.testing.assert_allclose(head.draft_logits(feat), outs[j][:, i], atol=2e-5)


def _config(**kw):
  base = dict(steps=60, batch_size=8, seq_len=64, lr=3e-3, warmup=5, save_every=20,
              eval_every=20, holdout=8)
  base.update(kw)
  return trainer.TrainConfig(**base)


def test_training_lowers_loss_and_the_head_accepts(target, data_dir, tmp_path):
  data, prompts = data_dir
  ids = eagle3.draft_vocab(np.arange(CFG.vocab_size)[::-1].copy(), 56)
  task = eagle3.eagle3_task(target, ids, ttt_steps=3)
  history = trainer.train(task, data, str(tmp_path / "run"), _config(), progress=False)
  first, last = np.mean([r["loss"] for r in history[:5]]), np.mean([r["loss"] for r in history[-5:]])
  assert last < first - 1.0, (first, last)
  assert history[-1]["eval"]["al"] > 1.5                 # the held-out greedy estimate
  head = task.module(task.params)
  spec = SpecDecoder(target, {"method": "eagle3", "num_speculative_tokens": 3}, draft_model=head)
  out = spec.generate(prompts[:8], max_new_tokens=32, eos=False)
  untrained = SpecDecoder(target, {"method": "eagle3", "num_speculative_tokens": 3},
                          draft_model=eagle3.init_head(target, ids, seed=1))
  base = untrained.generate(prompts[:8], max_new_tokens=32, eos=False)
  assert out.acceptance_length > 1.5 and out.acceptance_length > base.acceptance_length + 0.3, \
      (out.acceptance_length, base.acceptance_length)
  assert out.token_ids == Decoder(target).generate(prompts[:8], max_new_tokens=32,
                                                   eos=False).token_ids
  # the teacher-forced replay reproduces the decoder's rounds and acceptance exactly
  from jspec.train.replay import replay_prompts
  predict = eagle3.draft_predictor(head, target, 3)
  replayed = replay_prompts([("ab"[i % 2], p) for i, p in enumerate(prompts[:8])], out.token_ids,
                            predict, bucket=16)   # padded past each sequence: causal, no effect
  # the weights are arguments of the compiled program, not constants baked into it (which took
  # gigabytes per padded length on the default model): its text is smaller than the weights
  weights = sum(x.size for x in jax.tree.leaves(nnx.state((head, target))))
  assert len(predict.func.lower(*predict.args, jnp.zeros((1, 16), jnp.int32)).as_text()) < weights
  total = replayed["all"]
  assert replayed["a"].rounds + replayed["b"].rounds == total.rounds
  assert (total.rounds, total.emitted) == (out.rounds, out.emitted)
  # a row's last round, cut by the budget, may accept drafts past the reply (unknown to replay)
  gap = np.asarray(out.accepted_at) - total.accepted_at
  assert (gap >= 0).all() and (gap <= 8).all() and total.accepted_at.sum() > 30, gap


def test_resume_reproduces_the_uninterrupted_run(target, data_dir, tmp_path):
  data, _ = data_dir
  ids = eagle3.draft_vocab(np.ones(CFG.vocab_size, np.int64), 48)
  cfg = _config(steps=24, save_every=5)
  whole = trainer.train(eagle3.eagle3_task(target, ids), data, str(tmp_path / "a"), cfg,
                        progress=False)
  part1 = trainer.train(eagle3.eagle3_task(target, ids), data, str(tmp_path / "b"), cfg,
                        progress=False, stop_after=13)     # stops between two periodic saves
  part2 = trainer.train(eagle3.eagle3_task(target, ids), data, str(tmp_path / "b"), cfg,
                        progress=False)
  assert [r["step"] for r in part1 + part2] == list(range(1, 25))
  np.testing.assert_allclose([r["loss"] for r in part1 + part2], [r["loss"] for r in whole],
                             atol=1e-5, rtol=0)
  ckpts = sorted(os.listdir(tmp_path / "b" / "checkpoints"))
  assert len([c for c in ckpts if c.isdigit()]) <= cfg.keep
  with pytest.raises(ValueError, match="checkpoints of another run"):
    trainer.train(eagle3.eagle3_task(target, ids, ttt_steps=2), data, str(tmp_path / "b"),
                  _config(steps=30, save_every=5), progress=False)


def test_a_run_from_before_a_new_setting_resumes_at_its_default(target, data_dir, tmp_path):
  """A checkpoint whose saved config predates a TrainConfig field resumes when the field is at
  its default, and is refused when it is not."""
  data, _ = data_dir
  ids = eagle3.draft_vocab(np.ones(CFG.vocab_size, np.int64), 48)
  out = tmp_path / "old"
  trainer.train(eagle3.eagle3_task(target, ids), data, str(out), _config(steps=10, save_every=5),
                progress=False, stop_after=5)
  path = out / "checkpoints" / "5" / "meta" / "metadata"
  meta = json.loads(path.read_text())
  del meta["config"]["pack"], meta["config"]["reply_windows"]
  path.write_text(json.dumps(meta))
  with pytest.raises(ValueError, match=r"differs in \['config'\]"):
    trainer.train(eagle3.eagle3_task(target, ids), data, str(out),
                  _config(steps=10, save_every=5, reply_windows=True), progress=False)
  later = trainer.train(eagle3.eagle3_task(target, ids), data, str(out),
                        _config(steps=10, save_every=5), progress=False, stop_after=1)
  assert [r["step"] for r in later] == [6]


def test_draft_vocab_is_the_most_frequent_sorted():
  counts = np.asarray([5, 9, 0, 9, 1, 7])
  assert eagle3.draft_vocab(counts, 3).tolist() == [1, 3, 5]
  with pytest.raises(ValueError, match=r"draft vocabulary size must be in \[1, 6\]"):
    eagle3.draft_vocab(counts, 7)


@pytest.fixture
def saved_head(target, tmp_path):
  head = eagle3.init_head(target, np.arange(3, 60, 2), seed=4)
  folder = str(tmp_path / "head")
  sf.save_eagle3(head, folder, dtype=jnp.float32, verifier="tiny")
  return head, folder


def test_size_for_coverage_is_the_smallest_multiple_that_covers():
  rng = np.random.default_rng(0)
  ranking = rng.zipf(1.3, 2000).astype(np.int64)
  check = rng.poisson(ranking / 3.0)
  for target in (0.5, 0.9, 0.97, 1.0):
    size, reached = eagle3.size_for_coverage(ranking, check, target, multiple=64)
    cov = lambda n: check[eagle3.draft_vocab(ranking, n)].sum() / check.sum()
    assert size % 64 == 0 or size == 2000
    assert cov(size) >= target - 1e-9 and abs(reached - cov(size)) < 1e-9
    assert size == 64 or cov(size - 64) < target     # brute force: no smaller multiple covers
  with pytest.raises(ValueError, match="coverage"):
    eagle3.size_for_coverage(ranking, check, 1.5)


def test_speculators_export_round_trips(saved_head):
  head, folder = saved_head
  cfg = json.load(open(os.path.join(folder, "config.json")))
  assert cfg["speculators_model_type"] == "eagle3"
  assert cfg["eagle_aux_hidden_state_layer_ids"] == list(head.config.taps)
  from safetensors.numpy import load_file
  w = load_file(os.path.join(folder, "model.safetensors"))
  assert w["fc.weight"].shape == (CFG.hidden_size, 3 * CFG.hidden_size)          # [out, in]
  assert w["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * CFG.hidden_size
  ids = np.arange(3, 60, 2)
  np.testing.assert_array_equal(w["d2t"] + np.arange(len(ids)), ids)
  assert w["t2d"].sum() == len(ids) and w["t2d"][ids].all()
  assert "embed_tokens.weight" not in w                 # the target's embedding is never copied
  loaded = sf.load_eagle3(folder)
  for a, b in zip(jax.tree_util.tree_leaves(nnx.state(head)),
                  jax.tree_util.tree_leaves(nnx.state(loaded))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


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
    key = {"hidden": "hidden_size", "vocab": "vocab_size"}[how]
    cfg["transformer_layer_config"][key] *= 2
    open(c, "w").write(json.dumps(cfg))
    os.remove(os.path.join(folder, "checksums.json"))


@pytest.mark.parametrize("how, message", [
    ("missing", "model.safetensors is missing"),
    ("checksum", "has sha256 .* expected"),
    ("hidden", "hidden size 128 differs from the target's 64|has shape"),
    ("vocab", "vocabulary 128 differs from the target's 64"),
])
def test_bad_head_fails_before_compiling(target, saved_head, how, message):
  _, folder = saved_head
  _corrupt(folder, how)
  with count_compiles() as c:
    with pytest.raises(ValueError, match=message):
      SpecDecoder(target, {"method": "eagle3", "num_speculative_tokens": 2, "head": folder})
  assert c.count == 0


def test_eagle3_never_recompiles_after_warmup(target, saved_head):
  _, folder = saved_head
  spec = SpecDecoder(target, {"method": "eagle3", "num_speculative_tokens": 3, "head": folder})
  kw = dict(max_new_tokens=60, temperature=[0.0, 1.0], eos=False)
  spec.generate(_prompts(2, 1), **kw)
  with count_compiles() as c:
    out = spec.generate(_prompts(2, 2), seed=3, **kw)
  assert c.count == 0 and out.rounds > 20


def test_feature_cache_matches_the_target_pass_and_trains(target, data_dir, tmp_path):
  from jspec.train import features
  from jspec.train.shards import TokenShards
  data, _ = data_dir
  taps = (1, 2, 3)
  folder = str(tmp_path / "feats")
  features.cache_features(target, data, folder, taps=taps, batch_size=16,
                          progress=False)
  cached = features.FeatureShards(data, 64, folder)
  ids = jnp.arange(0, 64, 2, dtype=jnp.int32)
  for i in (0, 17, 47):
    item = TokenShards(data, 64)[i]
    n = int(item["length"])
    want = eagle3.target_features(target, jnp.asarray(item["tokens"][None, :n]), taps, ids)
    got = eagle3.target_features(target, None, taps, ids,
                                 jnp.asarray(cached[i]["feats"][None, :n]))
    for a, b in zip(want.taps + (want.target_logits,), got.taps + (got.target_logits,)):
      np.testing.assert_allclose(b, a, rtol=2e-2, atol=2e-2 * float(jnp.abs(a).max()))
  short = features.FeatureShards(data, 16, folder)      # the same cache read as later windows
  i = max(range(len(short)), key=lambda j: len(short.sequence(j)[0]))
  for start in (0, 7, len(short.sequence(i)[0]) - 16):
    w, whole = short.window(i, start, 0, 10**9), cached[i]
    assert np.array_equal(w["tokens"], whole["tokens"][start:start + 16])
    assert np.array_equal(w["feats"], whole["feats"][start:start + 16])
  meta = json.load(open(os.path.join(folder, "features.json")))
  with open(os.path.join(folder, "features.json"), "w") as f:   # a cache of the older format
    json.dump({k: v for k, v in meta.items() if k != "format"} | {"seq_len": 64}, f)
  with pytest.raises(ValueError, match="older format.*rebuild"):
    features.FeatureShards(data, 64, folder)
  with open(os.path.join(folder, "features.json"), "w") as f:
    json.dump(meta, f)
  ids = eagle3.draft_vocab(np.ones(CFG.vocab_size, np.int64), 48)
  task = eagle3.eagle3_task(target, ids, taps=taps)
  history = trainer.train(task, data, str(tmp_path / "run"), _config(steps=30, reply_windows=True),
                          progress=False, features=folder)      # windows read from the cache
  assert np.mean([r["loss"] for r in history[-5:]]) < np.mean([r["loss"] for r in history[:5]]) - 1


def test_target_lm_head_is_frozen_unsaved_and_drafts_like_the_same_rows_owned(target, data_dir,
                                                                            tmp_path):
  """lm_head="target": the rows are the target's (not trained, not saved); a head drafting with
  them proposes exactly what the same head with those rows as its own LM head proposes."""
  data, prompts = data_dir
  ids = np.arange(3, 60, 2)
  task = eagle3.eagle3_task(target, ids, ttt_steps=2, lm_head="target")
  assert "lm_head" not in nnx.to_pure_dict(task.params)          # never trained
  history = trainer.train(task, data, str(tmp_path / "run"), _config(steps=20), progress=False)
  assert np.mean([r["loss"] for r in history[-5:]]) < np.mean([r["loss"] for r in history[:5]])
  shared = task.module(task.params)
  np.testing.assert_array_equal(shared.lm_head.rows[...], target.head_rows(jnp.asarray(ids)))
  folder = str(tmp_path / "head")
  sf.save_eagle3(shared, folder, dtype=jnp.float32)
  from safetensors.numpy import load_file
  assert "lm_head.weight" not in load_file(os.path.join(folder, "model.safetensors"))
  assert json.load(open(os.path.join(folder, "config.json")))[sf.LM_HEAD_KEY] == "target"
  loaded = sf.load_eagle3(folder)
  assert loaded.config == shared.config
  # the same head owning the rows as its LM head
  owned = eagle3.init_head(target, ids, seed=9)
  for name in ("fc", "q_proj", "k_proj", "v_proj", "o_proj", "mlp", "input_layernorm",
               "hidden_norm", "post_attention_layernorm", "norm"):
    nnx.update(getattr(owned, name), nnx.state(getattr(shared, name)))
  owned.lm_head.kernel[...] = target.head_rows(jnp.asarray(ids)).T
  kw = dict(max_new_tokens=24, eos=False)
  cfg = {"method": "eagle3", "num_speculative_tokens": 3}
  a = SpecDecoder(target, dict(cfg, head=folder)).generate(prompts[:4], **kw)
  b = SpecDecoder(target, cfg, draft_model=owned).generate(prompts[:4], **kw)
  assert a.token_ids == b.token_ids == Decoder(target).generate(prompts[:4], **kw).token_ids
  assert a.accepted_at == b.accepted_at and a.rounds == b.rounds


def test_unknown_lm_head_kind_fails_on_load(target, saved_head):
  _, folder = saved_head
  c = os.path.join(folder, "config.json")
  cfg = json.load(open(c))
  cfg[sf.LM_HEAD_KEY] = "tied"
  open(c, "w").write(json.dumps(cfg))
  os.remove(os.path.join(folder, "checksums.json"))
  with pytest.raises(ValueError, match="jspec_lm_head is 'tied'"):
    SpecDecoder(target, {"method": "eagle3", "num_speculative_tokens": 2, "head": folder})


def test_replay_counts_rounds_by_hand():
  """Reply tokens 3.. after a 2-token prompt; D = 2. Anchor 1 drafts positions 3, 4."""
  from jspec.train.replay import replay_greedy
  tokens = np.asarray([9, 9, 5, 6, 7, 8, 1, 2, 3])
  preds = np.full((2, 9), -1)
  preds[:, 1] = [6, 7]          # round 1 at anchor 1: both accepted -> emits 3 (6, 7, bonus 8)
  preds[:, 4] = [0, 0]          # round 2 at anchor 4: none accepted -> emits 1 (token 1 at 6)
  preds[:, 5] = [2, 0]          # round 3 at anchor 5: one accepted -> emits 2 (2, bonus 3)
  r = replay_greedy(preds, tokens, 2, 9)
  assert (r.rounds, r.emitted, r.accepted_at.tolist()) == (3, 6, [2, 1])
  r = replay_greedy(preds, tokens, 2, 5)             # the budget cuts round 1 short
  assert (r.rounds, r.emitted) == (1, 2)
  with pytest.raises(ValueError, match="prompt_len"):
    replay_greedy(preds, tokens, 0, 9)


@pytest.mark.parametrize("argv, message", [
    (["--num-draft", "0"], "--num-draft must be >= 1"),
    (["--max-new-tokens", "1"], "--max-new-tokens must be >= 2"),
    (["--prompts", "/nonexistent/suite.jsonl"], "suite.jsonl"),
])
def test_replay_cli_errors_name_the_problem(tmp_path, argv, message):
  from jspec.cli import main
  base = {"--head": str(tmp_path), "--prompts": "benchmarks/prompts/suite.jsonl"}
  base.update(dict(zip(argv[::2], argv[1::2])))
  with pytest.raises(SystemExit) as e:
    main(["train", "replay"] + [x for kv in base.items() for x in kv])
  assert message in str(e.value)


def _cli_train(target, data, monkeypatch, *argv):
  """`jspec train eagle3` on the tiny target (the loader returns it)."""
  cli_train("eagle3", target, data, monkeypatch, *argv)


def test_init_continues_from_an_exported_head(target, data_dir, tmp_path, monkeypatch):
  """`--init HEAD` starts from the head's weights and vocabulary: the continued run's first loss
  is a trained head's, not a fresh one's, and its export keeps the head's vocabulary."""
  data, _ = data_dir
  first = str(tmp_path / "a")
  _cli_train(target, data, monkeypatch, "--out", first, "--steps", "40", "--draft-vocab", "48")
  then = str(tmp_path / "b")
  _cli_train(target, data, monkeypatch, "--out", then, "--steps", "6", "--init", first + "/head")
  a, b = train_log(first), train_log(then)
  assert a[-1]["loss"] < a[0]["loss"] - 1.0, (a[0]["loss"], a[-1]["loss"])
  assert b[0]["loss"] < (a[0]["loss"] + a[-1]["loss"]) / 2, (a[0]["loss"], a[-1]["loss"], b[0])
  vocab = lambda f: np.asarray(sf.load_eagle3(f).draft_to_target[...])
  np.testing.assert_array_equal(vocab(then + "/head"), vocab(first + "/head"))


@pytest.mark.parametrize("argv, message", [
    (["--taps", "0,1,2"], "--init takes the taps and draft vocabulary from the head; drop --taps"),
    (["--draft-vocab", "32"], "drop --draft-vocab"),
    (["--lm-head", "target"], "has lm_head='own'; pass --lm-head own"),
])
def test_init_refuses_flags_the_head_fixes(target, data_dir, saved_head, tmp_path, monkeypatch,
                                           argv, message):
  data, _ = data_dir
  with pytest.raises(SystemExit) as e:
    _cli_train(target, data, monkeypatch, "--out", str(tmp_path / "c"), "--steps", "2",
               "--init", saved_head[1], *argv)
  assert message in str(e.value)
  assert not os.path.exists(tmp_path / "c")        # refused before anything was written


def test_init_from_a_missing_head_names_it(target, data_dir, tmp_path, monkeypatch):
  data, _ = data_dir
  with pytest.raises(SystemExit) as e:
    _cli_train(target, data, monkeypatch, "--out", str(tmp_path / "d"), "--steps", "2",
               "--init", str(tmp_path / "nothing"))
  assert str(tmp_path / "nothing") in str(e.value)


def test_a_bf16_head_keeps_its_weights_as_stored_and_drafts_the_same(target, tmp_path):
  """A head saved in bf16 drafts (on CPU, float32 activations) from its bf16 weights as stored:
  the same values as the float32 load, half the bytes; outputs stay the target's."""
  from jspec.drafters.eagle3 import keep_stored_bf16
  from models.stored_layers import StoredLinear, store_weights, weight_bytes
  folder = str(tmp_path / "bf16")
  sf.save_eagle3(eagle3.init_head(target, np.arange(3, 60, 2), seed=4), folder,
                 dtype=jnp.bfloat16, verifier="tiny")
  assert keep_stored_bf16(folder, jnp.float32) and not keep_stored_bf16(folder, jnp.bfloat16)
  floats = sf.load_eagle3(folder)
  stored = store_weights(sf.load_eagle3(folder), fmt="bf16")
  assert isinstance(stored.lm_head, StoredLinear) and isinstance(stored.mlp.up_proj, StoredLinear)
  assert weight_bytes(stored) < 0.6 * weight_bytes(floats)
  rng = np.random.default_rng(0)
  taps = tuple(jnp.asarray(rng.normal(size=(2, 5, CFG.hidden_size)), jnp.float32) for _ in range(3))
  emb = jnp.asarray(rng.normal(size=(2, 5, CFG.hidden_size)), jnp.float32)
  pos = jnp.broadcast_to(jnp.arange(5), (2, 5))
  attend = lambda q, k, v: (jnp.repeat(v, q.shape[2] // v.shape[2], axis=2), None)
  outs = [h.draft_logits(h.layer(h.fuse(taps), emb, pos, attend)[0]) for h in (floats, stored)]
  np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)
  spec = SpecDecoder(target, {"method": "eagle3", "num_speculative_tokens": 3, "head": folder})
  prompts = _prompts(3, 5)
  spec.generate(_prompts(3, 6), max_new_tokens=40, eos=False)
  with count_compiles() as c:
    out = spec.generate(prompts, max_new_tokens=40, eos=False)
  assert c.count == 0
  assert out.token_ids == Decoder(target).generate(prompts, max_new_tokens=40,
                                                   eos=False).token_ids



def test_mixed_precision_training_matches_float32_and_keeps_float32_results(target, data_dir):
  from jspec.train.loader import heldout_batches
  data, _ = data_dir
  ids = eagle3.draft_vocab(np.arange(CFG.vocab_size)[::-1].copy(), 56)
  batch = {k: jnp.asarray(v) for k, v in heldout_batches(data, seq_len=64, batch_size=4,
                                                         holdout=8)[0].items()}
  check_mixed_matches_float32(
      lambda dt: eagle3.eagle3_task(target, ids, ttt_steps=3, seed=2, compute_dtype=dt), batch,
      min_products=20)
  task = eagle3.eagle3_task(target, ids, compute_dtype=jnp.bfloat16)
  assert task.module(task.params).dtype == jnp.float32      # the export is the float32 module


def test_mixed_precision_resume_refuses_a_float32_run(target, data_dir, tmp_path):
  data, _ = data_dir
  ids = eagle3.draft_vocab(np.ones(CFG.vocab_size, np.int64), 48)
  cfg = _config(steps=10, save_every=5)
  trainer.train(eagle3.eagle3_task(target, ids), data, str(tmp_path / "a"), cfg,
                progress=False, stop_after=5)
  with pytest.raises(ValueError, match=r"differs in \['compute_dtype'\]"):
    trainer.train(eagle3.eagle3_task(target, ids, compute_dtype=jnp.bfloat16), data,
                  str(tmp_path / "a"), cfg, progress=False)


@pytest.fixture(scope="module")
def feats_dir(target, data_dir, tmp_path_factory):
  from jspec.train import features
  folder = str(tmp_path_factory.mktemp("e3_feats") / "feats")
  features.cache_features(target, data_dir[0], folder, taps=(1, 2, 3), batch_size=16,
                          progress=False)
  return folder


def test_a_packed_row_trains_as_its_sequences_apart(target, data_dir, feats_dir):
  """ttt_loss over one packed row equals ttt_loss over its sequences as separate rows: the same
  labels, loss, accuracies and AL estimate (attention, RoPE positions and labels kept apart)."""
  from jspec.train.features import FeatureShards
  from jspec.train.shards import PackedRows
  data, _ = data_dir
  n = 192                       # two 44-token sequences (42 labels each) fit the 96-label budget
  src = FeatureShards(data, n, feats_dir)
  short = [0, 5]
  packed = PackedRows(src, short)
  assert len(packed) == 1 and sorted(p[0] for p in packed.rows[0]) == sorted(short)
  ids = eagle3.draft_vocab(np.arange(CFG.vocab_size)[::-1].copy(), 56)
  check_packed_equals_apart(eagle3.eagle3_task(target, ids, taps=(1, 2, 3), ttt_steps=3, seed=4),
                            packed)


def test_packed_training_lowers_loss_and_needs_a_cache_and_a_packing_loss(target, data_dir,
                                                                        feats_dir, tmp_path):
  from jspec.train import medusa
  data, _ = data_dir
  ids = eagle3.draft_vocab(np.ones(CFG.vocab_size, np.int64), 48)
  task = eagle3.eagle3_task(target, ids, taps=(1, 2, 3))
  history = trainer.train(task, data, str(tmp_path / "run"), _config(steps=30, pack=True,
                                                                     seq_len=192),
                          progress=False, features=feats_dir)      # two sequences a row
  assert np.mean([r["loss"] for r in history[-5:]]) < np.mean([r["loss"] for r in history[:5]]) - 1
  with pytest.raises(ValueError, match="need a feature cache"):
    trainer.train(task, data, str(tmp_path / "x"), _config(pack=True), progress=False)
  with pytest.raises(ValueError, match="cannot read packed rows"):
    trainer.train(medusa.medusa_task(target, ids), data, str(tmp_path / "y"),
                  _config(pack=True), progress=False, features=feats_dir)

