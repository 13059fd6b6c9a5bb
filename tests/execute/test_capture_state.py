"""Capture and what the Python reads or changes outside its arguments (torch.compile's guards).

Every case is called several times through one ``capture`` wrapper, with the outside state
changed between calls, and every call must equal eager JAX bitwise — values, dtypes, weak types
(``fuzz.capture_oracle.compare``) — or run eagerly with the reason ``explain()`` names. Programs
are built in a namespace of their own (``module``), whose dict is their globals.
"""
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax.errors import MlsysError
from mlsys_jax.execute import capture, explain
from mlsys_jax.execute.capture.captured import MAX_RECORDINGS
from mlsys_jax.fuzz.capture_oracle import compare

F32 = jnp.float32
X = jnp.array([1.0, -2.0, 3.0], F32)


def module(source: str) -> dict:
    ns = {"jax": jax, "jnp": jnp, "np": np}
    exec(textwrap.dedent(source), ns)  # noqa: S102 - the test's own program
    return ns


def check_calls(c, fn, changes, *args):
    """Call ``c`` and eager ``fn`` after each change of the outside state; all equal."""
    for change in changes:
        change()
        for _ in range(3):  # cold or recorded again, then warm, then one program
            diff = compare(c(*args), fn(*args))
            assert diff is None, diff


def noop():
    pass


# --- reads: a changed guard records again, and explain() names it --------------------------

@pytest.mark.parametrize("new", [3.0, pytest.param(-0.0, marks=pytest.mark.slow),
                                 pytest.param(7, marks=pytest.mark.slow)],
                         ids=["float", "negative-zero", "int"])
def test_a_global_python_scalar_that_changes(new):
    m = module("""
        SCALE = 2.0
        def f(x):
            return x * SCALE if x.sum() > 0 else x - SCALE
    """)
    c = capture(m["f"])
    check_calls(c, m["f"], [noop, lambda: m.update(SCALE=new)], X)
    check_calls(c, m["f"], [noop], -X)
    e = explain(c, X)
    assert e.fallback is None and any("global 'SCALE'" in g for g in e.guards)
    assert any("global 'SCALE'" in f and "was 2.0" in f for f in e.guard_failures), e.guard_failures


def test_a_global_array_reassigned_and_a_numpy_array_changed_in_place():
    m = module("""
        W = jnp.ones(3)
        B = np.zeros(3, np.float32)
        def f(x):
            return x * W + B
    """)
    c = capture(m["f"])

    def in_place():
        m["B"][1] = 5.0

    check_calls(c, m["f"], [noop, lambda: m.update(W=jnp.full(3, 4.0)), in_place], X)
    failures = explain(c, X).guard_failures
    assert any("global 'W'" in f for f in failures)
    assert any("the contents of global 'B'" in f for f in failures), failures


@pytest.mark.slow
def test_self_attribute_of_a_bound_method_class_attribute_and_a_property():
    class Layer:
        SCALE = 2.0

        def __init__(self):
            self.w = jnp.ones(3)
            self._b = 0.5

        @property
        def b(self):
            return self._b

        def f(self, x):
            return x * self.w * self.SCALE + self.b

    layer = Layer()
    c = capture(layer.f)

    def new_w():
        layer.w = jnp.full(3, 3.0)

    def new_class_attr():
        Layer.SCALE = -1.0

    def shadow():
        layer.SCALE = 5.0

    def new_b():
        layer._b = 9.0

    check_calls(c, layer.f, [noop, new_w, new_class_attr, shadow, new_b], X)
    assert len(explain(c, X).guard_failures) == 4


def test_a_closure_read_and_an_outside_list_changed_between_calls():
    weights = [jnp.ones(3)]
    k = 2.0

    def f(x):
        for w in weights:
            x = x * w + k
        return x

    c = capture(f)

    def more():
        weights.append(jnp.full(3, -1.0))

    def rebind():
        nonlocal k
        k = -3.0

    check_calls(c, f, [noop, more, rebind], X)
    failures = explain(c, X).guard_failures
    assert any("the contents of closure variable 'weights'" in f for f in failures), failures
    assert any("closure variable 'k'" in f for f in failures), failures


def test_a_user_module_attribute_and_a_helper_read_through_a_call():
    cfg = module("OFFSET = 1.0\n")
    m = module("""
        def helper():
            return cfg.OFFSET
        def f(x):
            return x + helper()
    """)
    m["cfg"] = type(jax)("cfg")
    m["cfg"].OFFSET = 1.0
    c = capture(m["f"])
    check_calls(c, m["f"], [noop, lambda: setattr(m["cfg"], "OFFSET", 4.0)], X)
    del cfg


