"""Target and draft language models for jspec: Llama-family decoders in Flax NNX, KV caches, loaders."""

from models.config import LlamaConfig
from models.errors import ModelFetchError, ModelLoadError, UnsupportedModelError
from models.kv_cache import KVCache
from models.llama import ForwardOutput, Llama
from models.registry import DEFAULT_MODEL, LoadedModel, load
from models.tokenizer import Tokenizer

__all__ = ["DEFAULT_MODEL", "ForwardOutput", "KVCache", "Llama", "LlamaConfig", "LoadedModel",
           "ModelFetchError", "ModelLoadError", "Tokenizer", "UnsupportedModelError", "load"]
