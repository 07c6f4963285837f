"""Adaptive draft length (jspec/adaptive.py): the cost table and the choice against hand-computed
cases, the estimate update, non-anticipation through the real round, identity with plain decoding,
no recompilation across length switches, and configuration errors. Losslessness is in
test_lossless_exact.py (exact enumeration through choose/update) and test_lossless_montecarlo.py."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jspec import Decoder, SpecDecoder, SpeculativeConfig, count_compiles, engine
from jspec.adaptive import AdaptiveDrafter, choose_length, expected_lengths, update_estimates
from jspec.costs import CostTable, fit_round_costs
from models import Llama, LlamaConfig

CFG = LlamaConfig.tiny()


@pytest.fixture(scope="module")
def tiny():
  return Llama(CFG, rngs=nnx.Rngs(5))


def test_cost_table_interpolates_and_adds_the_draft():
  t = CostTable(verify={1: {1: 1.0, 2: 1.2, 4: 1.8}, 8: {1: 1.0, 2: 2.0}},
                draft={1: {1: 0.1, 3: 0.3}})
  assert t.verify_cost(1, 3) == pytest.approx(1.5)        # halfway between T=2 and T=4
  assert t.verify_cost(1, 6) == pytest.approx(2.4)        # extended along the last segment
  assert t.verify_cost(4, 2) == pytest.approx(1.2)        # B=4 uses the largest B <= 4
  assert t.verify_cost(16, 3) == pytest.approx(3.0)
  assert t.draft_cost(1, 2) == pytest.approx(0.2) and t.draft_cost(8, 3) == pytest.approx(0.3)
  assert t.round_costs(1, (0, 1, 3), 3) == pytest.approx([1.3, 1.5, 2.1])
  # a serial drafter asked for the D_k drafts it verifies (one in a plain round), and one more in
  # every explore_every-th round (a quarter of a draft at 4), at most D_max
  assert t.round_costs(1, (0, 1, 3), 3, variable_length=True) == pytest.approx([1.1, 1.3, 2.1])
  assert t.round_costs(1, (0, 1, 3), 3, variable_length=True, explore_every=4) == \
      pytest.approx([1.1, 1.325, 2.1])
  # measured whole rounds replace verify + draft (per B row: a line in D through the D >= 1 points)
  r = CostTable(t.verify, t.draft, round={1: {0: 1.1, 2: 1.5, 4: 2.3}, 8: {0: 1.2, 4: 3.0}})
  assert r.round_costs(1, (0, 1, 3), 3) == pytest.approx([1.1, 1.1, 1.9])
  assert r.round_costs(8, (0, 2), 3) == pytest.approx([1.2, 3.0])
  # a plain round of 4 steps: the D = 0 entry is per step (measured), or 4 plain forwards + draft
  assert r.round_costs(1, (0, 1, 3), 3, plain=4) == pytest.approx([4.4, 1.1, 1.9])
  assert t.round_costs(1, (0, 1, 3), 3, plain=4) == pytest.approx([4.3, 1.5, 2.1])
  assert CostTable.from_dict(r.to_dict()) == r
  # measured round costs are replaced by their least-squares line in D (slope >= 0), by hand:
  # x = 1, 2, 3, y = 1.3, 1.2, 1.7: slope 0.4 / 2 = 0.2, intercept 1.4 - 0.4 = 1.0
  assert fit_round_costs({0: 0.9, 1: 1.3, 2: 1.2, 3: 1.7}) == pytest.approx(
      {0: 0.9, 1: 1.2, 2: 1.4, 3: 1.6})
  # a falling line is flattened to the mean (1.4225); a single D >= 1 point is kept
  assert fit_round_costs({0: 1.05, 1: 1.42, 2: 1.41, 3: 1.46, 7: 1.4}) == pytest.approx(
      {0: 1.05, 1: 1.4225, 2: 1.4225, 3: 1.4225, 7: 1.4225})
  assert fit_round_costs({0: 1.0, 3: 1.7}) == {0: 1.0, 3: 1.7}
  # a concave curve is recovered exactly where a line is not (it would overprice D = 1)
  sqrt_costs = {d: 2.0 + 50.0 * d ** 0.5 for d in (1, 2, 3, 5, 7)}
  assert fit_round_costs({0: 160.0, **sqrt_costs}) == pytest.approx({0: 160.0, **sqrt_costs})
  line = {d: 1.0 + 0.2 * d for d in (1, 2, 3, 5, 7)}
  assert fit_round_costs(line) == pytest.approx(line)
  # any timings: never decreasing in D, and no worse a fit than the line's
  rng = np.random.default_rng(0)
  for _ in range(50):
    pts = {d: float(c) for d, c in zip((1, 2, 3, 5, 7), rng.uniform(1.0, 3.0, 5))}
    fit = fit_round_costs(pts)
    assert all(fit[a] <= fit[b] + 1e-12 for a, b in zip((1, 2, 3, 5), (2, 3, 5, 7)))
    xs, ys = np.asarray(list(pts)), np.asarray(list(pts.values()))
    slope = max(np.polyfit(xs, ys, 1)[0], 0.0)
    line_err = np.sum((ys.mean() + slope * (xs - xs.mean()) - ys) ** 2)
    assert np.sum((np.asarray(list(fit.values())) - ys) ** 2) <= line_err + 1e-12
  # a dip (D = 2 below D = 1) no longer makes D = 2 the cheaper length: 1.41 < 1.43 < 1.45
  dip = CostTable(t.verify, round={1: {0: 1.0, 1: 1.42, 2: 1.41, 3: 1.46}})
  assert dip.round_costs(1, (0, 1, 2, 3), 3) == pytest.approx([1.0, 1.41, 1.43, 1.45])
  with pytest.raises(ValueError, match="bad round cost entry"):
    CostTable(t.verify, round={1: {0: 0.0}})
  assert CostTable.from_dict(t.to_dict()) == t
  with pytest.raises(ValueError, match="not a cost table"):
    CostTable.from_dict({"verify": 3})


def test_round_costs_follow_the_prompt_padding(tiny):
  """Round tables measured at several prompt paddings (`round_at`) are priced at the decoder's own
  padding, linear in log2(padding) between them and clamped outside; in the jitted round, a
  decoder follows the table of its prompts' padding."""
  v = {1: {1: 1.0, 4: 1.5}}
  t = CostTable(v, round_at={128: {1: {0: 1.0, 3: 2.0}}, 512: {1: {0: 0.9, 3: 1.2}}})
  assert t.round == {1: {0: 0.9, 3: 1.2}} and t.paddings == (128, 512)
  assert t.round_costs(1, (0, 3), 3, padding=128) == pytest.approx([1.0, 2.0])
  assert t.round_costs(1, (0, 3), 3, padding=256) == pytest.approx([0.95, 1.6])  # log2 midpoint
  assert t.round_costs(1, (0, 3), 3, padding=64) == pytest.approx([1.0, 2.0])    # clamped
  assert t.round_costs(1, (0, 3), 3, padding=2048) == pytest.approx([0.9, 1.2])
  assert t.round_costs(1, (0, 3), 3, plain=4, padding=256) == pytest.approx([3.8, 1.6])
  assert t.round_costs(1, (0, 3), 3) == pytest.approx([0.9, 1.2])     # no padding: `round`
  assert CostTable.from_dict(t.to_dict()) == t
  with pytest.raises(ValueError, match="bad round cost padding"):
    CostTable(v, round_at={0: {1: {0: 1.0}}})
  # 24- and 30-token prompts pad to 32, where plain rounds pay; padded to 128, D = 3 pays
  table = CostTable(v, round_at={32: {1: {0: 0.5, 3: 50.0}}, 128: {1: {0: 50.0, 3: 0.5}}})
  sd = SpecDecoder(tiny, {"method": "ngram", "num_speculative_tokens": 3,
                          "draft_lengths": [0, 3]}, cost_table=table, time_rounds=False)
  prompts = _prompts(0, [8, 10], repeat=3)
  short = sd.generate(prompts, max_new_tokens=12, eos=False)
  long = sd.generate(prompts, max_new_tokens=12, eos=False, pad_to=128)
  plain = Decoder(tiny).generate(prompts, max_new_tokens=12, eos=False)
  assert short.token_ids == long.token_ids == plain.token_ids
  assert short.verified_lengths[3] == 0 < short.verified_lengths[0]
  assert long.verified_lengths[0] == 0 < long.verified_lengths[3]


