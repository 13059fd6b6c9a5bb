"""Rendering helpers: optional matplotlib plots (``plots``, ``roofline``, ``memory``) and the
`run all --report` writer (``report``). Each is a module; matplotlib is imported inside them."""

__all__ = ["plots", "roofline", "memory", "report"]
