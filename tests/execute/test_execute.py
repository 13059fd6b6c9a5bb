"""Graph executor (partial execution, refcount frees, liveness-equal peak) and tape-mode AD."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax.cost import liveness
from mlsys_jax.errors import MlsysError
from mlsys_jax.execute import tape as T
from mlsys_jax.execute.executor import grad_graph, make_graph, run
from mlsys_jax.models import mlp_init, mlp_loss, mnist_batch
from mlsys_jax.models.mlp import softmax_xent


@pytest.fixture(scope="module")
def mlp64():
    p = mlp_init(jax.random.key(0), sizes=(20, 12, 5), dtype=jnp.float64)
    x, y = mnist_batch(jax.random.key(1), 6, jnp.float64, sizes=(20, 12, 5))
    return p, x, y


def with_aux(params, x, y):
    h = jax.nn.relu(x @ params["W1"] + params["b1"])
    loss = softmax_xent(h @ params["W2"] + params["b2"], y)
    aux = jnp.mean(jnp.tanh(h), axis=0)  # a monitoring statistic nobody needs for the loss
    return {"loss": loss, "aux": aux}


def _feed(g, *args):
    return dict(zip(g.input_names, jax.tree_util.tree_leaves(args)))


@pytest.mark.slow
def test_partial_execution_runs_only_what_fetches_need(mlp64):
    p, x, y = mlp64
    g = make_graph(with_aux, p, x, y)
    assert g.output_names == ("aux", "loss")
    both = run(g, ["loss", "aux"], _feed(g, p, x, y))
    loss_only = run(g, ["loss"], _feed(g, p, x, y))
    aux_only = run(g, ["aux"], {k: v for k, v in _feed(g, p, x, y).items() if k != "y"})
    assert loss_only.stats.ops_executed < both.stats.ops_executed
    assert "softmax_xent" not in aux_only.stats.op_names  # y is not even needed
    want = with_aux(p, x, y)
    assert np.array_equal(both.by_name["loss"], want["loss"])
    assert np.array_equal(both.by_name["aux"], want["aux"])
    assert loss_only.stats.freed > 0


@pytest.mark.slow
def test_peak_bytes_equal_liveness(mlp64):
    p, x, y = mlp64
    g = grad_graph(mlp_loss, p, x, y)
    r = run(g, g.output_names, _feed(g, p, x, y))
    assert r.stats.peak_bytes == liveness(g.closed).peak_bytes
    from mlsys_jax.passes import prune_outputs

    ga = make_graph(with_aux, p, x, y)
    ra = run(ga, ["loss"], _feed(ga, p, x, y))
    pruned = prune_outputs(ga.closed, [ga.output_names.index("loss")])
    assert ra.stats.peak_bytes == liveness(pruned).peak_bytes
    assert ra.stats.equations_executed == len(pruned.jaxpr.eqns)


@pytest.mark.slow
def test_graph_and_tape_gradients_bitwise_equal(mlp64):
    p, x, y = mlp64
    g = grad_graph(mlp_loss, p, x, y)
    r = run(g, g.output_names, _feed(g, p, x, y))
    P = {k: T.Tensor(v, requires_grad=True) for k, v in p.items()}
    h = T.relu(T.Tensor(x) @ P["W1"] + P["b1"])
    loss = T.apply(softmax_xent, h @ P["W2"] + P["b2"], T.Tensor(y), name="softmax_xent")
    loss.backward()
    assert np.array_equal(loss.value, r.by_name["loss"])
    for k in p:
        assert np.array_equal(P[k].grad, r.by_name[f"grad/{k}"]), k


@pytest.mark.slow
def test_tape_requires_grad_skips_work_and_adjoints_sum():
    x = T.Tensor(jnp.arange(6.0, dtype=jnp.float64).reshape(2, 3))
    w = T.Tensor(jnp.ones((3, 2), jnp.float64), requires_grad=True)
    T.COUNTER.reset()
    (x @ w).sum().backward(count_ops=True)
    skipped = T.COUNTER.backward
    w.grad = None
    T.COUNTER.reset()
    with T.all_input_grads():
        (x @ w).sum().backward(count_ops=True)
    assert T.COUNTER.backward > skipped and x.grad is None
    # paths meet: d/da of a*a + a = 2a + 1
    a = T.Tensor(jnp.array([1.5, -2.0], jnp.float64), requires_grad=True)
    (a * a + a).sum().backward()
    assert np.array_equal(a.grad, 2 * a.value + 1)
    # exercise 2: the bias of a broadcast add gets the batch-sum of adjoints
    b = T.Tensor(jnp.zeros(3, jnp.float64), requires_grad=True)
    ((x + b) * 2.0).sum().backward()
    assert np.array_equal(b.grad, np.full(3, 4.0))


def test_tape_errors():
    w = T.Tensor(jnp.ones(3, jnp.float64), requires_grad=True)
    loss = (w * 2.0).sum()
    loss.backward()
    with pytest.raises(MlsysError, match="retain_graph=True"):
        loss.backward()
    kept = (w * 3.0).sum()
    kept.backward(retain_graph=True)
    kept.backward()
    with pytest.raises(MlsysError, match="does not require grad"):
        T.Tensor(jnp.ones(2)).sum().backward()
    with pytest.raises(MlsysError, match="non-scalar"):
        (w * 2.0).backward()


def test_executor_bad_input(mlp64):
    p, x, y = mlp64
    g = make_graph(with_aux, p, x, y)
    feed = _feed(g, p, x, y)
    with pytest.raises(MlsysError, match="not a value of this graph"):
        run(g, ["logits"], feed)
    with pytest.raises(MlsysError, match="expects f64\\[6,20\\]"):
        run(g, ["loss"], {**feed, "x": np.zeros((5, 20))})
    with pytest.raises(MlsysError, match="expects f64\\[6,20\\]"):
        run(g, ["loss"], {**feed, "x": np.zeros((6, 20), np.float32)})
    with pytest.raises(MlsysError, match="not fed"):
        run(g, ["loss"], {k: v for k, v in feed.items() if k != "y"})
    with pytest.raises(MlsysError, match="not inputs"):
        run(g, ["loss"], {**feed, "z": 1.0})
