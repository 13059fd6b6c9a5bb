"""Separability of scans, masks and maps (issue #39 item 2): a corpus of small losses with the
verdict each must get.

Separable: RNNs over time whose carry starts from zeros, a broadcast parameter or per-example
values (the carry's batch axis anywhere), both directions, a time-major batch, causal masks from
``iota`` comparisons, ``lax.map`` and a running sum over the examples, sort/cumsum/cumprod/rev
along non-batch axes. Not separable (negative controls): batch statistics, a batch-wide count,
an RNN over the batch axis, a cumsum along it, a carry that starts differently per position. For
each "not", the named equation is the one that mixes: its source line holds the mixing
operation, the same loss with that one operation made per-example is separable, and the
gradients of the whole batch and of the shards really differ.
"""
import inspect
import linecache

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax.parallel import comm
from mlsys_jax.parallel.shard import separability_of
from mlsys_jax.parallel.shard.batch.rules import follow_batch

B, T, F, H = 8, 6, 3, 4
_RNG = np.random.default_rng(0)
X = jnp.asarray(_RNG.standard_normal((B, T, F)))
Y = jnp.asarray(_RNG.standard_normal((B,)))
PAD = jnp.asarray(_RNG.random((B, T)) > 0.3, jnp.int32).at[:, 0].set(1)
P = {"u": jnp.asarray(_RNG.standard_normal((F, H))) * 0.5,
     "w": jnp.asarray(_RNG.standard_normal((H, H))) * 0.5,
     "h0": jnp.asarray(_RNG.standard_normal((H,))) * 0.1}
BATCH = {"x": X, "y": Y}


def _cell(p, h, xt):
    return jnp.tanh(xt @ p["u"] + h @ p["w"])


def _rnn(p, x, h):
    """``x``: [B, T, F] scanned over time (time-major inside), the final state [B, H]."""
    h, _ = jax.lax.scan(lambda h, xt: (_cell(p, h, xt), None), h, jnp.swapaxes(x, 0, 1))
    return h


def _mse(out, y):
    return jnp.mean((out - y) ** 2)


# ---- separable -------------------------------------------------------------------------------
def rnn_zeros(p, b):
    return _mse(_rnn(p, b["x"], jnp.zeros((b["x"].shape[0], H))).sum(-1), b["y"])


def rnn_broadcast_init(p, b):
    h0 = jnp.broadcast_to(p["h0"], (b["x"].shape[0], H))
    return _mse(_rnn(p, b["x"], h0).sum(-1), b["y"])


def rnn_per_example_init(p, b):
    return _mse(_rnn(p, b["x"], b["x"][:, 0] @ p["u"]).sum(-1), b["y"])


def rnn_carry_batch_last(p, b):
    """The carry is [H, B]: its batch axis is 1."""
    def step(h, xt):
        return jnp.tanh(p["u"].T @ xt.T + p["w"].T @ h), None
    h, _ = jax.lax.scan(step, jnp.zeros((H, b["x"].shape[0])), jnp.swapaxes(b["x"], 0, 1))
    return _mse(h.sum(0), b["y"])


def rnn_bidirectional(p, b):
    xs, h0 = jnp.swapaxes(b["x"], 0, 1), jnp.zeros((b["x"].shape[0], H))
    step = lambda h, xt: (_cell(p, h, xt), _cell(p, h, xt))   # noqa: E731
    _, fwd = jax.lax.scan(step, h0, xs)
    _, bwd = jax.lax.scan(step, h0, xs, reverse=True)
    return _mse(jnp.concatenate([fwd, bwd], -1).sum((0, 2)), b["y"])


def causal_mask(p, b):
    """keras-hub's Gemma: arange comparisons, expand_dims, broadcast_to, minimum with padding."""
    h = b["x"] @ p["u"]
    scores = jnp.einsum("bth,bsh->bts", h, h)
    i, j = jnp.arange(T)[:, None] + 0, jnp.arange(T)[None, :]
    causal = jnp.broadcast_to(jnp.expand_dims((i >= j).astype(jnp.int32), 0), (h.shape[0], T, T))
    mask = jnp.minimum(b["pad"][:, None, :], causal)
    att = jax.nn.softmax(jnp.where(mask > 0, scores, -1e9), -1)
    return _mse((att @ h).sum((1, 2)), b["y"])