def test_expected_lengths_and_choice_by_hand():
  est = jnp.asarray([[0.8, 0.5, 0.5], [0.2, 0.9, 0.9]], jnp.float32)
  al = np.asarray(expected_lengths(est, jnp.asarray([3, 1]), (0, 1, 3)))
  # row 0: 1, 1 + .8, 1 + .8 + .4 + .2; row 1 proposes one draft only: 1, 1.2, 1.2
  np.testing.assert_allclose(al, [[1, 1.8, 2.4], [1, 1.2, 1.2]], rtol=1e-6)
  # a plain round of 3 steps yields 3 tokens, whatever the estimates
  al3 = np.asarray(expected_lengths(est, jnp.asarray([3, 1]), (0, 1, 3), plain=3))
  np.testing.assert_allclose(al3, [[3, 1.8, 2.4], [3, 1.2, 1.2]], rtol=1e-6)
  live = jnp.asarray([True, True])
  # mean AL = 1, 1.5, 1.8 -> per unit cost 1, 1.25, 1.2 at costs 1, 1.2, 1.5
  assert int(choose_length(est, jnp.asarray([3, 1]), live, (0, 1, 3),
                           jnp.asarray([1.0, 1.2, 1.5]))) == 1
  assert int(choose_length(est, jnp.asarray([3, 1]), live, (0, 1, 3),
                           jnp.asarray([1.0, 1.2, 1.4]))) == 2      # 1.8 / 1.4 = 1.29 wins
  # a finished row does not count: row 0 alone, 2.4 / 1.5 = 1.6
  assert int(choose_length(est, jnp.asarray([3, 1]), jnp.asarray([True, False]), (0, 1, 3),
                           jnp.asarray([1.0, 1.2, 1.5]))) == 2
  # nothing proposed: every length has AL 1, the cheapest (the plain step) wins
  assert int(choose_length(est, jnp.asarray([0, 0]), live, (0, 1, 3),
                           jnp.asarray([1.0, 1.02, 1.1]))) == 0
  # mean AL 3 (plain, 3 steps), 1.5, 1.8: 3 / 3.3 = 0.91 loses to 1.5 / 1.2 = 1.25; 3 / 2.3 = 1.30 wins
  assert int(choose_length(est, jnp.asarray([3, 1]), live, (0, 1, 3),
                           jnp.asarray([3.3, 1.2, 1.5]), plain=3)) == 1
  assert int(choose_length(est, jnp.asarray([3, 1]), live, (0, 1, 3),
                           jnp.asarray([2.3, 1.2, 1.5]), plain=3)) == 0


