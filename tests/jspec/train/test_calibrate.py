"""`jspec train calibrate` on a tiny target: the packed replies equal plain greedy decoding,
DSpark's temperatures land beside the head (readable, never worse than no scaling at position 1),
Medusa's rank accuracies equal a by-hand count, and bad settings fail before any model work."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder
from jspec.cli import main
from jspec.drafters.dflash import checkpoint as dflash_format
from jspec.drafters.dspark import read_calibration
from jspec.drafters.medusa import checkpoint as medusa_format
from jspec.train import dflash, medusa
from jspec.train.calibrate import calibrate_dspark, calibrate_medusa, pack_replies
from models import Llama, LlamaConfig

CFG = LlamaConfig.tiny(vocab_size=64, num_layers=3)


@pytest.fixture(scope="module")
def target():
  return Llama(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def data(target):
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 64, int(n)).tolist() for n in (5, 9, 7, 4)]
  return prompts, pack_replies(target, prompts, max_new_tokens=24)


def test_replies_are_plain_greedy_decoding(target, data):
  prompts, packed = data
  plain = Decoder(target).generate(prompts, max_new_tokens=24).token_ids
  for i, (p, r) in enumerate(zip(prompts, plain)):
    n = len(p) + len(r)
    assert packed.length[i] == n and packed.tokens[i, :n].tolist() == p + list(r)
    assert packed.reply[i].tolist() == [len(p) <= j < n for j in range(packed.tokens.shape[1])]
  eos = plain[0][5]                  # a token the first reply makes: replies end at it, kept
  cut = pack_replies(target, prompts, eos_ids=(eos,), max_new_tokens=24)
  for i, (p, r) in enumerate(zip(prompts, plain)):
    r = list(r)
    want = r[:r.index(eos) + 1] if eos in r else r
    assert cut.tokens[i, len(p):cut.length[i]].tolist() == want
  assert cut.length[0] <= len(prompts[0]) + 6


def test_dspark_temperatures_are_saved_beside_the_head(target, data, tmp_path):
  module = dflash.init_module(target, np.arange(64), "dspark", num_layers=1, block_size=5,
                              mask_token_id=3, markov_rank=8)
  module.confidence_head.kernel[...] = jnp.asarray(
      np.random.default_rng(1).normal(0, 2, module.confidence_head.kernel.shape), jnp.float32)
  folder = str(tmp_path / "dspark")
  dflash_format.save(module, folder, dtype=jnp.float32, verifier="tiny")
  summary = calibrate_dspark(target, folder, data[1], source="test")
  d = module.config.max_draft
  saved = json.loads((tmp_path / "dspark" / "calibration.json").read_text())
  assert len(saved["temperatures"]) == d and summary["blocks"] > 0
  np.testing.assert_allclose(read_calibration(folder, d), saved["temperatures"], rtol=1e-6)
  assert saved["ece_after"][0] <= saved["ece_before"][0] + 1e-12   # t = 1 is on the grid


def test_medusa_rank_accuracies_equal_a_count(target, data, tmp_path):
  ids = np.arange(64)
  head = medusa.init_head(target, ids, num_heads=3, num_layers=1)
  rng = np.random.default_rng(2)
  for var in (head.res_kernel, head.res_bias, head.lm_head):
    var[...] = jnp.asarray(rng.normal(0, 0.3, var[...].shape), jnp.float32)
  folder = str(tmp_path / "medusa")
  medusa_format.save_medusa(head, folder, dtype=jnp.float32, verifier="tiny")
  packed = data[1]
  calibrate_medusa(target, folder, packed, ranks=2, source="test")
  acc = np.asarray(medusa_format.read_rank_accuracy(folder))
  assert acc.shape == (3, 2) and np.all(acc.sum(1) <= 1 + 1e-9)
  # by hand: head k's top candidate at position t against token t + k + 2 inside the reply
  loaded = medusa_format.load_medusa(folder)
  logp = np.asarray(loaded(medusa.final_hidden(target, jnp.asarray(packed.tokens))))
  top = np.argmax(logp, axis=-1)                                     # [B, N, K] draft ids
  for k in range(3):
    hits = [ids[top[b, t, k]] == packed.tokens[b, t + k + 2]
            for b in range(len(packed.length)) for t in range(packed.tokens.shape[1] - k - 2)
            if packed.reply[b, t + k + 2]]
    assert acc[k, 0] == pytest.approx(np.mean(hits), abs=1e-6)


@pytest.mark.parametrize("argv, message", [
    (["--num", "0"], "--num must be >= 1"),
    (["--max-new-tokens", "1"], "--max-new-tokens must be >= 2"),
    (["--ranks", "0"], "--ranks must be >= 1"),
])
def test_bad_settings_fail_first(argv, message, capsys):
  with pytest.raises(SystemExit) as e:
    main(["train", "calibrate", "medusa", "--prompts", "none.jsonl", *argv])
  assert message in str(e.value)
