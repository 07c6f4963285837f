"""The drafter-training data pipeline on a tiny random model with a character-level tokenizer and
SmolLM2's chat template: shard contents against an independent decode, resume = uninterrupted
(byte-identical), config mismatch, the grain source and iterator state, token counts."""

import json
import os
import re
import shutil
import types

import numpy as np
import pytest
from flax import nnx

from jspec import Decoder
from jspec.train import chat, data, loader, shards
from jspec.train.prompts import magpie
from models import Llama, LlamaConfig, LoadedModel, Tokenizer

# SmolLM2-135M-Instruct's chat template, as stored in its GGUF
SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}")
SMOL_SYSTEM = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
               "Hugging Face<|im_end|>\n")

SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>"]
PIECES = SPECIALS + [chr(c) for c in range(32, 127)] + ["\n"]          # ids 0..98
PIECES += [f"<{chr(97 + i)}>" for i in range(128 - len(PIECES))]        # ids 99..127: multi-char
EOS_IDS = [2, 120, 121, 122, 123, 124, 125, 126]   # several EOS ids: a random model stops often
CFG = LlamaConfig.tiny(vocab_size=128)


class CharBackend:
  """A character-level stand-in for a `tokenizers.Tokenizer` (encode/decode/special tokens)."""

  def encode(self, text, add_special_tokens=False):
    ids, i = [], 0
    while i < len(text):
      for s, name in enumerate(SPECIALS[1:], 1):
        if text.startswith(name, i):
          ids.append(s)
          i += len(name)
          break
      else:
        ids.append(PIECES.index(text[i]) if text[i] in PIECES[3:99] else PIECES.index("?"))
        i += 1
    return types.SimpleNamespace(ids=ids)

  def decode(self, ids, skip_special_tokens=False):
    return "".join(PIECES[i] for i in ids if not (skip_special_tokens and i < len(SPECIALS)))

  def get_vocab_size(self, with_added_tokens=True):
    return len(PIECES)

  def id_to_token(self, i):
    return PIECES[i]


def char_tokenizer(template=SMOL_TEMPLATE):
  return Tokenizer(CharBackend(), bos_id=None, eos_ids=EOS_IDS, chat_template=template)


PROMPTS = [
    {"id": f"p{i:02d}", "category": "general" if i % 3 else "coding",
     "messages": [{"role": "user", "content": text}], "source": "test"}
    for i, text in enumerate(["What is 2+2?", "Name three colours.", "Write a haiku about rain.",
                              "Sort [3, 1, 2] in Python.", "Why is the sky blue? Be brief.",
                              "hi", "Translate 'cat' to French.", "Count to five.",
                              "Give me a long, detailed story about a dragon and a knight who "
                              "become friends after a long misunderstanding in the mountains."])]
PROMPTS.append({"id": "mt", "category": "multi_turn", "source": "test", "messages": [
    {"role": "user", "content": "Recommend a game."}, {"role": "assistant", "content": "Chess."},
    {"role": "user", "content": "Something shorter?"}]})
KW = dict(shard_size=4, batch_size=2, max_new_tokens=24, temperature=1.0, seed=3, multi_turn=0.7,
          max_len=CFG.max_position, model_name="tiny", progress=False)


