"""Differential testing of passes on random programs, oracles in tiers, mutants (docs/verification.md)."""
from mlsys_jax.fuzz.spec import Knobs, Spec, generate, generate_seeded, program_seed

__all__ = ["Knobs", "Spec", "generate", "generate_seeded", "program_seed"]