def test_update_counts_accepted_rejected_and_the_frontier():
  est = jnp.full((4, 4), 0.5, jnp.float32)
  draft = jnp.asarray([[1, 2, 3, 4]] * 4, jnp.int32)
  # width 2; row 0 accepts 1 (rejects position 1); row 1 accepts both and its bonus equals draft 2
  # (the frontier, observed 1); row 2 accepts both, bonus differs (0); row 3 is finished
  emitted = jnp.asarray([[1, 9, 0, 0, 0], [1, 2, 3, 0, 0], [1, 2, 7, 0, 0], [1, 2, 3, 0, 0]])
  new = np.asarray(update_estimates(est, jnp.int32(2), jnp.asarray([1, 2, 2, 2]), emitted, draft,
                                    jnp.asarray([4, 4, 4, 4]), jnp.asarray([1, 1, 1, 0], bool),
                                    0.5))
  np.testing.assert_allclose(new, [[.75, .25, .5, .5], [.75, .75, .75, .5], [.75, .75, .25, .5],
                                   [.5, .5, .5, .5]])
  # a row that proposed only one draft: no frontier past its proposals
  new = np.asarray(update_estimates(est[:1], jnp.int32(1), jnp.asarray([1]), emitted[1:2], draft[:1],
                                    jnp.asarray([1]), jnp.asarray([True]), 0.5))
  np.testing.assert_allclose(new, [[.75, .5, .5, .5]])


def _prompts(seed, lengths, repeat=1):
  rng = np.random.default_rng(seed)
  return [rng.integers(0, CFG.vocab_size, n).tolist() * repeat for n in lengths]


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_choice_depends_on_earlier_rounds_only(tiny, method):
  """Drive rounds by hand: the length each round verifies is choose() of the estimates left by the
  rounds before it and of this round's draft (computed here, before the round runs); a serial
  drafter's choice comes before drafting, from the estimates alone."""
  kw = dict(draft_model=tiny) if method == "draft_model" else {}
  sd = SpecDecoder(tiny, {"method": method, "num_speculative_tokens": "auto",
                          "draft_lengths": [0, 1, 2, 4]},
                   cost_table=CostTable({1: {1: 1.0, 2: 1.05, 5: 1.3}}), **kw)
  prompts = _prompts(3, [6, 5], repeat=3) + _prompts(4, [9])
  state, sampling = sd.prefill(prompts, max_new_tokens=40, eos=False)

  @jax.jit
  def expected(state):
    if sd.drafter.choose_before_drafting:
      length = jnp.full(state.length.shape, sd.num_draft, jnp.int32)
    else:
      draft, _ = sd.drafter.inner.propose(None, state.drafter_state.inner,
                                          state.context(sampling), None)
      length = draft.length
    remaining = state.max_new - (state.length - state.prompt_len)
    return sd.drafter.choose(sd.drafter_params, state.drafter_state, length, ~state.done,
                             remaining)

  seen = set()
  while not bool(np.all(np.asarray(state.done))):
    want = int(expected(state))
    before = np.asarray(state.drafter_state.chosen)
    state = engine.spec_round(sd.graphdef, sd.weights, sd.drafter, sd.drafter_params, state,
                              sampling, eos_ids=())
    got = np.flatnonzero(np.asarray(state.drafter_state.chosen) - before)
    assert got.tolist() == [want]
    seen.add(want)
  assert len(seen) >= 2


@pytest.mark.parametrize("method", ["ngram", "draft_model", "lookahead"])
def test_adaptive_matches_plain_greedy_without_recompiling(tiny, method):
  kw = dict(draft_model=tiny) if method == "draft_model" else {}
  if method == "draft_model":
    # the self-draft accepts everything: a fixed table (not the measured defaults) where the 0.5
    # prior picks D = 2 and full acceptance D = 7, so that the rounds switch lengths
    kw["cost_table"] = CostTable({1: {1: 1.0, 2: 1.05, 4: 1.3, 8: 1.8}})
  sd = SpecDecoder(tiny, {"method": method, "num_speculative_tokens": "auto"}, time_rounds=False,
                   **kw)
  plain = Decoder(tiny)
  prompts = _prompts(0, [8, 10], repeat=3) + _prompts(1, [7])
  out = sd.generate(prompts, max_new_tokens=40, eos=False, pad_to=32)
  assert out.token_ids == plain.generate(prompts, max_new_tokens=40, eos=False).token_ids
  assert sum(out.verified_lengths.values()) == out.steps
  other = _prompts(2, [5, 12]) + _prompts(6, [4], repeat=4)
  with count_compiles() as c:
    again = sd.generate(other, max_new_tokens=40, eos=False, temperature=0.9, pad_to=32)
  assert c.count == 0
  used = {n for o in (out, again) for n, c in o.verified_lengths.items() if c}
  assert len(used) >= 2, (out.verified_lengths, again.verified_lengths)


