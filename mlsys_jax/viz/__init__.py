"""Rendering helpers: optional matplotlib plots (``plots``, ``roofline``, ``memory``), the
`run all --report` writer (``report``), Chrome trace events (``trace``) and self-contained HTML
pages (``html``). Each is a module; matplotlib is imported inside them."""

__all__ = ["plots", "roofline", "memory", "report", "trace", "html"]
