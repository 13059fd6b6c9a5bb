"""Which equations of a loss mix examples: the batch axis followed through a jaxpr (``axis``), the
per-primitive table of how each moves or mixes it (``rules``: the batch rules), the moves
through slices, gathers and collectives (``moves``), scatters (``scatter``), loops and branches
(``loops``), equinox's primitives under ``vmap`` (``flags``), where a batch-independent value
varies (``uniform``), and the explanation a person reads (``explain``).
:mod:`mlsys_jax.parallel.shard.separability` confirms the verdict on gradients."""

__all__ = ["axis", "rules", "moves", "scatter", "loops", "flags", "uniform", "explain"]
