"""No function of the library takes more than 8 positional parameters: past that, settings are
keyword-only (or an options value), so a call says what each one is."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "mlsys_jax"
MOST = 8


def positional_offenders(root: Path = PKG) -> list[str]:
    """``file:line name (n)`` of each function with more than MOST positional parameters, not
    counting ``self``/``cls``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                names = [a.arg for a in node.args.posonlyargs + node.args.args
                         if a.arg not in ("self", "cls")]
                if len(names) > MOST:
                    name = getattr(node, "name", "lambda")
                    found.append(f"{path.relative_to(root)}:{node.lineno} {name} ({len(names)})")
    return found


def test_the_finder_sees_a_long_signature_and_not_keyword_only_ones(tmp_path):
    (tmp_path / "m.py").write_text("def wide(a, b, c, d, e, f, g, h, i):\n    pass\n\n"
                                   "def fine(self, a, b, c, d, e, f, g, h, *, i, j):\n    pass\n")
    assert positional_offenders(tmp_path) == ["m.py:1 wide (9)"]


def test_no_function_takes_more_than_eight_positional_parameters():
    assert positional_offenders() == []