@pytest.mark.parametrize("method", ["ngram", "eagle3", "hybrid"])   # after / before drafting,
def test_host_choice_equals_the_in_round_choice(tiny, method):           # regimes
  """choice="host" (one program per width, the next width chosen after each round) and "device"
  (lax.switch in one program) choose the same widths from the same estimates: equal tokens and
  per-width round counts, greedy and sampled, several widths used, no recompiles on a second
  call; host mode compiles one round program per width."""
  kw = {}
  if method in ("eagle3", "hybrid"):
    from jspec.drafters.eagle3 import Eagle3Config, Eagle3Head
    kw = dict(draft_model=Eagle3Head(Eagle3Config.for_target(CFG, taps=(0, 1, 1)),
                                     rngs=nnx.Rngs(2)),
              cost_table=CostTable({1: {1: 1.0, 2: 1.05, 4: 1.1}}))
  cfg = {"method": method, "num_speculative_tokens": "auto", "draft_lengths": [0, 1, 2, 4]}
  host, dev = (SpecDecoder(tiny, cfg, time_rounds=False, choice=c, **kw)
               for c in ("host", "device"))
  prompts = _prompts(0, [8, 10], repeat=3) + _prompts(1, [7])
  used = set()
  for t in (0.0, 0.9):
    a = host.generate(prompts, max_new_tokens=30, eos=False, temperature=t, seed=4, pad_to=32)
    b = dev.generate(prompts, max_new_tokens=30, eos=False, temperature=t, seed=4, pad_to=32)
    assert a.token_ids == b.token_ids and a.verified_lengths == b.verified_lengths, t
    assert a.steps == b.steps and a.accepted_at == b.accepted_at
    used |= {n for n, c in a.verified_lengths.items() if c}
  assert len(used) >= 2, used
  with count_compiles() as c:
    host.generate(_prompts(2, [5, 12, 9]), max_new_tokens=30, eos=False, pad_to=32)
  assert c.count == 0


def test_config_errors():
  cfg = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": "auto"})
  assert cfg.adaptive and cfg.max_draft == 7 and cfg.draft_lengths == (0, 1, 2, 3, 5, 7)
  assert SpeculativeConfig.from_dict(cfg.to_dict()) == cfg
  cfg = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 4,
                                     "draft_lengths": [4, 0, 2]})
  assert cfg.draft_lengths == (0, 2, 4) and cfg.max_draft == 4
  for bad, match in [("fast", "or 'auto'"), (0, "or 'auto'")]:
    with pytest.raises(ValueError, match=match):
      SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": bad})
  for lengths, match in [([3], "at least two"), ([1, 1], "at least two"), ([0, -1], ">= 0"),
                         ([0, 2], "must equal num_speculative_tokens")]:
    with pytest.raises(ValueError, match=match):
      SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3,
                                   "draft_lengths": lengths})
  with pytest.raises(ValueError, match="cannot read the cost table"):
    SpecDecoder(Llama(CFG, rngs=nnx.Rngs(0)), cfg, cost_table="/nonexistent/plan.json")


def test_wrapper_passes_the_drafters_hooks_through():
  from jspec.adaptive import AdaptiveParams
  from jspec.drafters.base import Drafter
  from jspec.drafters.model_free.lookahead import LookaheadDrafter
  from jspec.drafters.model_free.ngram import NgramDrafter
  from jspec.drafters.model_free.prediction import PredictionDrafter

  @dataclasses.dataclass(frozen=True)
  class Counting(NgramDrafter):      # a drafter that learns across calls: params count outputs
    def after_generate(self, params, prompts, outputs):
      return params + len(outputs)

  inner = PredictionDrafter(3, 1, 3)
  want = inner.make_request([[5, 6], None], 2, vocab_size=CFG.vocab_size)
  got = AdaptiveDrafter(inner).make_request([[5, 6], None], 2, vocab_size=CFG.vocab_size)
  assert np.array_equal(got.tokens, want.tokens) and np.array_equal(got.length, want.length)
  w = AdaptiveDrafter(NgramDrafter(3))
  assert isinstance(w, Drafter) and w.make_request(None, 2, vocab_size=CFG.vocab_size) is None
  with pytest.raises(ValueError, match="prediction= needs the 'prediction' method"):
    w.make_request([[1]], 1, vocab_size=CFG.vocab_size)
  params = AdaptiveParams(inner=7, cost=None, prior=None, log_padding=None)
  assert w.after_generate(params, [[1]], [[2]]) == params                # the default: unchanged
  assert AdaptiveDrafter(Counting(3)).after_generate(params, [[1]], [[2], [3]]).inner == 9
  assert w.num_extra == 0 and AdaptiveDrafter(LookaheadDrafter(3)).num_extra == \
      LookaheadDrafter(3).num_extra > 0
  assert w.plain_block == 4 and AdaptiveDrafter(NgramDrafter(2), (0, 2)).plain_block == 3
  assert AdaptiveDrafter(NgramDrafter(3), (1, 3)).plain_block == 1     # no plain round
  with pytest.raises(ValueError, match="plain_steps must be an integer >= 1"):
    AdaptiveDrafter(NgramDrafter(3), plain_steps=0)


