"""The machinery every rewrite rule is built on (the rules themselves are :mod:`passes.rules`).

``rule`` is what a rule is and how one becomes a verified, validated pass (``Rule.make_pass``);
``level`` is one jaxpr level as a rule sees it (constants known, consumers, the emit); ``linear``
the semantic view of linear ops (which output axes a conv's or a matmul's weights own);
``affine`` the affine view of what follows one, proved per feature from the dataflow by ``axes``;
``fold`` the fold algebra for any linear site; ``mutate`` the helpers a rule's deliberately
broken variants (its mutants) are written with. Nothing here imports a rule or a pass.
"""

__all__ = ["rule", "level", "linear", "affine", "axes", "fold", "mutate"]