@pytest.fixture(scope="module")
def tiny():
  return Llama(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def tok():
  return char_tokenizer()


@pytest.fixture(scope="module")
def regen_dir(tiny, tok, tmp_path_factory):
  out = str(tmp_path_factory.mktemp("regen"))
  data.regenerate(tiny, tok, PROMPTS, out, **KW)
  return out


def _shard_sequences(out):
  """(prompt id, tokens, loss_mask, turns, stopped) per sequence, straight from the npz files."""
  rows = []
  for s in shards.read_manifest(out)["shards"]:
    with np.load(os.path.join(out, s["file"])) as z:
      off = z["offsets"]
      for j in range(len(off) - 1):
        rows.append((str(z["prompt_ids"][j]), z["tokens"][off[j]:off[j + 1]],
                     z["loss_mask"][off[j]:off[j + 1]], int(z["turns"][j]), int(z["stopped"][j])))
  return rows


def _runs(mask):
  """[start, end) of each run of ones."""
  d = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
  return list(zip(np.nonzero(d == 1)[0], np.nonzero(d == -1)[0]))


# Chat-template pieces ---------------------------------------------------------------------------


def test_header_and_turn_glue(tok):
  assert chat.user_header(tok) == SMOL_SYSTEM + "<|im_start|>user\n"
  assert chat.user_header(tok, system="Be brief.") == \
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
  msgs = PROMPTS[-1]["messages"]
  after_reply, after_user = chat.turn_glue(tok, msgs)
  assert (after_reply, after_user) == ("<|im_end|>\n<|im_start|>user\n",
                                       "<|im_end|>\n<|im_start|>assistant\n")
  # the pieces rebuild the template's own rendering of the continued conversation
  full = tok.apply_chat_template(list(msgs) + [{"role": "assistant", "content": "A."},
                                               {"role": "user", "content": "B?"}])
  assert full == tok.apply_chat_template(msgs) + "A." + after_reply + "B?" + after_user
  # the context for a sampled next user turn: the reply's EOS closes the turn if it is the
  # template's own end-of-turn token, else the template closes it
  prompt = tok.encode(tok.apply_chat_template(msgs))
  for reply, closing in [([40, 41, 2], ""), ([40, 41, 120], "<|im_end|>")]:
    ctx, glue = data._next_user_context(tok, msgs, prompt + reply)
    assert ctx[:len(prompt) + 3] == prompt + reply and glue == after_user
    assert tok.decode(ctx[len(prompt) + 3:]) == closing + "\n<|im_start|>user\n"
  lowered = char_tokenizer(SMOL_TEMPLATE.replace("message['content']", "message['content']|lower"))
  with pytest.raises(ValueError, match="verbatim"):
    chat.user_header(lowered)


@pytest.mark.slow
def test_header_from_real_smollm2_template():
  """The real tokenizer and template from the GGUF's metadata (no weights loaded)."""
  from models.gguf_loader import metadata, open_gguf
  from models.registry import DEFAULT_MODEL, resolve
  real = Tokenizer.from_gguf_metadata(metadata(open_gguf(resolve(DEFAULT_MODEL, quiet=True))))
  header = chat.user_header(real)
  assert header == SMOL_SYSTEM + "<|im_start|>user\n"
  im_end = real.encode("<|im_end|>")
  assert len(im_end) == 1 and im_end[0] in real.eos_ids
  assert real.encode(header)[-3:] == real.encode("<|im_start|>user\n")
  assert chat.turn_glue(real, [{"role": "user", "content": "Hi"}]) == (
      "<|im_end|>\n<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")


# Magpie prompts ---------------------------------------------------------------------------------


def test_synthesize_filters_and_resumes_identically(tiny, tok, tmp_path, monkeypatch):
  kw = dict(num_prompts=10, batch_size=4, max_new_tokens=48, seed=1, model_name="tiny",
            progress=False)
  full = magpie.synthesize_prompts(tiny, tok, str(tmp_path / "a.jsonl"), **kw)
  texts = [r["messages"][0]["content"] for r in full]
  assert len(full) == 10 and len(set(texts)) == 10
  assert int(full[-1]["id"].split("-")[1]) >= 2          # it took at least three batches
  for r in full:
    assert r["category"] == "magpie" and r["source"].startswith("magpie: user turn sampled by tiny")
    assert [m["role"] for m in r["messages"]] == ["user"]
    t = r["messages"][0]["content"]
    assert len(t) >= chat.MIN_PROMPT_CHARS and t == t.strip()
    assert not any(s in t for s in SPECIALS)

  # interrupted in the second batch, then resumed; grown from 5 prompts (a batch cut short) to 10
  b, calls = str(tmp_path / "b.jsonl"), []
  real_call = magpie.SlotDecoder.generate

  def flaky(self, *a, **k):
    calls.append(1)
    if len(calls) == 2:
      raise KeyboardInterrupt
    return real_call(self, *a, **k)

  monkeypatch.setattr(magpie, "SYNTH_BATCHES_PER_CALL", 1)     # one batch per call: cut in between
  monkeypatch.setattr(magpie.SlotDecoder, "generate", flaky)
  with pytest.raises(KeyboardInterrupt):
    magpie.synthesize_prompts(tiny, tok, b, **kw)
  monkeypatch.setattr(magpie.SlotDecoder, "generate", real_call)
  assert 0 < len(shards.read_jsonl(b)) < 10
  assert magpie.synthesize_prompts(tiny, tok, b, **kw) == full
  assert open(b, "rb").read() == open(tmp_path / "a.jsonl", "rb").read()

  c = str(tmp_path / "c.jsonl")
  assert magpie.synthesize_prompts(tiny, tok, c, **{**kw, "num_prompts": 5}) == full[:5]
  assert magpie.synthesize_prompts(tiny, tok, c, **kw) == full
  with pytest.raises(ValueError, match="another out_path"):
    magpie.synthesize_prompts(tiny, tok, c, **{**kw, "temperature": 0.7})


def test_synthesize_steered_by_opening_words(tiny, tok, tmp_path):
  openings = ["Write a poem about", "Explain how"]
  kw = dict(num_prompts=6, batch_size=4, max_new_tokens=48, seed=2, model_name="tiny",
            openings=openings, category="steered", progress=False)
  recs = magpie.synthesize_prompts(tiny, tok, str(tmp_path / "s.jsonl"), **kw)
  assert len(recs) == 6
  for r in recs:
    _, batch, row = r["id"].split("-")
    k = (int(batch) * 4 + int(row)) % 2
    text = r["messages"][-1]["content"]
    assert r["category"] == "steered" and text.startswith(openings[k])
    assert len(text) - len(openings[k]) >= chat.MIN_PROMPT_CHARS - 1
    assert "opening words" in r["source"]
  with pytest.raises(ValueError, match="openings"):
    magpie.synthesize_prompts(tiny, tok, str(tmp_path / "t.jsonl"), **{**kw, "openings": []})


# Regeneration -----------------------------------------------------------------------------------


def test_shards_hold_prompt_plus_generated_reply(tiny, tok, regen_dir):
  rows = _shard_sequences(regen_dir)
  assert [r[0] for r in rows] == [p["id"] for p in PROMPTS]
  by_id = {p["id"]: p for p in PROMPTS}
  eos = set(EOS_IDS)
  n_two = 0
  for pid, tokens, mask, turns, stopped in rows:
    prompt = tok.encode(tok.apply_chat_template(by_id[pid]["messages"]))
    assert tokens.dtype == np.int32 and mask.dtype == np.uint8
    assert tokens[:len(prompt)].tolist() == prompt and not mask[:len(prompt)].any()
    runs = _runs(mask)
    assert len(runs) == turns and runs[0][0] == len(prompt)
    for (lo, hi), last in zip(runs, [False] * (turns - 1) + [True]):
      reply = tokens[lo:hi].tolist()
      assert not eos & set(reply[:-1])               # a reply stops at its first EOS ...
      assert (reply[-1] in eos) or len(reply) == KW["max_new_tokens"]   # ... or at the limit
      if last:
        assert stopped == (reply[-1] in eos)
      else:
        assert reply[-1] in eos                      # only finished replies are continued
    if turns == 2:
      n_two += 1
      (_, hi1), (lo2, _) = runs
      between = tok.decode(tokens[hi1:lo2])
      closing = "" if tokens[hi1 - 1] == 2 else "<|im_end|>"
      m = re.fullmatch(re.escape(closing + "\n<|im_start|>user\n") + r"(.+)"
                       + re.escape("<|im_end|>\n<|im_start|>assistant\n"), between, re.S)
      assert m and len(m.group(1)) >= chat.MIN_PROMPT_CHARS
  assert n_two >= 2   # multi_turn=0.7 over 10 prompts continues several conversations


def test_greedy_reply_equals_independent_decode(tiny, tok, tmp_path):
  out = str(tmp_path / "greedy")
  data.regenerate(tiny, tok, PROMPTS[:5], out, **{**KW, "temperature": 0.0, "multi_turn": 0.0})
  dec = Decoder(tiny, eos_ids=EOS_IDS)
  for (pid, tokens, mask, _, _), p in zip(_shard_sequences(out), PROMPTS):
    prompt = tok.encode(tok.apply_chat_template(p["messages"]))
    ref = dec.generate([prompt], max_new_tokens=KW["max_new_tokens"])   # alone, unpadded
    got = tokens[len(prompt):].tolist()
    ties = [k for k, m in enumerate(ref.margins[0]) if m < 1e-4]
    upto = ties[0] if ties else None                # compare up to the first near-tie
    assert got[:upto] == ref.token_ids[0][:upto], pid
    assert mask[len(prompt):].all()


def test_captured_features_equal_a_second_pass(tiny, tok, tmp_path):
  """regenerate(taps=...) saves each token's features while generating; the feature cache copied
  from them equals the one a teacher-forced second pass computes (bfloat16 rounding)."""
  from jspec.train import features
  taps = (0, 1)
  out = str(tmp_path / "captured")
  m = data.regenerate(tiny, tok, PROMPTS, out, **{**KW, "taps": taps})
  assert all(os.path.isfile(os.path.join(out, s["features"])) for s in m["shards"])
  plain = str(tmp_path / "plain")
  data.regenerate(tiny, tok, PROMPTS, plain, **KW)
  for name in sorted(os.listdir(plain)):       # the same tokens as without capture
    if name.endswith(".npz"):
      assert open(os.path.join(plain, name), "rb").read() == \
          open(os.path.join(out, name), "rb").read()
  copied = features.cache_features(tiny, out, str(tmp_path / "fa"), taps=taps, progress=False)
  # a last-slot reader (Medusa, MTP) with no cache yet copies the captured taps: no forward pass
  real_forward = features._forward
  features._forward = None
  try:
    last = features.last_slot_features(tiny, out, str(tmp_path / "fl"), progress=False)
  finally:
    features._forward = real_forward
  assert open(last, "rb").read() == open(copied, "rb").read()
  os.remove(os.path.join(out, shards.MANIFEST))  # the same data without the capture's record
  m["config"]["taps"] = []
  shards.write_json(os.path.join(out, shards.MANIFEST), m)
  computed = features.cache_features(tiny, out, str(tmp_path / "fb"), taps=taps, progress=False)
  a = np.load(copied).view(features.DTYPE).astype(np.float32)
  b = np.load(computed).view(features.DTYPE).astype(np.float32)
  assert a.shape == b.shape and a.shape[1:] == (len(taps) + 1, CFG.hidden_size)
  np.testing.assert_allclose(a, b, rtol=2**-6, atol=2e-3)


def test_manifest_counts_match_shards(regen_dir):
  m = shards.read_manifest(regen_dir)
  rows = _shard_sequences(regen_dir)
  assert m["complete"] and [s["prompts"] for s in m["shards"]] == [4, 4, 2]
  assert m["config"]["model"] == "tiny" and m["config"]["multi_turn"] == 0.7
  assert m["totals"]["sequences"] == len(rows) == len(PROMPTS)
  assert m["totals"]["tokens"] == sum(len(r[1]) for r in rows)
  assert m["totals"]["response_tokens"] == sum(int(r[2].sum()) for r in rows)
  assert m["totals"]["multi_turn"] == sum(r[3] == 2 for r in rows)
  assert m["categories"]["coding"]["sequences"] == 3
  assert m["categories"]["multi_turn"]["sequences"] == 1


def test_resume_after_interruption_is_byte_identical(tiny, tok, regen_dir, tmp_path, monkeypatch):
  out, seen = str(tmp_path / "resumed"), []
  real_result = data._ShardWork.result

  def stop_at_shard_1(self):
    seen.append(self.k)
    if self.k == 1 and seen.count(1) == 1:
      raise RuntimeError("interrupted")
    return real_result(self)

  monkeypatch.setattr(data._ShardWork, "result", stop_at_shard_1)
  with pytest.raises(RuntimeError, match="interrupted"):
    data.regenerate(tiny, tok, PROMPTS, out, **KW)
  partial = shards.read_manifest(out)
  assert not partial["complete"] and len(partial["shards"]) == 1
  assert sorted(os.listdir(out)) == ["manifest.json", "shard_00000.npz"]
  with pytest.warns(UserWarning, match="not complete"):
    assert len(shards.TokenShards(out, seq_len=8)) == 4
  data.regenerate(tiny, tok, PROMPTS, out, **KW)
  assert seen == [0, 1, 1, 2]                     # shard 0 was not redone
  for k in range(3):
    name = f"shard_{k:05d}.npz"
    assert open(os.path.join(out, name), "rb").read() == \
        open(os.path.join(regen_dir, name), "rb").read(), name
  strip = lambda m: [{k: v for k, v in s.items() if k not in ("seconds", "generated_tokens")}
                     for s in m["shards"]]
  assert strip(shards.read_manifest(out)) == strip(shards.read_manifest(regen_dir))


def test_first_shard_makes_the_later_shards_byte_identical(tiny, tok, regen_dir, tmp_path):
  """first_shard=1 skips shard 0 and writes the same shards 1.. as the full run (fresh prompts for
  a head trained on the first shards); the two folders snapshot into the full run's data."""
  out = str(tmp_path / "later")
  m = data.regenerate(tiny, tok, PROMPTS, out, **KW, first_shard=1)
  full = shards.read_manifest(regen_dir)
  assert m["complete"]
  assert [s["file"] for s in m["shards"]] == [s["file"] for s in full["shards"][1:]]
  for s in m["shards"]:
    assert open(os.path.join(out, s["file"]), "rb").read() == \
        open(os.path.join(regen_dir, s["file"]), "rb").read(), s["file"]
  joined = shards.snapshot(str(tmp_path / "joined"), [(regen_dir, 1), (out, None)])
  assert joined["totals"] == full["totals"]
  data.regenerate(tiny, tok, PROMPTS, out, **KW, first_shard=1)        # resumes: nothing left
  with pytest.raises(ValueError, match="another config"):
    data.regenerate(tiny, tok, PROMPTS, out, **KW)                        # first_shard differs
  with pytest.raises(ValueError, match="first_shard must be in"):
    data.regenerate(tiny, tok, PROMPTS, str(tmp_path / "x"), **KW, first_shard=len(PROMPTS))


def test_config_mismatch_is_an_error(tiny, tok, regen_dir):
  with pytest.raises(ValueError,
                     match=r"another config \(max_new_tokens: 24 there, 25 now\).*another out_dir"):
    data.regenerate(tiny, tok, PROMPTS, regen_dir, **{**KW, "max_new_tokens": 25})
  with pytest.raises(ValueError, match="prompts_sha256"):
    data.regenerate(tiny, tok, PROMPTS[:-1] + [{**PROMPTS[-1], "id": "other"}], regen_dir, **KW)
  with pytest.raises(ValueError, match="ids must be unique"):
    data.regenerate(tiny, tok, PROMPTS + PROMPTS[:1], regen_dir, **KW)


# Loading ----------------------------------------------------------------------------------------


def test_token_shards_pad_and_truncate(regen_dir):
  rows = _shard_sequences(regen_dir)
  lengths = [len(r[1]) for r in rows]
  seq_len = int(np.median(lengths))              # some sequences longer, some shorter
  assert min(lengths) < seq_len < max(lengths)
  ds = shards.TokenShards(regen_dir, seq_len=seq_len)
  assert len(ds) == len(rows)
  for i, (_, tokens, mask, _, _) in enumerate(rows):
    item = ds[i]
    n = min(len(tokens), seq_len)
    assert item["tokens"].shape == item["loss_mask"].shape == (seq_len,)
    assert item["tokens"].dtype == np.int32 and item["length"] == n
    assert item["tokens"][:n].tolist() == tokens[:n].tolist()      # the start is kept
    assert item["loss_mask"][:n].tolist() == mask[:n].tolist()
    assert not item["tokens"][n:].any() and not item["loss_mask"][n:].any()
  with pytest.raises(IndexError):
    ds[len(ds)]


@pytest.mark.parametrize("seq_len", [8, 16, 64])
def test_reply_windows_label_each_reply_token_once(seq_len):
  rng = np.random.default_rng(seq_len)
  per_window = max(1, seq_len // 2 - 2)
  for _ in range(200):
    n = int(rng.integers(1, 300))
    mask = np.zeros(n, np.uint8)
    for _ in range(int(rng.integers(0, 4))):              # a few reply spans (turns)
      a = int(rng.integers(0, n))
      mask[a:a + int(rng.integers(1, 150))] = 1
    seen = np.zeros(n, int)
    wins = shards.reply_windows(mask, seq_len, per_window)
    for start, lo, hi in wins:
      assert 0 <= start < n
      p = np.arange(start, min(n, start + seq_len))
      labelled = p[(mask[p] > 0) & (p >= lo) & (p < hi)]
      assert 1 <= len(labelled) <= per_window
      seen[labelled] += 1
    assert (seen == (mask > 0)).all()                     # every reply token once, nothing else
    if n <= seq_len and mask.sum() <= per_window:
      assert wins == ([(0, 0, n)] if mask.any() else [])  # what the first window labelled


def _reply_tokens(regen_dir, holdout):
  """(the number of sequences, reply tokens of every sequence, of the held-out ones), each whole."""
  ds = shards.TokenShards(regen_dir, seq_len=CFG.max_position)
  whole = {ds[i]["tokens"].tobytes(): int(ds[i]["loss_mask"].sum()) for i in range(len(ds))}
  held = loader.heldout_batches(regen_dir, seq_len=CFG.max_position, batch_size=holdout,
                                holdout=holdout)[0]
  return len(ds), sum(whole.values()), sum(whole[t.tobytes()] for t in held["tokens"])


def test_windowed_epoch_labels_every_training_reply_token(regen_dir):
  seq_len, holdout = 16, 2
  n, every, held = _reply_tokens(regen_dir, holdout)
  want = every - held
  epoch = loader.make_dataset(regen_dir, seq_len=seq_len, batch_size=1, seed=0, num_epochs=1,
                              holdout=holdout, windows=True)
  items = [epoch[k] for k in range(len(epoch))]
  assert len(items) > n - holdout                        # long replies take several windows
  assert sum(int(b["loss_mask"].sum()) for b in items) == want
  first = loader.make_dataset(regen_dir, seq_len=seq_len, batch_size=1, seed=0, num_epochs=1,
                              holdout=holdout)
  assert sum(int(first[k]["loss_mask"].sum()) for k in range(len(first))) < want


def test_windowed_holdout_reads_every_held_out_reply_token(regen_dir):
  seq_len, holdout = 16, 3
  _, _, want = _reply_tokens(regen_dir, holdout)                 # the same sequences, whole
  win = loader.heldout_batches(regen_dir, seq_len=seq_len, batch_size=4, holdout=holdout,
                               windows=True)
  first = loader.heldout_batches(regen_dir, seq_len=seq_len, batch_size=4, holdout=holdout)
  assert sum(int(b["loss_mask"].sum()) for b in win) == want
  assert sum(int(b["loss_mask"].sum()) for b in first) < want
  assert sum(len(b["tokens"]) for b in win) > holdout     # long replies take several windows
  assert loader.heldout_batches(regen_dir, seq_len=seq_len, batch_size=4, holdout=0,
                                windows=True) == []


def test_pack_rows_respects_both_limits_and_places_every_sequence_once():
  rng = np.random.default_rng(0)
  for _ in range(50):
    k = int(rng.integers(1, 200))
    lengths = rng.integers(1, 65, k)
    labels = (lengths * rng.random(k)).astype(int) + 2
    rows = shards.pack_rows(lengths, labels, 64, 32)
    assert sorted(i for r in rows for i in r) == list(range(k))
    for r in rows:
      over = lengths[r].sum() > 64 or labels[r].sum() > 32
      assert not over or len(r) == 1                      # only a lone sequence may exceed
    assert rows == shards.pack_rows(lengths, labels, 64, 32)      # deterministic


def test_packed_epoch_holds_each_training_sequence_once_apart(regen_dir):
  seq_len, holdout = CFG.max_position, 2
  first = loader.make_dataset(regen_dir, seq_len=seq_len, batch_size=1, seed=0, num_epochs=1,
                              holdout=holdout)
  want = sorted((first[k]["tokens"][0, :first[k]["length"][0]].tobytes(),
                 first[k]["loss_mask"][0, :first[k]["length"][0]].tobytes())
                for k in range(len(first)))
  packed = loader.make_dataset(regen_dir, seq_len=seq_len, batch_size=1, seed=0, num_epochs=1,
                               holdout=holdout, pack=True)
  got = []
  for k in range(len(packed)):
    row = {key: v[0] for key, v in packed[k].items()}
    seg, pos, n = row["segments"], row["positions"], int(row["length"])
    assert (seg[:n] > 0).all() and not seg[n:].any() and not row["tokens"][n:].any()
    assert np.count_nonzero(row["loss_mask"]) + 2 * seg.max() <= seq_len // 2 or seg.max() == 1
    for s_id in range(1, int(seg.max()) + 1):
      at = np.flatnonzero(seg == s_id)
      assert (np.diff(at) == 1).all() and (pos[at] == np.arange(len(at))).all()
      got.append((row["tokens"][at].tobytes(), row["loss_mask"][at].tobytes()))
  assert sorted(got) == want                   # the unpacked epoch's sequences, each once
  assert len(packed) < len(first)


@pytest.mark.parametrize("seq_len", [16, 256])     # several windows a sequence; packed windows
def test_packed_windows_hold_each_training_window_once_apart(regen_dir, seq_len):
  """Packing reply windows: every window of the unpacked windowed epoch appears once, whole and
  apart, so the packed epoch still labels every training reply token once."""
  holdout = 2
  kw = dict(seq_len=seq_len, batch_size=1, seed=0, num_epochs=1, holdout=holdout, windows=True)
  wins = loader.make_dataset(regen_dir, **kw)
  want = sorted((wins[k]["tokens"][0, :wins[k]["length"][0]].tobytes(),
                 wins[k]["loss_mask"][0, :wins[k]["length"][0]].tobytes())
                for k in range(len(wins)))
  packed = loader.make_dataset(regen_dir, pack=True, **kw)
  got = []
  for k in range(len(packed)):
    row = {key: v[0] for key, v in packed[k].items()}
    seg, pos, n = row["segments"], row["positions"], int(row["length"])
    assert (seg[:n] > 0).all() and not seg[n:].any()
    assert np.count_nonzero(row["loss_mask"]) + 2 * seg.max() <= seq_len // 2 or seg.max() == 1
    for s_id in range(1, int(seg.max()) + 1):
      at = np.flatnonzero(seg == s_id)
      assert (np.diff(at) == 1).all() and (pos[at] == np.arange(len(at))).all()
      got.append((row["tokens"][at].tobytes(), row["loss_mask"][at].tobytes()))
  assert sorted(got) == want
  assert sum(int(packed[k]["loss_mask"].sum()) for k in range(len(packed))) == \
      sum(int(wins[k]["loss_mask"].sum()) for k in range(len(wins)))
  n_train = len(shards.TokenShards(regen_dir, seq_len)) - holdout
  assert len(wins) > n_train if seq_len == 16 else len(packed) < len(wins)


def test_iterator_state_restores_the_data_order(regen_dir):
  kw = dict(seq_len=CFG.max_position, batch_size=3, seed=11)   # untruncated: items distinguishable
  it = loader.make_iterator(regen_dir, **kw)
  first = [next(it) for _ in range(5)]
  state = loader.iterator_state(it)
  json.dumps(state)
  after = [next(it) for _ in range(5)]
  again = loader.restore_iterator(regen_dir, state, **kw)
  for a, b in zip(after, [next(again) for _ in range(5)]):
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  # each epoch is a fresh permutation of the 10 sequences: the first 30 items cover each 3 times
  ds = shards.TokenShards(regen_dir, seq_len=CFG.max_position)
  key = {ds[i]["tokens"].tobytes(): i for i in range(len(ds))}
  assert len(key) == len(ds)
  order = [key[t.tobytes()] for b in first + after for t in b["tokens"]]
  for e in range(3):
    assert sorted(order[10 * e:10 * e + 10]) == list(range(10))
  assert order[:10] != order[10:20] and order[:10] != list(range(10))
  other = loader.make_iterator(regen_dir, **{**kw, "seed": 12})
  assert [key[t.tobytes()] for _ in range(3) for t in next(other)["tokens"]] != order[:9]


def test_token_counts_match_numpy(regen_dir):
  rows = _shard_sequences(regen_dir)
  counts = shards.token_counts(regen_dir, CFG.vocab_size)
  direct = np.zeros(CFG.vocab_size, np.int64)
  for _, tokens, mask, _, _ in rows:
    np.add.at(direct, tokens[mask == 1], 1)
  assert counts.dtype == np.int64 and np.array_equal(counts, direct)
  assert counts.sum() == shards.read_manifest(regen_dir)["totals"]["response_tokens"] > 0
  with pytest.raises(ValueError, match="vocab_size"):
    shards.token_counts(regen_dir, 50)


def test_token_count_parts_partition_the_sequences(regen_dir):
  v = CFG.vocab_size
  fit, check = (shards.token_counts(regen_dir, v, part=p) for p in ("fit", "check"))
  assert np.array_equal(fit + check, shards.token_counts(regen_dir, v))
  ids = [r[0] for r in _shard_sequences(regen_dir)]
  held = [i for i in ids if shards.in_check_part(i)]
  assert 0 < len(held) < len(ids) or check.sum() == 0
  want = sum(int(r[2].sum()) for r in _shard_sequences(regen_dir) if r[0] in held)
  assert check.sum() == want
  with pytest.raises(ValueError, match="part"):
    shards.token_counts(regen_dir, v, part="train")


def test_build_dataset_end_to_end(tiny, tok, tmp_path):
  prompt_file = tmp_path / "prompts.jsonl"
  prompt_file.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS[:3]))
  lm = LoadedModel(model=tiny, tokenizer=tok, name="tiny", source="")
  out = str(tmp_path / "built")
  kw = dict(prompt_files=[str(prompt_file)], num_magpie=3, magpie_batch_size=8,
            magpie_max_new_tokens=48, shard_size=4, batch_size=2, max_new_tokens=8, progress=False)
  m = data.build_dataset(lm, out, **kw)
  assert m["complete"] and m["totals"]["sequences"] == 6
  assert m["prompt_files"] == {str(prompt_file): 3, os.path.join(out, "magpie.jsonl"): 3}
  assert m["categories"]["magpie"]["sequences"] == 3
  ids = [r[0] for r in _shard_sequences(out)]
  assert ids[:3] == ["p00", "p01", "p02"] and all(i.startswith("magpie-") for i in ids[3:])
  before = {f: open(os.path.join(out, f), "rb").read() for f in os.listdir(out)}
  assert data.build_dataset(lm, out, **kw)["totals"] == m["totals"]     # rerun: nothing redone
  assert {f: open(os.path.join(out, f), "rb").read() for f in os.listdir(out)} == before
  mixed = str(tmp_path / "shuffled")
  os.makedirs(mixed)
  shutil.copy(os.path.join(out, "magpie.jsonl"), mixed)                 # no new sampling
  m2 = data.build_dataset(lm, mixed, **{**kw, "shuffle": True})
  ids2 = [r[0] for r in _shard_sequences(mixed)]
  assert sorted(ids2) == sorted(ids) and ids2 != ids and m2["prompt_order"] == "shuffled (seed 0)"