def lax_map(p, b):
    per = jax.lax.map(lambda e: (jnp.tanh(e[0] @ p["u"]).sum() - e[1]) ** 2, (b["x"], b["y"]))
    return jnp.mean(per)


def scan_running_sum(p, b):
    def step(total, e):
        return total + (jnp.tanh(e[0] @ p["u"]).sum() - e[1]) ** 2, None
    total, _ = jax.lax.scan(step, 0.0, (b["x"], b["y"]))
    return total / b["x"].shape[0]


def sort_cumsum_rev(p, b):
    h = b["x"] @ p["u"]
    feats = (jnp.sort(h, axis=1)[:, 0] + jnp.cumsum(h, axis=1)[:, -1]
             + jnp.cumprod(jnp.tanh(h), axis=2)[:, 0] + jnp.flip(h, 1)[:, 0])
    return _mse(feats.sum(-1), b["y"])


def time_major(p, b):
    """Every batch leaf is [T, B, ...]: the examples are on axis 1."""
    def step(h, xt):
        h = _cell(p, h, xt)
        return h, h.sum(-1)
    _, ys = jax.lax.scan(step, jnp.zeros((b["x"].shape[1], H)), b["x"])
    return _mse(ys, b["y"])


TIME_MAJOR = {"x": jnp.swapaxes(X, 0, 1)[:4], "y": jnp.asarray(_RNG.standard_normal((4, B)))}
SEPARABLE = {"rnn_zeros": (rnn_zeros, BATCH), "rnn_broadcast_init": (rnn_broadcast_init, BATCH),
             "rnn_per_example_init": (rnn_per_example_init, BATCH),
             "rnn_carry_batch_last": (rnn_carry_batch_last, BATCH),
             "rnn_bidirectional": (rnn_bidirectional, BATCH),
             "causal_mask": (causal_mask, {"x": X, "y": Y, "pad": PAD}),
             "lax_map": (lax_map, BATCH), "scan_running_sum": (scan_running_sum, BATCH),
             "sort_cumsum_rev": (sort_cumsum_rev, BATCH), "time_major": (time_major, TIME_MAJOR)}


# ---- negative controls: (loss, the mixing kind, its primitive, text on its source line, and the
# same loss with that operation made per example) --------------------------------------------
def batchnorm(p, b, per_example=False):
    h = b["x"][:, 0] @ p["u"]
    axis = 1 if per_example else 0
    mean = jnp.mean(h, axis=axis, keepdims=True)   # MIX: mean(h, axis
    return _mse((h - mean).sum(-1) ** 2, b["y"])


def count_normalised(p, b, per_example=False):
    per = (jnp.tanh(b["x"] @ p["u"]).sum(-1) ** 2 * b["pad"]).sum(1)
    if per_example:
        return jnp.mean(per / jnp.sum(b["pad"], 1))
    return jnp.sum(per) / jnp.sum(b["pad"])   # MIX: jnp.sum(per) / jnp.sum(b["pad"])


def rnn_over_batch(p, b, per_example=False):
    xs = jnp.swapaxes(b["x"], 0, 1) if per_example else b["x"][:, 0]
    h0 = jnp.zeros((b["x"].shape[0], H)) if per_example else jnp.zeros((H,))
    h, hs = jax.lax.scan(lambda h, xt: (_cell(p, h, xt), _cell(p, h, xt)), h0, xs)   # MIX: lax.scan
    return _mse(hs.sum(-1).T[:, 0] if per_example else hs.sum(-1), b["y"])


def cumsum_over_batch(p, b, per_example=False):
    h = jnp.tanh(b["x"] @ p["u"]).sum((1, 2))
    return _mse(h if per_example else jnp.cumsum(h, axis=0), b["y"])   # MIX: jnp.cumsum(h, axis=0)


