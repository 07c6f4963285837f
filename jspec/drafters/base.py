"""The drafter interface every method implements, and the width-policy interface of the wrappers
that choose how many drafts a round verifies (jspec.adaptive, jspec.confidence).

A drafter is a frozen, hashable object holding only static configuration, so it can be a static
argument of `jax.jit`: subclass `Drafter` as a frozen dataclass. Its arrays live in two pytrees the
engine threads through the round: `params` (read-only weights; `None` for model-free drafters) and
`state` (caches, features; updated by `propose` and `commit`). All three methods run inside the
engine's single jitted round. The optional hooks are declared on `Drafter` with the defaults the
engine assumes; a method overrides only the ones it uses.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from jspec.sampling import SamplingParams, categorical, process_logits


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Draft:
  tokens: jax.Array             # [B, D] proposed tokens
  q: jax.Array | None = None    # [B, D, V] the processed distributions the tokens were sampled
                                # from; None for deterministic drafts (verified as one-hot)
  length: jax.Array | None = None   # [B] valid proposals per row (None = all D)
  extra: "ExtraTokens | None" = None   # tokens the target also runs in the verify forward
                                # without verifying them (lookahead decoding's Jacobi window)
  parent: jax.Array | None = None   # [B, D] a tree draft (jspec.tree): the block index of each
                                # node's parent, in [0, i] for node i (0 = the last committed
                                # token); nodes in topological order, D = the node count; q (if
                                # any) is each node's proposal distribution, siblings drawn i.i.d.
                                # from it; length = valid nodes. None = a chain.


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ExtraTokens:
  """E unverified tokens appended to the verify block [last, d_1..d_D]. Each sees the committed
  sequence (the last committed token included) and the extras `mask` allows, never the draft; the
  target's greedy token after each extra named by `outputs` comes back in commit's
  `ctx.extra_argmax`. Their K/V lands past the committed length (garbage the next round
  overwrites), so they change no committed token."""
  tokens: jax.Array             # [B, E]
  positions: jax.Array          # [B, E] RoPE offsets from the last committed token's position (>= 1)
  mask: jax.Array               # [B, E, E] bool: which extras each extra attends to
  outputs: jax.Array            # [B, K] int32 indices into the E extras to project to logits


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Context:
  """What a drafter may look at: the committed sequence, nothing from the future."""
  tokens: jax.Array             # [B, S] committed tokens (prompt + generated), padding after length
  length: jax.Array             # [B] committed tokens per row
  prompt_len: jax.Array         # [B]
  sampling: SamplingParams      # the rows' sampling settings (a sampling drafter uses them for q)
  target_hidden: tuple[jax.Array, ...] = ()   # [B, T, H] taps from the last target forward: the
                                # prompt's [B, P, H] in init_state, the verified block's
                                # [B, D+1, H] (positions length-1-num_new ...) in commit
  num_new: jax.Array | None = None   # [B] tokens the last round committed (accepted + 1, after
                                # EOS / length truncation; 0 for a finished row); None before
                                # the first round
  extra_argmax: jax.Array | None = None   # [B, K] in commit: the target's argmax after the
                                # extras the draft's ExtraTokens.outputs named; None otherwise
  request: Any = None           # in init_state: per-call drafter inputs given to generate (e.g.
                                # predicted outputs); None when there are none


class Drafter:
  """Subclass it (a frozen dataclass) and define num_draft, target_taps, init_state, propose and
  commit. The class attributes and methods after them are optional hooks, shown with their
  defaults."""
  num_draft: int                     # D, static
  target_taps: tuple[int, ...]       # hidden-state taps the drafter wants from every verify

  def init_state(self, params: Any, prompt: jax.Array, ctx: Context, max_len: int) -> Any:
    """Builds the drafter state after the target's prefill. prompt: [B, P] right-padded prompt
    tokens (lengths ctx.prompt_len); ctx already holds the first sampled token, and its
    target_hidden holds the prompt's taps [B, P, H]."""
    raise NotImplementedError

  def propose(self, params: Any, state: Any, ctx: Context, key: jax.Array) -> tuple[Draft, Any]:
    """Proposes D tokens per row following ctx.tokens[:, :ctx.length]. key: [B] per-row keys.
    A drafter with `variable_length` also takes `num` (a traced int32 in 1..D): it drafts only the
    first `num`, with Draft.length = num."""
    raise NotImplementedError

  def commit(self, params: Any, state: Any, ctx: Context) -> Any:
    """Sees the context after acceptance (lengths advanced by ctx.num_new, the verified block's
    taps: block position j < num_new holds the tap of committed position length-1-num_new+j);
    returns the new state."""
    raise NotImplementedError

  # Optional hooks.
  tree: bool = False                 # propose returns trees (Draft.parent); D is the node budget,
                                     # and adaptive widths do not apply
  variable_length: bool = False      # propose(num=...) drafts only `num` tokens: a drafter whose
                                     # cost grows with the drafts (a serial model), so that the
                                     # adaptive wrapper drafts only what it will verify
  num_extra: int = 0                 # E: unverified tokens (Draft.extra) every verify also runs
  confidence_schedule: bool = False  # the drafter has propose_with_confidence(params, state, ctx,
                                     # key) -> (Draft, [B, D] confidence logits): verified under
                                     # jspec.confidence's schedule
  temperatures: tuple[float, ...] = ()   # the confidences' per-position calibration (none: 1)
  regimes: int = 1                   # > 1: each round a row drafts in one of several regimes
                                     # (the hybrid: copy or learned), read before the round by
                                     # regime(params, state, ctx) -> ([B] regime, [B] drafts it
                                     # can propose); the adaptive length keeps an acceptance
                                     # estimate per regime

  def make_request(self, prediction: Sequence | None, batch_size: int, *, vocab_size: int,
                   tokenizer=None) -> Any:
    """The per-call drafter inputs (Context.request in init_state) from generate(prediction=...),
    checked before anything compiles. A drafter without per-call inputs takes none."""
    if prediction is not None:
      raise ValueError(f"prediction= needs the 'prediction' method; {type(self).__name__} takes "
                       "no per-call inputs")
    return None

  def after_generate(self, params: Any, prompts: Sequence, outputs: Sequence) -> Any:
    """The drafter params after a generate call (prompts and outputs as token lists), for a
    drafter that learns across calls (suffix decoding's global cache); unchanged by default."""
    return params