# Snapshots --------------------------------------------------------------------------------------


def test_snapshot_links_the_first_shards(regen_dir, tmp_path):
  """A snapshot of the first shard, then of all shards twice over: the loader sees exactly those
  sequences, in order, and the totals add up; nothing is copied."""
  rows = _shard_sequences(regen_dir)
  first = shards.read_manifest(regen_dir)["shards"][0]["sequences"]
  one = str(tmp_path / "one")
  manifest = shards.snapshot(one, [(regen_dir, 1)])
  assert manifest["complete"] and len(manifest["shards"]) == 1
  assert all(os.path.islink(os.path.join(one, f)) for f in os.listdir(one) if f.endswith(".npz"))
  ds = shards.TokenShards(one, seq_len=CFG.max_position)
  assert len(ds) == first
  for i in range(first):
    assert ds.sequence(i)[0].tolist() == rows[i][1].tolist()
  two = str(tmp_path / "two")
  shards.snapshot(two, [(regen_dir, None), (one, None)])
  ds2 = shards.TokenShards(two, seq_len=CFG.max_position)
  assert len(ds2) == len(rows) + first
  assert [ds2.sequence(i)[0].tolist() for i in range(len(rows), len(ds2))] == \
      [r[1].tolist() for r in rows[:first]]
  assert shards.read_manifest(two)["totals"]["response_tokens"] == \
      shards.token_counts(regen_dir, CFG.vocab_size).sum() + shards.token_counts(one, CFG.vocab_size).sum()