def test_a_drafter_must_derive_from_the_base_class(tiny, monkeypatch):
  """A registered method whose build returns a class outside the Drafter hierarchy gets a clear
  error at SpecDecoder(...), before anything compiles."""
  from jspec.drafters import registry
  from jspec.drafters.model_free.ngram import NgramOptions

  @dataclasses.dataclass(frozen=True)
  class Loose:
    num_draft: int
    target_taps: tuple = ()

  monkeypatch.setitem(registry._METHODS, "loose_test", registry.Method(
      "loose_test", NgramOptions, lambda opts, d, target, **kw: (Loose(d), None)))
  with pytest.raises(TypeError, match="does not subclass jspec.drafters.base.Drafter"):
    SpecDecoder(tiny, {"method": "loose_test", "num_speculative_tokens": 2})


def test_calibrated_acceptance_is_the_starting_estimate(tiny):
  from jspec.drafters.model_free.ngram import NgramDrafter
  table = CostTable({1: {1: 1.0, 4: 1.2}}, acceptance=(0.9, 0.4))
  assert CostTable.from_dict(table.to_dict()) == table
  w = AdaptiveDrafter(NgramDrafter(3), (0, 1, 3))
  params = w.make_params(None, table)
  np.testing.assert_allclose(np.asarray(params.prior), [0.9, 0.4, 0.4])
  np.testing.assert_allclose(np.asarray(w.make_params(None, CostTable({1: {1: 1.0}})).prior),
                             [0.5] * 3)
  sd = SpecDecoder(tiny, {"method": "ngram", "num_speculative_tokens": "auto"}, cost_table=table)
  state, _ = sd.prefill(_prompts(0, [5, 6]), max_new_tokens=4)
  np.testing.assert_allclose(np.asarray(state.drafter_state.est[1, 0]), [0.9] + [0.4] * 6)
  with pytest.raises(ValueError, match=r"in \[0, 1\]"):
    CostTable({1: {1: 1.0}}, acceptance=(1.5,))


@pytest.mark.parametrize("method", ["draft_model", "eagle3"])
def test_serial_drafters_draft_only_what_they_are_asked_for(tiny, method):
  """propose(num=n) gives the first n tokens (and q) of the full draft with the same key, zeros
  after, Draft.length = n; the adaptive wrapper picks its width before drafting for them."""
  from jspec.drafters.eagle3 import Eagle3Config, Eagle3Head
  kw = dict(draft_model=tiny)
  if method == "eagle3":
    kw = dict(draft_model=Eagle3Head(Eagle3Config.for_target(CFG, taps=(0, 1, 1)),
                                     rngs=nnx.Rngs(2)))
  sd = SpecDecoder(tiny, {"method": method, "num_speculative_tokens": 4}, **kw)
  state, sampling = sd.prefill(_prompts(0, [8, 10], repeat=2), max_new_tokens=20,
                               temperature=0.8)
  propose = jax.jit(lambda st, num: sd.drafter.propose(sd.drafter_params, st.drafter_state,
                                                       st.context(sampling), st.keys, num=num))
  full, _ = jax.jit(lambda st: sd.drafter.propose(sd.drafter_params, st.drafter_state,
                                                  st.context(sampling), st.keys))(state)
  for n in (1, 2, 4):
    part, _ = propose(state, jnp.int32(n))
    np.testing.assert_array_equal(np.asarray(part.tokens[:, :n]), np.asarray(full.tokens[:, :n]))
    assert not np.asarray(part.tokens[:, n:]).any() and np.asarray(part.length).tolist() == [n, n]
    np.testing.assert_allclose(np.asarray(part.q[:, :n]), np.asarray(full.q[:, :n]), atol=1e-6)
  # (greedy identity of the adaptive serial drafters: test_adaptive_matches_plain_greedy_without_
  # recompiling[draft_model] here, test_greedy_identity[eagle3_auto] on the default model)
  auto = SpecDecoder(tiny, {"method": method, "num_speculative_tokens": "auto"}, **kw)
  assert auto.drafter.choose_before_drafting