class WidthPolicy(Drafter):
  """A drafter wrapper that chooses each round, among compiled verify widths `lengths` (0 = a
  plain round), how many drafts the round verifies (jspec.adaptive, jspec.confidence). The engine
  verifies under `lax.switch` over the widths and writes the block's K/V once outside it."""
  lengths: tuple[int, ...]

  @property
  def fixed_index(self) -> int | None:
    """An index into `lengths` that every round verifies, known when the program is traced (the
    host chooses between such programs: `SpecDecoder(choice="host")`); None: chosen in the round."""
    return None

  @property
  def choose_before_drafting(self) -> bool:
    """Choose the width before propose, and ask the inner drafter for num_to_draft drafts."""
    raise NotImplementedError

  @property
  def plain_block(self) -> int:
    """Target steps a plain round (width 0) decodes."""
    raise NotImplementedError

  def prepare(self, params: Any, state: Any, ctx: Context) -> Any:
    """The state before the round's choice, from the committed context only (default: as is)."""
    return state

  def choose(self, params: Any, state: Any, draft_len: jax.Array, live: jax.Array,
             remaining: jax.Array | None = None) -> jax.Array:
    """[] the index into `lengths` this round verifies, from earlier rounds and this draft only."""
    raise NotImplementedError

  def num_to_draft(self, k: jax.Array, round_index: jax.Array, widths: jax.Array) -> jax.Array:
    """[] the drafts to ask for in a round verifying lengths[k], rows' widths [B]
    (choose_before_drafting)."""
    raise NotImplementedError

  def row_widths(self, params: Any, state: Any, draft_len: jax.Array, live: jax.Array,
                 k: jax.Array) -> jax.Array:
    """[B] the drafts each row verifies in a round at lengths[k] (default: lengths[k] for all)."""
    return jnp.broadcast_to(jnp.asarray(self.lengths, jnp.int32)[k], draft_len.shape)

  def block_width(self, k: int, batch: int) -> int:
    """The drafts the verify block of lengths[k] holds per row for `batch` rows (static): the
    widest a row may verify."""
    return self.lengths[k]

  def packed_tokens(self, k: int, batch: int) -> int | None:
    """The tokens the verify of lengths[k] runs when rows verify different widths (static; the
    projections see only those: `Llama(pack=...)`); None: the whole [B, 1 + block_width] block."""
    return None

  def observe(self, params: Any, state: Any, k: jax.Array, widths: jax.Array, n_acc: jax.Array,
              emitted: jax.Array, draft_tokens: jax.Array, draft_len: jax.Array,
              live: jax.Array) -> Any:
    """The state after the round's outcome (before commit); widths [B] as `row_widths`."""
    raise NotImplementedError

  def chosen(self, state: Any) -> jax.Array:
    """[len(lengths)] rounds that verified each width so far."""
    raise NotImplementedError


