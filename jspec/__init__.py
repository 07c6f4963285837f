"""jspec: lossless speculative decoding for JAX/XLA."""

from jspec.compile_count import count_compiles
from jspec.decode import Decoder, DecodeOutput
from jspec.sampling import SamplingParams, process_logits, sample

__all__ = ["Decoder", "DecodeOutput", "SamplingParams", "count_compiles", "process_logits", "sample"]
