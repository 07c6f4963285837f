"""Errors a user can hit while loading a model, each saying what to change."""


class ModelLoadError(RuntimeError):
  """A model, tokenizer or checkpoint could not be loaded."""


class UnsupportedModelError(ModelLoadError):
  """The checkpoint's architecture or an option of it is not implemented."""


class ModelFetchError(ModelLoadError):
  """Downloading or verifying model files failed."""
