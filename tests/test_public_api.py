"""Every package declares its public face (``__all__``), and every name it declares is there:
a module of the package or an attribute its ``__init__`` provides (lazily or not)."""
import importlib
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "mlsys_jax"
PACKAGES = sorted(".".join(p.parent.relative_to(PKG.parent).parts) for p in PKG.rglob("__init__.py"))


@pytest.mark.parametrize("name", PACKAGES)
def test_the_package_declares_what_it_exports(name):
    package = importlib.import_module(name)
    declared = getattr(package, "__all__", None)
    assert declared, f"{name}/__init__.py declares no __all__"
    for attr in declared:
        found = hasattr(package, attr) or importlib.util.find_spec(f"{name}.{attr}") is not None
        assert found, f"{name}.__all__ names {attr!r}, which it does not provide"


def test_the_root_exports_the_commands_as_functions():
    """``mlsys_jax.inspect/optimize/remat/shard/plan`` (docs/api.md), lazily: each is callable,
    and ``mlsys_jax.remat`` stays the package of the planners too."""
    import mlsys_jax

    for name in ("inspect", "optimize", "remat", "shard", "plan"):
        assert name in mlsys_jax.__all__ and callable(getattr(mlsys_jax, name))
    assert importlib.import_module("mlsys_jax.remat") is mlsys_jax.remat
