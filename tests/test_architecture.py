"""Imports point one way, no module imports itself back, only compat.py touches jax._src, and
no two public classes of the package share a name."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "mlsys_jax"
EXPERIMENTS = ROOT / "experiments"
BENCHMARKS = ROOT / "benchmarks"
# Lower layers never import higher ones; a module may import its own layer and any lower one.
# `experiments` (the lecture) and `benchmarks` (top-level packages) build on the whole library and
# the library never imports them; `cli` (the `mlsys-jax` command) sits on top of everything but
# `api` (the commands as Python functions, which call the commands' computing parts).
RANK = {"errors": 0, "compat": 0, "defaults": 0, "contexts": 0, "results": 1, "tables": 1, "timing": 1,
        "runtime": 1, "progress": 1, "ir": 2,
        "cost": 3, "models": 3, "passes": 4, "remat": 4, "parallel": 4, "execute": 5,
        "planning": 5, "fuzz": 6,
        "viz": 6, "experiments": 7, "benchmarks": 7, "cli": 8, "api": 9}


def imported_modules(path: Path) -> set[str]:
    """Dotted names of every module a file imports, at top level or inside a function.

    ``from a.b import c`` is an import of ``a.b.c`` when that is a module, else of ``a.b``.
    """
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if module_path(sub) else node.module)
    return out


def module_path(name: str) -> Path | None:
    """The file of a module of this repository (mlsys_jax.x.y, experiments.z), or None."""
    base = ROOT.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(name: str) -> str | None:
    """``mlsys_jax.passes.core`` -> passes; ``experiments.s01_autodiff`` -> experiments."""
    parts = name.split(".")
    if parts[0] in ("experiments", "benchmarks"):
        return parts[0]
    return parts[1] if parts[0] == "mlsys_jax" and len(parts) > 1 else None


def test_only_compat_touches_jax_internals():
    offenders = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if p.name != "compat.py"
                 and any(m.startswith("jax._src") for m in imported_modules(p))]
    assert offenders == []


def test_imports_point_one_way():
    bad = set()
    for path in [*PKG.rglob("*.py"), *EXPERIMENTS.rglob("*.py"), *BENCHMARKS.rglob("*.py")]:
        if path == PKG / "__init__.py":  # the package's lazy attributes, not a layer
            continue
        mine = layer(module_name(path))
        assert mine in RANK, f"new layer {mine}: give it a rank in tests/test_architecture.py"
        for dep in {layer(m) for m in imported_modules(path)} - {None}:
            if RANK[dep] > RANK[mine]:
                bad.add(f"{path.relative_to(ROOT)} ({mine}) "
                        f"imports {dep}")
    assert sorted(bad) == []


def import_graph() -> dict[str, set[str]]:
    """Module -> the repository's modules it imports (top level and function-local alike): the
    library, the lecture's experiments and the benchmarks."""
    graph = {module_name(p): set() for root in (PKG, EXPERIMENTS, BENCHMARKS)
             for p in root.rglob("*.py")}
    for name in graph:
        deps = imported_modules(module_path(name))
        graph[name] = {d for d in deps if d in graph and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [{"a", "b", "c"}]


def test_no_import_cycles_anywhere():
    graph = import_graph()
    # the graph is really built, over all three trees
    assert len(graph) > 50 and graph["mlsys_jax.cli.main"]
    assert graph["benchmarks.bench_passes"] and graph["experiments.s04_parallel"]
    found = cycles(graph)
    assert found == [], "import cycles: " + "; ".join(" ↔ ".join(sorted(c)) for c in found)


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
NOT_PASS_NAMES = {("execute/capture/recording.py", "inline")}  # jit's own `inline` parameter


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


def public_classes(root: Path = PKG) -> dict[str, list[str]]:
    """Every top-level public class under ``root``, by name: the files that define it."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found.setdefault(node.name, []).append(str(path.relative_to(root)))
    return found


def test_the_class_finder_sees_a_shared_name(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.py").write_text("class Plan:\n    pass\n\nclass _Private:\n    pass\n")
    found = public_classes(tmp_path)
    assert set(found) == {"Plan"} and len(found["Plan"]) == 2


def test_no_two_public_classes_share_a_name():
    shared = {name: where for name, where in public_classes().items() if len(where) > 1}
    assert not shared, f"public classes defined in more than one module: {shared}"


def test_shard_and_pipe_never_import_the_lecture():
    """A user's step (parallel/shard, parallel/pipe) runs on the shared floor, never on the
    lecture's shard_map steps (parallel/lecture)."""
    lecture = "mlsys_jax.parallel.lecture"
    bad = [f"{path.relative_to(PKG)} imports {m}"
           for wing in ("shard", "pipe") for path in sorted((PKG / "parallel" / wing).rglob("*.py"))
           for m in sorted(imported_modules(path)) if m == lecture or m.startswith(lecture + ".")]
    assert bad == []


# The two tables: what ZeRO stage k shards, and the mesh-axis vocabulary.
TABLES = ("parallel/stages.py", "parallel/axes.py")
AXIS_NAMES = {"data", "model", "pipe", "fsdp", "tensor"}
STAGE_TABLE_NAMES = {"STAGES", "ZERO_STAGES"}


def _strings(node) -> set[str]:
    """The strings of a literal tuple, list, set or dict's keys (also inside ``frozenset(...)``),
    when every element is one; else the empty set."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1 \
            and node.func.id in ("frozenset", "set", "tuple", "list"):
        node = node.args[0]
    elts = (node.keys if isinstance(node, ast.Dict) else
            node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [])
    if elts and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elts):
        return {e.value for e in elts}
    return set()


def second_tables(root: Path = PKG) -> list[str]:
    """Module-level definitions, outside the two tables, of a ZeRO stage tuple (``STAGES = ...``)
    or of a collection of mesh-axis names (a tuple, set or dict of "data", "model", ...)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if str(path.relative_to(root)) in TABLES:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            names = sorted(t.id for t in targets if isinstance(t, ast.Name))
            if names == ["__all__"]:  # a package's module names (lecture's ``data``), not axes
                continue
            where = f"{path.relative_to(root)}:{node.lineno} {', '.join(names)}"
            if STAGE_TABLE_NAMES & set(names):
                found.append(f"{where}: ZeRO stages belong in parallel/stages.py")
            elif _strings(value) & AXIS_NAMES:
                found.append(f"{where}: mesh-axis names belong in parallel/axes.py")
    return found


def test_the_table_finder_sees_second_definitions(tmp_path):
    (tmp_path / "a.py").write_text('STAGES = (0, 1, 2, 3)\nAXES = ("data", "model")\n'
                                   'ALIASES = {"tensor": "model"}\nNAMES = frozenset({"fsdp"})\n'
                                   'SECTIONS = ("intro", "outro")\n__all__ = ["data", "zero"]\n\n'
                                   'def f():\n    axes = ("data", "pipe")\n')
    found = second_tables(tmp_path)
    assert [f.split(" ")[1] for f in found] == ["STAGES:", "AXES:", "ALIASES:", "NAMES:"]


def test_one_stage_table_and_one_axis_vocabulary():
    """ZeRO's stages are defined in parallel/stages.py and the mesh-axis names in
    parallel/axes.py; every other module reads them from there."""
    assert second_tables() == []