def test_plain_rounds_decode_several_steps_and_keep_the_head_in_step(tiny):
  """A plain round (length 0) decodes plain_block target steps: greedy output equals plain
  decoding, every counted forward yields one token (AL exactly 1 when only plain rounds run),
  and an EAGLE-3 head driven through a mix of plain and drafting rounds (its commit narrowed to
  each round's block) ends in the state a fresh prefill of the same tokens gives it."""
  prompts = _prompts(0, [8, 10], repeat=3) + _prompts(1, [7])
  plain = Decoder(tiny).generate(prompts, max_new_tokens=21, eos=False)
  forced = CostTable({1: {1: 1.0}}, round={1: {0: 0.1, 1: 50.0, 3: 50.0}})
  sd = SpecDecoder(tiny, {"method": "ngram", "num_speculative_tokens": 3,
                          "draft_lengths": [0, 1, 3]}, cost_table=forced, time_rounds=False)
  assert sd.drafter.plain_block == 4
  out = sd.generate(prompts, max_new_tokens=21, eos=False)
  assert out.token_ids == plain.token_ids
  assert out.verified_lengths == {0: out.steps, 1: 0, 3: 0} and out.steps == 5   # 1 + 4 x 5 tokens
  assert out.acceptance_length == 1.0 and out.rounds == len(prompts) * 20

  from jspec.drafters.eagle3 import Eagle3Config, Eagle3Head
  head = Eagle3Head(Eagle3Config.for_target(CFG, taps=(0, 1, 1)), rngs=nnx.Rngs(2))
  sd = SpecDecoder(tiny, {"method": "eagle3", "num_speculative_tokens": 3,
                          "draft_lengths": [0, 1, 3]}, draft_model=head,
                   cost_table=CostTable({1: {1: 1.0, 2: 1.05, 4: 1.1}}))
  state, sampling = sd.prefill(prompts[:1], max_new_tokens=40, eos=False)
  base = sd.drafter_params
  for k in [0, 2, 0, 1, 0, 0, 2, 0]:        # force the lengths 0, 3, 0, 1, ... (as jspec plan does)
    forced = dataclasses.replace(base, cost=jnp.where(jnp.arange(3) == k, 1.0, 1e3)
                                 * jnp.ones_like(base.cost))
    before = np.asarray(state.drafter_state.chosen)
    state = engine.spec_round(sd.graphdef, sd.weights, sd.drafter, forced, state, sampling,
                              eos_ids=())
    assert np.flatnonzero(np.asarray(state.drafter_state.chosen) - before).tolist() == [k]
  n = int(state.length[0])
  fresh, _ = sd.prefill([np.asarray(state.tokens[0, :n - 1]).tolist()], max_new_tokens=2,
                        eos=False)
  assert int(fresh.tokens[0, n - 1]) == int(state.tokens[0, n - 1])
  for a, b in [(state.drafter_state.inner.feature, fresh.drafter_state.inner.feature),
               (state.drafter_state.inner.logits, fresh.drafter_state.inner.logits)]:
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-4)


def test_serial_drafters_explore_one_past_the_verified_length(tiny):
  """A serial drafter is asked for the drafts it verifies, one more in every explore_every-th
  round (and one in a plain round): forced to D = 1 with the target as its own draft model
  (every draft accepted), the estimate of position 2 moves only after exploring rounds, that of
  position 3 never."""
  from jspec.drafters.model_free.ngram import NgramDrafter
  w = AdaptiveDrafter(NgramDrafter(7))
  got = [[int(w.num_to_draft(jnp.int32(k), jnp.int32(r), jnp.full((2,), w.lengths[k])))
          for r in range(1, 9)] for k in range(len(w.lengths))]
  want = [[min(d + (1 if d == 0 or r % 4 == 0 else 0), 7) for r in range(1, 9)]
          for d in w.lengths]
  assert got == want
  assert int(AdaptiveDrafter(NgramDrafter(7), explore_every=0).num_to_draft(
      jnp.int32(1), jnp.int32(4), jnp.ones((1,), jnp.int32))) == 1
  with pytest.raises(ValueError, match="explore_every"):
    AdaptiveDrafter(NgramDrafter(3), explore_every=-1)
  with pytest.raises(ValueError, match="rate_decay"):
    AdaptiveDrafter(NgramDrafter(3), rate_decay=0.0)

  sd = SpecDecoder(tiny, {"method": "draft_model", "num_speculative_tokens": 3,
                          "draft_lengths": [0, 1, 3]}, draft_model=tiny,
                   cost_table=CostTable({1: {1: 1.0}}, round={1: {0: 50.0, 1: 1.0, 3: 50.0}}))
  state, sampling = sd.prefill(_prompts(0, [8]), max_new_tokens=40, eos=False)
  moved = []
  for _ in range(9):
    r = int(state.round) + 1
    before = np.asarray(state.drafter_state.est)[:, 0]     # [B, D]: the one regime
    state = engine.spec_round(sd.graphdef, sd.weights, sd.drafter, sd.drafter_params, state,
                              sampling, eos_ids=())
    after = np.asarray(state.drafter_state.est)[:, 0]
    assert after[0, 0] > before[0, 0] or after[0, 0] == pytest.approx(1.0)
    assert after[0, 2] == before[0, 2]
    if after[0, 1] != before[0, 1]:
      moved.append(r)
  assert moved == [4, 8]
  assert np.asarray(state.drafter_state.chosen).tolist() == [0, 9, 0]