def draft_chain(step, carry, first: tuple[jax.Array, jax.Array | None], num_draft: int,
                num: jax.Array | None = None):
  """The serial part of a chain drafter: position 0's (token [B], q [B, V] | None) is `first`;
  step(carry, i) -> (carry, (token, q)) drafts position i = 1 .. num_draft - 1 (a scan), or only
  i < num (a traced count, for `propose(num=...)`: a while loop; later positions stay 0, their q
  zeros). Returns (carry, tokens [B, D], q [B, D, V] | None)."""
  tok0, q0 = first
  if num is None:
    carry, (toks, qs) = jax.lax.scan(step, carry, jnp.arange(1, num_draft))
    tokens = jnp.concatenate([tok0[:, None], jnp.moveaxis(toks, 0, 1)], axis=1)
    q = None if q0 is None else jnp.concatenate([q0[:, None], jnp.moveaxis(qs, 0, 1)], axis=1)
    return carry, tokens, q
  tokens = jnp.zeros((tok0.shape[0], num_draft), jnp.int32).at[:, 0].set(tok0)
  q = None if q0 is None else jnp.zeros(q0.shape[:1] + (num_draft,) + q0.shape[1:],
                                        q0.dtype).at[:, 0].set(q0)

  def body(c):
    i, carry, tokens, q = c
    carry, (tok, qi) = step(carry, i)
    return (i + 1, carry, tokens.at[:, i].set(tok),
            None if q is None else q.at[:, i].set(qi))

  _, carry, tokens, q = jax.lax.while_loop(lambda c: c[0] < num, body,
                                           (jnp.ones((), jnp.int32), carry, tokens, q))
  return carry, tokens, q


def draft_token(logits: jax.Array, sampling: SamplingParams, key: jax.Array, step: int | jax.Array,
                sample: bool) -> tuple[jax.Array, jax.Array | None]:
  """One draft token per row from [B, V] logits: argmax with q=None when `sample` is False, else a
  draw from the processed distribution (the rows' own temperature / top-k / top-p) with that q
  recorded [B, V]; greedy rows get the argmax and a one-hot q. key: [B] per-row keys."""
  best = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  if not sample:
    return best, None

  def draw(_):
    logp = process_logits(logits, sampling)
    ks = jax.vmap(jax.random.fold_in, (0, None))(key, step)
    q = jnp.exp(logp)
    return categorical(ks, q), q

  # All rows greedy: q is one-hot at the argmax; skip the processing and the noise.
  onehot = lambda _: (best, jax.nn.one_hot(best, logits.shape[-1], dtype=jnp.float32))
  return jax.lax.cond(jnp.all(sampling.greedy), onehot, draw, None)
