"""jspec: lossless speculative decoding for JAX/XLA."""

from jspec.compile_count import count_compiles
from jspec.config import SpeculativeConfig
from jspec.decode import Decoder, DecodeOutput
from jspec.drafters.base import Context, Draft, Drafter
from jspec.drafters.draft_model import DraftModelDrafter, layer_skip_model
from jspec.drafters.model_free.ngram import NgramDrafter
from jspec.sampling import SamplingParams, process_logits, sample
from jspec.spec_decode import SpecDecoder, SpecOutput

__all__ = ["Context", "Decoder", "DecodeOutput", "Draft", "DraftModelDrafter", "Drafter",
           "NgramDrafter", "SamplingParams", "SpecDecoder", "SpecOutput", "SpeculativeConfig",
           "count_compiles", "layer_skip_model", "process_logits", "sample"]