@pytest.mark.slow
def test_an_attribute_read_through_getattr_and_hasattr_with_a_constant_name():
    class Layer:
        def __init__(self):
            self.w = jnp.ones(3)

        def f(self, x):
            y = x * self.w + getattr(self, "b", 1.0)
            return y * 2 if hasattr(self, "flip") else y

    layer = Layer()
    c = capture(layer.f)

    def new_w():
        layer.w = jnp.full(3, 3.0)

    check_calls(c, layer.f, [noop, new_w, lambda: setattr(layer, "b", -2.0),
                             lambda: setattr(layer, "flip", True)], X)
    assert len(explain(c, X).guard_failures) == 3

    def views(x):  # C getters: the instance dict and the class
        return x * vars(layer)["w"] * layer.__dict__["w"] + type(layer).K + layer.__class__.J

    Layer.K = Layer.J = 1.0
    c = capture(views)
    check_calls(c, views, [noop, new_w, lambda: setattr(Layer, "K", 4.0),
                           lambda: setattr(Layer, "J", -4.0)], X)


def test_defaults_replaced_on_the_function_are_read_again():
    def f(x, s=2.0, *, t=1.0):
        return x * s + t

    c = capture(f)
    check_calls(c, f, [noop, lambda: setattr(f, "__defaults__", (3.0,)),
                       lambda: setattr(f, "__kwdefaults__", {"t": -1.0})], X)
    assert any("__kwdefaults__" in g for g in explain(c, X).guard_failures)


def test_a_guard_that_never_settles_runs_eagerly_and_says_why():
    m = module("""
        STEP = 0
        def f(x):
            return x * STEP
    """)
    c = capture(m["f"])
    for i in range(MAX_RECORDINGS + 4):
        m["STEP"] = i
        assert compare(c(X), m["f"](X)) is None
    assert c.stats["eager"] >= 3
    fallback = explain(c, X).fallback
    assert "global 'STEP'" in fallback and "run eagerly" in fallback, fallback


def test_the_hot_path_checks_its_guards():
    m = module("""
        SCALE = 2.0
        def f(x):
            return x * SCALE if x.sum() > 0 else x - SCALE
    """)
    c = capture(m["f"])
    for _ in range(4):  # both outcomes, then the settled tree's one program, called directly
        for x in (X, -X):
            c(x)
    assert c.hot, "the hot path is set"
    m["SCALE"] = 5.0
    assert compare(c(X), m["f"](X)) is None


def test_jaxs_float64_switch_is_a_guard():
    def f(x, s):
        return x * s + jnp.ones(3)  # the constant's dtype follows the switch

    c = capture(f)
    x = np.arange(3.0)
    for x64 in (False, True, False):
        with jax.enable_x64(x64):
            for _ in range(2):
                assert compare(c(jnp.asarray(x, F32), 2.0), f(jnp.asarray(x, F32), 2.0)) is None


# --- side effects: every call, or eagerly with the reason ----------------------------------

def test_a_list_append_and_a_print_run_on_every_call(capsys):
    calls = []

    def f(x):
        calls.append(1)
        print("called")
        return x * 2

    c = capture(f)
    for _ in range(3):
        assert compare(c(X), f(X)) is None
    assert len(calls) == 6 and capsys.readouterr().out.count("called") == 6
    assert "side effect" in explain(c, X).fallback


def test_a_closure_counter_and_an_attribute_write_run_on_every_call():
    def make():
        n = 0

        def g(x):
            nonlocal n
            n += 1
            return x * n
        return g

    g = make()
    c = capture(g)
    eager = make()
    for _ in range(3):
        assert compare(c(X), eager(X)) is None
    assert "writes closure variable 'n'" in explain(c, X).fallback

    class Counter:
        def __init__(self):
            self.count = 0

        def step(self, x):
            self.count += 1
            return x + self.count

    mine, theirs = Counter(), Counter()
    c = capture(mine.step)
    for _ in range(3):
        assert compare(c(X), theirs.step(X)) is None
    assert mine.count == theirs.count == 3