def test_snapshot_takes_shards_by_number(regen_dir, tmp_path):
  """`(first, last)` picks shards by the number in their file names, in a folder numbered from
  --first-shard: the same sequences as the folder's own shards there."""
  have = shards.read_manifest(regen_dir)["shards"]
  assert len(have) >= 2
  moved = str(tmp_path / "from7")            # the folder as if it had started at shard 7
  shutil.copytree(regen_dir, moved)
  manifest = shards.read_manifest(moved)
  for k, entry in enumerate(manifest["shards"]):
    for key in ("file", "features"):
      if key in entry:
        new = entry[key].replace(f"shard_{k:05d}", f"shard_{k + 7:05d}")
        os.rename(os.path.join(moved, entry[key]), os.path.join(moved, new))
        entry[key] = new
  with open(os.path.join(moved, shards.MANIFEST), "w") as f:
    json.dump(manifest, f)
  rows = _shard_sequences(regen_dir)
  first = have[0]["sequences"]
  tail = shards.snapshot(str(tmp_path / "tail"), [(moved, (8, None))])
  assert [s["sequences"] for s in tail["shards"]] == [s["sequences"] for s in have[1:]]
  assert tail["snapshot"][0]["numbers"] == list(range(8, 7 + len(have)))
  ds = shards.TokenShards(str(tmp_path / "tail"), seq_len=CFG.max_position)
  assert [ds.sequence(i)[0].tolist() for i in range(len(ds))] == \
      [r[1].tolist() for r in rows[first:]]
  one = shards.snapshot(str(tmp_path / "one"), [(moved, (7, 7))])
  assert [s["sequences"] for s in one["shards"]] == [first]
  with pytest.raises(ValueError, match=f"no finished shard numbered 3-5 .*finished shards: 7-"):
    shards.snapshot(str(tmp_path / "none"), [(moved, (3, 5))])


