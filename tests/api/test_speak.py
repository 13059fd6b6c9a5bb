"""The library's and the commands' messages said with the API's keywords (``api/speak.py``),
and the function objects a child process can import again (``api/bridge.importable``)."""
import pytest

from mlsys_jax.api import bridge
from mlsys_jax.api.sharding import FLAGS as SHARD
from mlsys_jax.api.speak import translate
from tests.api import steps


@pytest.mark.parametrize("message, said", [
    ("--mesh data=4,model=2 uses 8 devices", "mesh={'data': 4, 'model': 2} uses 8 devices"),
    ("use --mesh data=N[,model=M]", "use mesh={'data': N, 'model': M}"),
    ("--zero must be one of 0, 1, 2, 3", "zero must be one of 0, 1, 2, 3"),
    ("--steps 0: too few", "steps=0: too few"),
    ("add --quick-compile --steps 2", "add quick_compile=True steps=2"),
    ("bind it: --axis-name NAME=data", "bind it: axis_names={'NAME': 'data'}"),
    ("start with --devices 8 (set before JAX starts)",
     "start with XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before importing jax) "
     "(set before JAX starts)"),
    ("mlsys-jax plan --emit writes one", "mlsys-jax plan --emit writes one"),
])
def test_flags_become_keywords(message, said):
    assert translate(message, SHARD) == said


def test_a_value_the_caller_gave_is_quoted_as_given():
    from mlsys_jax.api.inspecting import FLAGS

    said = translate("--dtype bf16: the 'here' model times its own dtypes; drop --dtype", FLAGS,
                     {"dtype": "bf16"})
    assert said == "dtype='bf16': the 'here' model times its own dtypes; drop dtype"


def _nested():
    def inner():
        return steps.linear()
    return inner


def test_importable_names_a_module_level_function_only():
    path = bridge.importable(steps.linear)
    assert path.endswith("tests/api/steps.py:linear")
    assert bridge.importable(lambda: steps.linear()) is None
    assert bridge.importable(_nested()) is None
    assert bridge.importable(print) is None                # no Python source file


def test_namespace_holds_the_commands_defaults():
    ns = bridge.namespace("shard", target="x.py:f")
    assert (ns.steps, ns.processes, ns.schedule, ns.axis_name) == (3, 1, "1f1b", [])
    with pytest.raises(TypeError, match="no option 'nope'"):
        bridge.namespace("shard", nope=1)
