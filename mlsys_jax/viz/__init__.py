"""Rendering helpers: optional matplotlib plots (plots.py) and reports."""
