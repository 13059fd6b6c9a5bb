"""The rewrite rules, one module each (docs/architecture.md "Adding a rule").

A rule module holds its anchor pattern (``match``), its preconditions (named ``Precondition``s), its emit
and its registry entry (``RULE``: kind, search move, exactness caveat), plus the public factory
named like the rule (``fold_conv_bn()``); ``passes/registry.py`` lists the modules. What they
share: the semantic view of linear ops (``linear``: which output axes a conv's or a matmul's
weights own), the affine view of what follows one (``affine``, proved per feature from the
dataflow by ``axes``), and the machinery that turns a rule into a verified, validated pass
(``rule``, ``level``).
"""
