"""Imports point one way (DESIGN.md §2), and only compat.py touches jax._src."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "mlsys_jax"
# A layer may import only from the layers listed for it (and from itself).
ALLOWED = {
    "ir": {"ir", "compat", "errors"},
    "cost": {"cost", "ir", "compat", "errors"},
}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_only_compat_touches_jax_internals():
    offenders = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                 if p.name != "compat.py" and any(m.startswith("jax._src") for m in imports(p))]
    assert offenders == []


def test_lower_layers_do_not_import_higher_ones():
    for layer, allowed in ALLOWED.items():
        for path in (PKG / layer).rglob("*.py"):
            for mod in imports(path):
                if mod.startswith("mlsys_jax."):
                    assert mod.split(".")[1] in allowed, f"{path.relative_to(PKG)} imports {mod}"