def _finish_choice(est, draft_len, live, lengths, cost, plain, rem, rate):
  """A direct NumPy reading of the batch rule in the jspec.adaptive docstring."""
  est, cost = np.asarray(est, np.float64), np.asarray(cost, np.float64)
  rem, rate = np.maximum(np.asarray(rem, np.float64), 1), np.asarray(rate, np.float64)
  al = np.ones((est.shape[0], len(lengths)))
  for b in range(est.shape[0]):
    for k, d in enumerate(lengths):
      if d == 0:
        al[b, k] = plain
      for i in range(min(d, int(draft_len[b]))):
        al[b, k] += np.prod(est[b, :i + 1])
  live = np.asarray(live)
  tau = np.sqrt(rem[live].mean()) / (2 * rate[live].mean())
  finish = cost[None, :] + np.maximum(rem[:, None] - al, 0) / rate[:, None]
  j = [tau * np.log(np.sum(np.exp(finish[live, k] / tau))) for k in range(len(lengths))]
  return int(np.argmin(j))


def test_choice_by_the_row_that_finishes_last():
  """With `remaining` and the rows' long-run rates: the length after which the batch is projected
  to finish soonest, the max over rows softened by the spread of the finish times."""
  est = jnp.asarray([[0.8, 0.8, 0.8], [0.8, 0.8, 0.8]], jnp.float32)
  lengths, live, plain = (0, 1, 3), jnp.asarray([True, True]), 3
  cost = jnp.asarray([3.3, 1.1, 1.4])           # a plain round: 3 steps at 1.1
  draft_len, rem = jnp.asarray([3, 0]), jnp.asarray([40, 40])     # row 1: no match this round
  # row 0 makes 3 / 1.8 / 2.952 tokens (D = 0, 1, 3), row 1 3 / 1 / 1. Equal rates (1 token per
  # unit): finishes 40.3 / 39.3 / 38.448 and 40.3 / 40.1 / 40.4; tau = sqrt(40) / 2 = 3.16 makes
  # D = 3 the best (41.76 vs 42.49, 41.92), as by the rows' summed progress. The rule that priced
  # every round at this round's tokens, cost_k max_b R_b / AL_b(k), let the row without a match
  # force a plain round (44, 44, 56).
  equal = jnp.asarray([1.0, 1.0])
  assert int(choose_length(est, draft_len, live, lengths, cost, plain, rem, equal)) == 2
  # row 1 making half the tokens per unit over earlier rounds: it decides the batch, and this
  # round gives it nothing past a plain round's (finishes 77.3 / 79.1 / 79.4)
  slow = jnp.asarray([1.0, 0.5])
  assert int(choose_length(est, draft_len, live, lengths, cost, plain, rem, slow)) == 0
  # ... unless it is done: a finished row does not count, whatever it has left
  assert int(choose_length(est, draft_len, jnp.asarray([True, False]), lengths, cost, plain, rem,
                           slow)) == 2
  # against a direct reading of the rule, random batches near and far from the end
  rng = np.random.default_rng(0)
  for _ in range(40):
    e = rng.uniform(0.05, 0.95, (4, 3)).astype(np.float32)
    dl, r = rng.integers(0, 4, 4), rng.integers(1, 30, 4)
    rt, lv = rng.uniform(0.5, 2.5, 4), rng.random(4) < 0.8
    lv[0] = True
    c = np.sort(rng.uniform(0.9, 2.0, 3)) * np.asarray([3.0, 1.0, 1.0])
    got = int(choose_length(jnp.asarray(e), jnp.asarray(dl), jnp.asarray(lv), lengths,
                            jnp.asarray(c, jnp.float32), plain, jnp.asarray(r),
                            jnp.asarray(rt, jnp.float32)))
    assert got == _finish_choice(e, dl, lv, lengths, c, plain, r, rt)
  # one row, its rate the best AL / cost (the default): the same choice as by AL per cost
  for c in ([3.6, 1.1, 1.5], [2.0, 1.1, 3.0], [3.0, 2.0, 2.1]):
    c = jnp.asarray(c)
    assert int(choose_length(est[:1], draft_len[:1], live[:1], lengths, c, 3, rem[:1])) == \
        int(choose_length(est[:1], draft_len[:1], live[:1], lengths, c, 3))