def test_snapshot_errors(regen_dir, tmp_path):
  have = len(shards.read_manifest(regen_dir)["shards"])
  with pytest.raises(ValueError, match=f"has {have} finished shards"):
    shards.snapshot(str(tmp_path / "a"), [(regen_dir, have + 1)])
  (tmp_path / "b").mkdir()
  (tmp_path / "b" / "x").write_text("")
  with pytest.raises(ValueError, match="not empty"):
    shards.snapshot(str(tmp_path / "b"), [(regen_dir, 1)])
  with pytest.raises(FileNotFoundError):
    shards.snapshot(str(tmp_path / "c"), [(str(tmp_path / "nowhere"), None)])
  other = str(tmp_path / "d")
  shutil.copytree(regen_dir, other)
  manifest = shards.read_manifest(other)
  manifest["config"]["taps"] = [0]
  with open(os.path.join(other, shards.MANIFEST), "w") as f:
    json.dump(manifest, f)
  with pytest.raises(ValueError, match="must agree"):
    shards.snapshot(str(tmp_path / "e"), [(regen_dir, 1), (other, 1)])


def test_snapshot_cli_errors_name_the_problem(regen_dir, tmp_path, capsys):
  from jspec.cli import main
  with pytest.raises(SystemExit) as e:
    main(["train", "snapshot", str(tmp_path / "s"), f"{regen_dir}:99"])
  assert "finished shards; take between 1 and" in str(e.value)
  main(["train", "snapshot", str(tmp_path / "s"), f"{regen_dir}:1"])
  assert json.loads(capsys.readouterr().out)["shards"] == 1
  have = len(shards.read_manifest(regen_dir)["shards"])
  main(["train", "snapshot", str(tmp_path / "r"), f"{regen_dir}:1-"])
  assert json.loads(capsys.readouterr().out)["shards"] == have - 1
  with pytest.raises(SystemExit) as e:
    main(["train", "snapshot", str(tmp_path / "q"), f"{regen_dir}:50-60"])
  assert "no finished shard numbered 50-60" in str(e.value)
