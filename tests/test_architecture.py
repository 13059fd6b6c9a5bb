"""Imports point one way (DESIGN.md §2), and only compat.py touches jax._src."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "mlsys_jax"
# Lower layers never import higher ones. A module may import its own layer and any lower one.
# CLI front-ends (cli*.py) sit on top of everything and are exempt.
RANK = {"errors": 0, "compat": 0, "report": 1, "timing": 1, "runtime": 1, "ir": 2, "cost": 3,
        "models": 3, "passes": 4, "remat": 4, "parallel": 4, "execute": 5, "fuzz": 6, "viz": 6}


def mlsys_imports(path: Path) -> set[str]:
    """First component after ``mlsys_jax.`` of every mlsys_jax import in a file."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("mlsys_jax.")}
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("mlsys_jax."):
                out.add(node.module.split(".")[1])
            elif node.module == "mlsys_jax":
                out |= {a.name for a in node.names}
    return out


def layer_of(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def test_only_compat_touches_jax_internals():
    def touches(p):
        return any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("jax._src")
                   or isinstance(n, ast.Import) and any(a.name.startswith("jax._src") for a in n.names)
                   for n in ast.walk(ast.parse(p.read_text())))
    offenders = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if p.name != "compat.py" and touches(p)]
    assert offenders == []


def test_imports_point_one_way():
    bad = []
    for path in PKG.rglob("*.py"):
        if path.name.startswith("cli") or path.name == "__init__.py" and path.parent == PKG:
            continue
        layer = layer_of(path)
        assert layer in RANK, f"new layer {layer}: give it a rank in tests/test_architecture.py"
        for dep in mlsys_imports(path):
            if dep in RANK and RANK[dep] > RANK[layer]:
                bad.append(f"{path.relative_to(PKG)} ({layer}) imports {dep}")
    assert bad == []


def test_library_never_imports_experiments_or_benchmarks():
    # The library serves the experiments; only the command line (cli*) sits above them. The
    # report asks each experiment module for its plots instead of importing experiments.
    def imports_users(path):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] in ("experiments", "benchmarks") for n in names):
                return True
        return False
    offenders = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                 if not any(part.startswith("cli") for part in p.relative_to(PKG).parts)
                 and imports_users(p)]
    assert offenders == []


def _pass_name_literals(path: Path, names: set, own: dict) -> list[str]:
    """String constants equal to a pass name in one file, except a factory naming its own Pass
    (``own``: module → {function name}) and ``__all__`` lists."""
    module = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
    found = []

    def visit(node, inside: tuple):  # inside: the names of the enclosing functions
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__"
                                                for t in node.targets):
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside += (node.name,)
        if isinstance(node, ast.Constant) and node.value in names \
                and not (node.value in inside and node.value in own.get(module, ())):
            found.append(f"{path.relative_to(PKG)}:{node.lineno} {node.value!r}")
        for child in ast.iter_child_nodes(node):
            visit(child, inside)
    visit(ast.parse(path.read_text()), ())
    return found


# String constants that equal a pass name but mean something else.
NOT_PASS_NAMES = {("execute/_record.py", "inline")}  # jit's own `inline` parameter


def test_every_pass_name_comes_from_the_registry():
    """A pass is named in passes/registry.py and by its own factory, nowhere else: the CLI, the
    search, the fuzzer's campaign, oracles and mutants take names (and kinds) from the registry."""
    from mlsys_jax.passes import registry

    names = set(registry.NAMES)
    own: dict = {}
    for n, e in registry.PASSES.items():
        assert e.factory.__name__ == n, f"factory of {n!r} is {e.factory.__name__}"
        own.setdefault(e.factory.__module__, set()).add(n)
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        if path.relative_to(PKG) == Path("passes/registry.py"):
            continue
        bad += [hit for hit in _pass_name_literals(path, names, own)
                if (hit.split(":")[0], hit.split(" ")[1].strip("'")) not in NOT_PASS_NAMES]
    assert bad == []
