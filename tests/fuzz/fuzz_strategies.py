"""The fuzzer's hypothesis strategy, for property tests (re-exported from mlsys_jax.fuzz)."""
from mlsys_jax.fuzz.strategy import HypothesisChooser, specs

__all__ = ["HypothesisChooser", "specs"]