def test_rows_token_rates_follow_earlier_rounds():
  """observe folds each live row's tokens per unit of the verified length's cost into its rate
  (rate_decay); before any round the rate is the best AL / cost with every position proposed."""
  from jspec.adaptive import AdaptiveParams, AdaptiveState
  from jspec.drafters.model_free.ngram import NgramDrafter
  w = AdaptiveDrafter(NgramDrafter(3), lengths=(0, 1, 3))
  params = AdaptiveParams(None, jnp.asarray([[[3.3, 1.1, 1.4]]]), jnp.full((3,), 0.5),
                          jnp.zeros((1,)))
  est = jnp.asarray([[[0.5, 0.5, 0.5]], [[0.9, 0.9, 0.9]]], jnp.float32)    # [B, 1 regime, D]
  state = AdaptiveState(None, est, jnp.zeros((2,), jnp.int32), jnp.full((2,), 3, jnp.int32),
                        jnp.zeros((3,), jnp.int32), jnp.zeros((), jnp.int32),
                        jnp.ones((1,)), jnp.zeros((2,), jnp.float32))
  assert w.plain_block == 4
  # AL with 3 proposals: row 0 4 / 1.5 / 1.875, row 1 4 / 1.9 / 3.439 -> best per cost 1.364, 2.456
  prior = np.asarray([max(4 / 3.3, 1.5 / 1.1, 1.875 / 1.4), max(4 / 3.3, 1.9 / 1.1, 3.439 / 1.4)])
  emitted = jnp.zeros((2, 4), jnp.int32)
  live = jnp.asarray([True, False])
  out = w.observe(params, state, jnp.int32(2), jnp.full((2,), 3), jnp.asarray([3, 0]), emitted,
                  emitted[:, 1:],
                  jnp.asarray([3, 3]), live)
  assert float(out.rate[0]) == pytest.approx(prior[0] + 0.1 * (4 / 1.4 - prior[0]), rel=1e-5)
  assert float(out.rate[1]) == 0.0                       # a finished row keeps its rate
  again = w.observe(params, out, jnp.int32(0), jnp.zeros((2,), jnp.int32), jnp.asarray([0, 0]),
                    emitted, emitted[:, 1:], jnp.asarray([3, 3]), jnp.asarray([True, True]))
  r0 = float(out.rate[0])
  # a plain round: its 4 steps' tokens over its cost
  assert float(again.rate[0]) == pytest.approx(r0 + 0.1 * (4 / 3.3 - r0), rel=1e-5)
  assert float(again.rate[1]) == pytest.approx(prior[1] + 0.1 * (4 / 3.3 - prior[1]), rel=1e-4)


def test_timed_rounds_force_each_length_and_leave_the_run_alone(tiny):
  """time_rounds runs each compiled length alone (from copies of one prefilled state, which stays
  usable), and generate then chooses by those costs: its output is the one a decoder given the
  same costs by hand produces at temperature > 0 (the timing runs drew none of its random numbers),
  and later calls neither re-time nor recompile."""
  from jspec.adaptive import time_rounds, with_round_costs
  cfg = {"method": "ngram", "num_speculative_tokens": 3, "draft_lengths": [0, 1, 3]}
  sd = SpecDecoder(tiny, cfg)
  prompts = _prompts(0, [8, 10], repeat=3)
  state, sampling = sd.prefill(prompts, max_new_tokens=30, eos=False)
  seen = []

  def run(params, st):
    out = engine.spec_generate(sd.graphdef, sd.weights, sd.drafter, params, st, sampling,
                               eos_ids=())
    seen.append(np.asarray(out.drafter_state.chosen).tolist())
    return out

  seconds = time_rounds(run, sd.drafter_params, state, sd.drafter.lengths, tokens=12, repeats=2)
  assert sorted(seconds) == [0, 1, 3] and all(0 < s < 10 for s in seconds.values())
  # each run verified one length only; an untimed pass, then the passes in alternating order
  assert [int(np.flatnonzero(c)[0]) for c in seen] == [2, 1, 0, 0, 1, 2, 2, 1, 0]
  assert all(np.count_nonzero(c) == 1 for c in seen)
  assert int(state.round) == 0 and not np.asarray(state.done).any()    # the state is not consumed

  kw = dict(max_new_tokens=30, eos=False, temperature=0.8, seed=3)
  out = sd.generate(prompts, **kw)
  assert sorted(out.round_costs) == [0, 1, 3] and out.compile_s > 0
  fixed = SpecDecoder(tiny, cfg, time_rounds=False)
  fixed.drafter_params = with_round_costs(fixed.drafter_params, out.round_costs)
  again = fixed.generate(prompts, **kw)
  assert again.token_ids == out.token_ids and again.verified_lengths == out.verified_lengths
  with count_compiles() as c:
    later = sd.generate(prompts, **kw)
  assert c.count == 0 and later.round_costs == out.round_costs and later.compile_s < 1.0
  assert later.token_ids == out.token_ids and again.round_costs == {}


def test_timed_passes_are_normalised_for_a_busy_machine():
  """A pass run while the machine was slow counts at the others' pace: three passes, two slowed
  1.5x, with a one-off spike (2x) on a different length in the fast pass and a slow one, give times
  proportional to the true ones; the fastest time per length (a length's only fast pass spiked)
  does not."""
  from jspec.adaptive import pass_normalised
  true = np.asarray([4.0, 1.0, 1.2, 1.5])
  spike = lambda k: np.where(np.arange(4) == k, 2.0, 1.0)
  passes = [true * spike(0), 1.5 * true, 1.5 * true * spike(1)]
  got = np.asarray(pass_normalised([p.tolist() for p in passes]))
  np.testing.assert_allclose(got / got[2], true / true[2], rtol=1e-12)
  fastest = np.min(passes, axis=0)
  assert abs(fastest[0] / fastest[2] - true[0] / true[2]) > 1.0
  # a clean set of passes keeps its times
  np.testing.assert_allclose(pass_normalised([true.tolist()] * 3), true, rtol=1e-12)
