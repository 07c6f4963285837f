"""Model-free drafters: n-gram prompt lookup, suffix trees, lookahead (Jacobi decoding) and
predicted outputs."""

from jspec.drafters.model_free import (lookahead, ngram, prediction,  # noqa: F401
                                       suffix)  # (registration)
