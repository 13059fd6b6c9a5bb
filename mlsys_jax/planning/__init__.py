"""How to split a user's training step over N devices (``mlsys-jax plan``): layouts as data
(``candidates``), the figures every layout shares (``facts``), each layout judged
(``assess``), the search (``search.plan``), the link figures (``links``) and the layout file
(``layout_file``). docs/plan.md has the model and its assumptions."""

__all__ = ["assess", "candidates", "facts", "layout_file", "links", "search"]
