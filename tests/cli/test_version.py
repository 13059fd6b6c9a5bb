"""``mlsys-jax --version`` prints the package's version and starts no JAX."""
import subprocess
import sys

from mlsys_jax import __version__, cli


def test_version_in_process(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"mlsys-jax {__version__}\n"


def test_version_imports_no_jax():
    code = ("import sys; from mlsys_jax.cli.main import main; sys.argv = ['mlsys-jax', "
            "'--version']; main(); print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60).stdout.split()
    assert out == ["mlsys-jax", __version__, "False"]