def init_by_position(p, b, per_example=False):
    rows = b["x"].shape[0]
    h0 = jnp.zeros((rows, H)) if per_example else \
        jnp.arange(rows, dtype=b["x"].dtype)[:, None] * jnp.ones((rows, H)) / rows
    h, _ = jax.lax.scan(lambda h, xt: (_cell(p, h, xt), None), h0,   # MIX: lax.scan(lambda h
                        jnp.swapaxes(b["x"], 0, 1))
    return _mse(h.sum(-1), b["y"])


def dropout_fixed_key(p, b, per_example=False):
    h = jnp.tanh(b["x"][:, 0] @ p["u"])
    if per_example:
        keep = jax.vmap(lambda k: jax.random.bernoulli(k, 0.5, (H,)))(b["keys"])
    else:   # one key for the whole batch: the mask follows the rows' positions
        keep = jax.random.bernoulli(jax.random.key(1), 0.5, (h.shape[0] * H,))
        keep = keep.reshape(h.shape)
    return _mse(jnp.where(keep, h, 0.0).sum(-1), b["y"])   # MIX: jnp.where(keep, h, 0.0)


PADDED = {"x": X, "y": Y, "pad": PAD}
KEYED = {"x": X, "y": Y, "keys": jax.random.split(jax.random.key(2), B)}
NOT_SEPARABLE = {"batchnorm": (batchnorm, BATCH, "statistic", "reduce_sum"),
                 "count_normalised": (count_normalised, PADDED, "normaliser", "div"),
                 "rnn_over_batch": (rnn_over_batch, BATCH, "order", "scan"),
                 "cumsum_over_batch": (cumsum_over_batch, BATCH, "order", "cumsum"),
                 "init_by_position": (init_by_position, BATCH, "position", "scan"),
                 "dropout_fixed_key": (dropout_fixed_key, KEYED, "position", "select_n")}


def walk(loss, batch):
    closed = jax.make_jaxpr(loss)(P, batch)
    invars = set(closed.jaxpr.invars[len(jax.tree.leaves(P)):])
    return follow_batch(closed, invars, jax.tree.leaves(batch)[0].shape[0])


def _source_line(where: str) -> str:
    """The text of ``file.py:N`` at the end of a mixing record's place (this file)."""
    line = int(where.rsplit(":", 1)[1])
    return linecache.getline(inspect.getsourcefile(walk), line)


@pytest.mark.parametrize("name", SEPARABLE)
def test_no_equation_mixes_examples(name):
    loss, batch = SEPARABLE[name]
    got = walk(loss, batch)
    assert [m.describe() for m in got.mixing] == []
    assert got.axes and set(got.axes.values()) == ({1} if name == "time_major" else {0})


@pytest.mark.parametrize("name", NOT_SEPARABLE)
def test_the_named_equation_is_the_mixing_one(name):
    loss, batch, kind, primitive = NOT_SEPARABLE[name]
    got = [m for m in walk(loss, batch).mixing if not m.synced]
    assert [(m.kind, m.primitive) for m in got] == [(kind, primitive)]
    marker = _source_line(got[0].where)
    assert "# MIX: " in marker and marker.split("# MIX: ")[1].strip() in marker.split("#")[0]
    fixed = walk(lambda p, b: loss(p, b, per_example=True), batch)   # that one op, per example
    assert fixed.mixing == []


def test_scan_over_time_with_a_position_dependent_start_names_the_start():
    got = walk(init_by_position, BATCH).mixing[0]
    assert "starts from values that vary along the batch axis" in got.detail


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rnn_zeros", "rnn_carry_batch_last", "causal_mask", "lax_map",
                                  "scan_running_sum", "time_major"])
def test_separable_on_the_numbers_too(name):
    loss, batch = SEPARABLE[name]
    sep = separability_of(loss, P, batch, 2, options=comm.FAST_COMPILE)
    assert sep.separable and sep.equal_here and not sep.causes, sep.causes


@pytest.mark.slow
@pytest.mark.parametrize("name", NOT_SEPARABLE)
def test_negative_controls_really_mix(name):
    loss, batch, kind, _ = NOT_SEPARABLE[name]
    sep = separability_of(loss, P, batch, 2, options=comm.FAST_COMPILE)
    assert not sep.separable and not sep.equal_here
    assert sep.grads.diff > 100 * max(sep.grads.noise, 1e-12)
    assert [m.kind for m in sep.mixing] == [kind]
