"""Predicted outputs: a correct prediction is accepted whole (AL = D + 1), re-synchronisation
after a divergence against a plain-Python reference, the n-gram fallback for rows without one,
text predictions through a tokenizer, no recompilation across predictions, the CLI switch, and
input errors before any compilation."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, SpecDecoder, SpeculativeConfig, count_compiles
from jspec.drafters.base import Context
from jspec.drafters.model_free.ngram import NgramDrafter
from jspec.drafters.model_free.prediction import Prediction, PredictionDrafter, PredictionState
from jspec.sampling import SamplingParams
from models import Llama, LlamaConfig

CFG = LlamaConfig.tiny()
D = 4


@pytest.fixture(scope="module")
def tiny():
  return Llama(CFG, rngs=nnx.Rngs(6))


@pytest.fixture(scope="module")
def setup(tiny):
  rng = np.random.default_rng(0)
  prompts = [rng.integers(1, CFG.vocab_size, n).tolist() for n in (7, 11, 5)]
  plain = Decoder(tiny).generate(prompts, max_new_tokens=40, eos=False).token_ids
  sd = SpecDecoder(tiny, {"method": "prediction", "num_speculative_tokens": D})
  return prompts, plain, sd


KW = dict(max_new_tokens=40, eos=False)


def test_correct_prediction_is_accepted_whole(setup):
  prompts, plain, sd = setup
  out = sd.generate(prompts, prediction=plain, **KW)
  assert out.token_ids == plain
  assert out.rounds == 3 * 8                 # 39 tokens after the first, D + 1 = 5 per round
  assert out.per_position_acceptance == [1.0] * D


@pytest.mark.parametrize("edit", ["delete", "insert", "replace", "late_start"])
def test_resynchronises_after_a_divergence(setup, edit):
  prompts, plain, sd = setup
  ref = plain[1]
  pred = {"delete": ref[:12] + ref[15:], "insert": ref[:12] + [1, 2, 3] + ref[12:],
          "replace": ref[:12] + [(t + 1) % CFG.vocab_size for t in ref[12:15]] + ref[15:],
          "late_start": ref[6:]}[edit]
  out = sd.generate([prompts[1]], prediction=[pred], **KW)
  ngram_only = sd.generate([prompts[1]], **KW)
  assert out.token_ids[0] == ref
  # 8 rounds when nothing diverges; a late start first spends a round per unpredicted token
  assert out.rounds <= 8 + (6 if edit == "late_start" else 3) < ngram_only.rounds


def _resync_reference(history, pred, hint, lo, hi):
  """Longest suffix (hi .. lo) of history found in pred with a continuation; first occurrence at
  or after hint, else the first. Returns the continuation's start or -1."""
  for n in range(hi, lo - 1, -1):
    if len(history) < n:
      continue
    hits = [i for i in range(len(pred) - n) if pred[i:i + n] == history[-n:]]
    if hits:
      after = [i for i in hits if i + n >= hint]
      return (after[0] if after else hits[0]) + n
  return -1


@pytest.mark.parametrize("lo, hi", [(1, 1), (1, 4), (2, 3)])
def test_resync_and_fallback_match_references(lo, hi):
  rng = np.random.default_rng(lo * 10 + hi)
  drafter = PredictionDrafter(D, lo, hi)
  fallback = NgramDrafter(D, 1, 4)
  b, s, lp = 6, 32, 24
  found = fell_back = 0
  for _ in range(20):
    lens = rng.integers(1, s, b)
    toks = rng.integers(0, 4, (b, s))
    plens = rng.integers(0, lp + 1, b)
    preds = rng.integers(0, 4, (b, lp))
    hints = rng.integers(0, lp, b)
    ctx = Context(tokens=jnp.asarray(toks, jnp.int32), length=jnp.asarray(lens, jnp.int32),
                  prompt_len=jnp.asarray(lens, jnp.int32), sampling=SamplingParams.make(b))
    state = PredictionState(Prediction(jnp.asarray(preds, jnp.int32), jnp.asarray(plens, jnp.int32)),
                            jnp.full((b,), -1, jnp.int32), jnp.asarray(hints, jnp.int32))
    draft, new = drafter.propose(None, state, ctx, None)
    ng, _ = fallback.propose(None, (), ctx, None)
    for r in range(b):
      hist, pred = toks[r, :lens[r]].tolist(), preds[r, :plens[r]].tolist()
      start = _resync_reference(hist, pred, int(hints[r]), lo, hi)
      assert int(new.pos[r]) == start
      n = int(draft.length[r])
      if start >= 0:
        want = pred[start:start + D]
        found += 1
      else:
        want = np.asarray(ng.tokens[r, :int(ng.length[r])]).tolist()
        fell_back += 1
      assert np.asarray(draft.tokens[r, :n]).tolist() == want
  assert found > 30 and fell_back > 10


def test_rows_without_a_prediction_use_ngram(setup, tiny):
  prompts, plain, sd = setup
  ngram = SpecDecoder(tiny, {"method": "ngram", "num_speculative_tokens": D})
  mixed = sd.generate(prompts, prediction=[None, plain[1], []], **KW)
  alone = ngram.generate([prompts[0], prompts[2]], **KW)
  assert mixed.token_ids == plain
  none = sd.generate([prompts[0], prompts[2]], **KW)
  assert none.rounds == alone.rounds and none.accepted_at == alone.accepted_at