def test_an_iterator_and_a_deque_from_outside_are_consumed_on_every_call():
    import collections
    import itertools

    def make():
        steps, queue = itertools.count(1), collections.deque([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        return lambda x: x * next(steps) + queue.popleft()

    c, eager = capture(make()), make()
    for _ in range(4):
        assert compare(c(X), eager(X)) is None
    e = explain(c, X)
    assert "side effect" in e.fallback and "an iterator" in repr(e), e


def test_a_deferred_value_stored_outside_becomes_its_array_on_every_call():
    log, theirs = [], []

    def f(x, out):
        y = x * 2
        out.append(y)
        return y + 1

    c = capture(lambda x: f(x, log))
    for _ in range(3):
        assert compare(c(X), f(X, theirs)) is None
    assert len(log) == len(theirs) == 3
    assert all(compare(a, b) is None for a, b in zip(log, theirs))  # arrays, not tracers
    assert "side effect" in explain(c, X).fallback


def test_a_deferred_value_hidden_in_a_tuple_is_refused_then_runs_eagerly():
    store = []

    def f(x):
        y = x * 2
        store.append((y, 1))
        return y

    c = capture(f)
    with pytest.raises(MlsysError, match="escaped"):
        c(X)
    for _ in range(2):  # never replayed silently: eager from then on
        assert compare(c(X), f(X)) is None
    assert isinstance(store[-1][0], jax.Array) and c.stats["eager"] == 2


def test_changing_an_argument_container_reaches_the_caller():
    def f(state, x):
        state["calls"] = state.get("calls", 0) + 1
        return x * 2

    mine, theirs = {}, {}
    c = capture(f)
    for _ in range(3):
        assert compare(c(mine, X), f(theirs, X)) is None
    assert mine == theirs == {"calls": 3}


# --- types: what eager would not convert stays as eager returns it -------------------------

def test_numpy_in_numpy_out_keeps_float64():
    def f(a):
        return np.sin(a) * 2 + a, a.sum() > 1

    c = capture(f)
    for a in (np.arange(3.0), np.arange(3.0), np.arange(3.0) - 5, np.arange(3.0)):
        got, want = c(a), f(a)
        assert type(got[0]) is np.ndarray and got[0].dtype == np.float64
        assert np.array_equal(got[0], want[0]) and got[1] == want[1]


def test_numpy_arguments_of_jax_code_and_returned_numpy_arrays_are_fresh():
    def f(a, x):
        return jnp.sin(a) + x, a * 2

    c = capture(f)
    a = np.arange(3.0, dtype=np.float32)
    first = c(a, X)[1]
    first[0] = 99.0  # the caller changes the array it got: the next call returns a new one
    for _ in range(3):
        got, want = c(a, X), f(a, X)
        assert compare(got[0], want[0]) is None and np.array_equal(got[1], want[1])


def test_the_argument_pytree_structure_is_part_of_the_key():
    def f(p):
        return p[0] * 2 if isinstance(p, list) else p[0] - 1

    c = capture(f)
    for p in ([X], (X,), [X], (X,)):
        assert compare(c(p), f(p)) is None


def test_a_global_dict_item_a_swapped_function_and_a_mutable_default():
    m = module("""
        CFG = {"scale": 2.0}
        ACT = jnp.tanh
        def f(x, seen=[]):
            seen.append(1)  # a mutable default, changed on every call
            return ACT(x) * CFG["scale"]
        def g(x):
            return ACT(x) * CFG["scale"]
    """)
    c = capture(m["g"])
    check_calls(c, m["g"], [noop, lambda: m["CFG"].update(scale=-1.0),
                            lambda: m.update(ACT=jnp.sin)], X)
    c = capture(m["f"])
    for _ in range(3):
        c(X)
    assert len(m["f"].__defaults__[0]) == 3  # every call's append happened


def test_a_static_field_of_a_pytree_argument_is_from_outside():
    @jax.tree_util.register_pytree_node_class
    class Scaled:  # as equinox keeps a static field: in the pytree's auxiliary data
        def __init__(self, w, cfg):
            self.w, self.cfg = w, cfg

        def tree_flatten(self):
            return (self.w,), self.cfg

        @classmethod
        def tree_unflatten(cls, cfg, leaves):
            return cls(leaves[0], cfg)

        def __call__(self, x):
            return x * self.w * self.cfg["k"]

    cfg = {"k": 2.0}
    mod = Scaled(jnp.ones(3), cfg)
    c = capture(lambda m, x: m(x))
    check_calls(c, lambda m, x: m(x), [noop, lambda: cfg.update(k=5.0)], mod, X)


def test_a_read_capture_cannot_see_is_caught_when_a_known_path_records_differently():
    m = module("""
        import operator, types
        CFG = types.SimpleNamespace(k=2.0)
        def f(x):
            y = x * operator.attrgetter("k")(CFG)  # read by C code: not watched
            return y * 2 if y.sum() > 0 else y - 1
    """)
    c = capture(m["f"])
    for _ in range(3):
        c(X)
    m["CFG"].k = 3.0
    assert compare(c(-X), m["f"](-X)) is None  # a new outcome: recorded again, and it differs
    for x in (X, -X):
        assert compare(c(x), m["f"](x)) is None
    assert "different operations" in explain(c, X).fallback