def test_text_prediction_and_no_recompilation(tiny, tiny_loaded_factory):
  tok = tiny_loaded_factory(0).tokenizer       # characters to ids
  text = "the quick brown fox jumps over the lazy dog, again and again"
  prompt = tok.encode("copy: " + text)
  sd = SpecDecoder(tiny, {"method": "prediction", "num_speculative_tokens": 3}, tokenizer=tok)
  kw = dict(max_new_tokens=30, eos=False)
  plain = Decoder(tiny).generate([prompt, prompt], **kw).token_ids
  as_ids = sd.generate([prompt, prompt], prediction=[tok.encode(text), plain[1]], **kw)
  with count_compiles() as c:    # other predictions of the same bucket, text or ids
    as_text = sd.generate([prompt, prompt], prediction=[text, None], **kw)
    other = sd.generate([prompt, prompt], prediction=[plain[0][:20], text[::-1]], seed=3,
                        temperature=[0.0, 1.0], **kw)
  assert c.count == 0
  assert as_ids.token_ids == as_text.token_ids[:1] + [plain[1]] and as_text.token_ids == plain
  assert other.token_ids[0] == plain[0]


@pytest.mark.parametrize("kwargs, message", [
    (dict(prediction=[[1, 2]]), "prediction has 1 entries for 2 prompts"),
    (dict(prediction="some text"), "prediction must be a list with one entry per prompt"),
    (dict(prediction=["text", None]), "prediction 0 is text: pass tokenizer= to SpecDecoder"),
    (dict(prediction=[[1, 2], [3, 999]]), r"prediction 1 has token id 999 outside the vocabulary"),
    (dict(prediction=[[1, 2.5], None]), "prediction 0 must be text, a list of token ids or None"),
])
def test_bad_prediction_fails_before_compiling(tiny, kwargs, message):
  sd = SpecDecoder(tiny, {"method": "prediction", "num_speculative_tokens": 2})
  with count_compiles() as c:
    with pytest.raises(ValueError, match=message):
      sd.generate([[1, 2, 3], [4, 5]], **kwargs)
  assert c.count == 0


def test_prediction_needs_the_prediction_method(tiny):
  sd = SpecDecoder(tiny, {"method": "ngram", "num_speculative_tokens": 2})
  with count_compiles() as c:
    with pytest.raises(ValueError, match="prediction= needs the 'prediction' method"):
      sd.generate([[1, 2, 3]], prediction=[[1, 2]])
  assert c.count == 0


@pytest.mark.parametrize("cfg, message", [
    ({"resync_min": 0}, "1 <= resync_min <= resync_max"),
    ({"resync_min": 3, "resync_max": 2}, "1 <= resync_min <= resync_max"),
    ({"prompt_lookup_min": 5, "prompt_lookup_max": 2}, "prompt_lookup_min <= prompt_lookup_max"),
])
def test_bad_options(cfg, message):
  with pytest.raises(ValueError, match=message):
    SpeculativeConfig.from_dict({"method": "prediction", "num_speculative_tokens": 3, **cfg})


def test_cli_prediction_file_turns_it_on(tiny, tiny_loaded_factory, tmp_path, monkeypatch,
                                         capsys):
  from jspec import cli, cli_args
  loaded = tiny_loaded_factory(0)
  loaded.model = tiny
  loaded.tokenizer.decode = lambda ids, skip_special_tokens=False: "".join(
      chr(32 + i % 90) for i in ids)             # the CLI prints text
  monkeypatch.setattr(cli_args, "load_model", lambda name, *_: loaded)
  path = tmp_path / "pred.txt"
  path.write_text("say it again, say it again", encoding="utf-8")
  cli.main(["generate", "say it again", "--prediction", str(path), "--max-new-tokens", "12",
            "--json"])
  record = json.loads(capsys.readouterr().out)
  assert record["drafter"] == "prediction" and record["same_as_baseline"]
  assert record["num_draft"] == "auto"          # the CLI's default for a chain drafter
  assert 1 <= record["num_tokens"] <= 12 and record["acceptance_length"] >= 1.0


@pytest.mark.parametrize("argv, message", [
    (["--prediction", "/nonexistent/pred.txt"], "cannot read --prediction"),
    (["--prediction", "{empty}"], "--prediction .* is empty"),
    (["--prediction", "{file}", "--drafter", "ngram"], "--prediction drafts with the prediction"),
])
def test_cli_bad_prediction_fails_before_the_model_loads(argv, message, tmp_path, monkeypatch,
                                                         capsys):
  from jspec import cli, cli_args
  monkeypatch.setattr(cli_args, "load_model", lambda name, *_: pytest.fail("loaded a model"))
  (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
  (tmp_path / "p.txt").write_text("x = 1", encoding="utf-8")
  argv = [a.format(empty=tmp_path / "empty.txt", file=tmp_path / "p.txt") for a in argv]
  with pytest.raises(SystemExit) as e:
    cli.main(["generate", "hello"] + argv)
  assert e.value.code != 0
  assert __import__("re").search(message, str(e.value.code))
