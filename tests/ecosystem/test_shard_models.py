"""Third-party models as shipped on a (data, model) mesh: the user's annotations first, Megatron
splits derived from the dataflow otherwise, synchronised BatchNorm, and verdicts that never accuse
the mesh of a difference an equivalent one-device computation also shows. The separability
verdicts of flax's lm1b (with and without padding) and equinox's ViT are here too, beside those
models' runs: each model is built once, and the verdict's whole-batch and per-shard programs are
the ones its run compiled (the session's compilation cache gives them back without compiling).

One run per (model, mesh), cached for the module; every program compiled alike (FAST_COMPILE).
"""
import re

import jax
import numpy as np
import pytest

import equinox_vit
import flax_imagenet
import flax_lm1b
import flax_mlp
import haiku_nets
import penzai_llama
from mlsys_jax.parallel import comm, ShardOptions, simulate
from mlsys_jax.parallel.shard import separability_of
from mlsys_jax.parallel.shard.inputs import display_path
from mlsys_jax.parallel.shard.partition_rules import array_paths
from tests.ecosystem.init_bits import init_bits

FACTORIES = {"haiku_mlp": haiku_nets.train_mlp, "penzai": penzai_llama.train,
             "vit": equinox_vit.train, "lm1b": flax_lm1b.train, "imagenet": flax_imagenet.train,
             "linear": flax_mlp.train_linear, "lm1b_padded": flax_lm1b.train_padded}
_BUILT, _REPORTS, _VERDICTS = {}, {}, {}


def built(name):
    """The factory's model, built once per module (``init_bits``: no test here depends on which
    values its parameters draw)."""
    if name not in _BUILT:
        with init_bits():
            _BUILT[name] = FACTORIES[name]()
    return _BUILT[name]


def run(name, mesh, zero=0, steps=1):
    key = (name, tuple(mesh.items()), zero)
    if key not in _REPORTS:
        loss_fn, params, batch, optimizer, *rules = built(name)
        _REPORTS[key] = simulate(loss_fn, params, batch, optimizer, mesh, ShardOptions(
            zero=zero, steps=steps, xla_options=comm.FAST_COMPILE, time_repeats=0),
            rules=rules[0] if rules else None)
    return _REPORTS[key]


def verdict(name, data=2):
    """The separability verdict of the factory's loss over ``data`` shards (``separability_of``:
    whole-batch against per-shard gradients at four points, the mixing equations named)."""
    if (name, data) not in _VERDICTS:
        loss_fn, params, batch, *_ = built(name)
        _VERDICTS[(name, data)] = separability_of(loss_fn, params, batch, data,
                                                  options=comm.FAST_COMPILE)
    return _VERDICTS[(name, data)]


def never_accuses(r):
    """Every leaf's teacher-forced difference is within its own bound (twice that leaf's noise
    in an equivalent one-device computation, plus a floor): the largest |Δ| may sit at a leaf
    whose noise is larger than that of the leaf nearest its bound."""
    assert "differs from one device beyond rounding" not in r.reason
    for q in ("loss", "grads", "params"):
        assert r.bound_ratio[q] <= 1 and r.teacher_forced[q] <= 2 * r.noise[q] + r.bound[q]


@pytest.mark.parametrize("name, megatron", [("haiku_mlp", 1), ("penzai", 4)])
def test_derived_megatron_splits_send_megatrons_forward_all_reduces(name, megatron):
    """hk.nets.MLP (64, 64, 10): one pair, the 10-class head whole; penzai's llama-like
    transformer: query/key/value and gate/value projections split by heads and features, the
    output projections by input features, two forward all-reduces per layer."""
    r = run(name, {"data": 2, "model": 2})
    assert r.exact, r.reason
    never_accuses(r)
    assert r.tensor_parallel["source"] == "derived"
    assert r.forward_all_reduces == {"measured": megatron, "megatron": megatron}
    assert r.tensor_parallel["replicated"] and all(r.tensor_parallel["replicated"].values())


def test_haiku_mlp_head_is_listed_whole_with_its_reason():
    tp = run("haiku_mlp", {"data": 2, "model": 2}).tensor_parallel
    assert tp["groups"] == [{"column": ["['mlp/~/linear_0']['w']"],
                             "row": ["['mlp/~/linear_1']['w']"],
                             "bias": ["['mlp/~/linear_0']['b']"]}]
    assert "before any second matmul" in tp["replicated"]["['mlp/~/linear_2']['w']"]


def test_equinox_vit_head_stays_whole_and_megatron_needs_no_all_gather():
    """equinox's ViT: its head Sequential([LayerNorm, Linear]) is no MLP pair; the attention and
    MLP pairs of 2 layers need 4 forward all-reduces and no all-gather."""
    r = run("vit", {"data": 2, "model": 2})
    assert r.exact, r.reason
    never_accuses(r)
    tp = r.tensor_parallel
    assert ".mlp.layers[1].weight" in tp["replicated"] and ".mlp.layers[0].weight" in \
        tp["replicated"]
    assert len(tp["groups"]) == 4 and r.forward_all_reduces == {"measured": 4, "megatron": 4}
    assert not [c for c in r.collectives if c["kind"] == "all-gather"]


def test_lm1b_logical_annotations_are_honoured_with_the_examples_rules():
    """flax lm1b's boxed parameters with its own logical axis rules (mlp and vocab on the tensor
    axis, this mesh's model): the MLPs and the vocabulary are split, one forward all-reduce per
    layer comes from its MLP's second matmul, and split parameters take 1/M per device."""
    r = run("lm1b", {"data": 2, "model": 2})
    never_accuses(r)
    tp = r.tensor_parallel
    assert tp["source"] == "annotations"
    assert any("fsdp" in n and "--zero 3" in n for n in tp["notes"])
    _, params, *_ = built("lm1b")
    layers = {k for k in params["params"] if k.startswith("encoderdecoderblock_")}
    per_layer = {k: sum(n for src, n in r.forward_all_reduce_sources.items()
                        if f"/{k}/" in f"/{src}" and src.endswith("dot_general")) for k in layers}
    assert per_layer == dict.fromkeys(layers, 1)       # Megatron: one per MLP pair
    assert r.forward_all_reduces["megatron"] == len(layers)
    spec = {display_path(p): s for p, s in _specs(r, params).items()}
    nbytes = {display_path(p): x.size * x.dtype.itemsize for p, x in array_paths(params)}
    split = sum(b for p, b in nbytes.items() if "model" in spec.get(p, ""))
    assert split and r.per_device_bytes["layout"]["params"] == sum(nbytes.values()) - split // 2


def _specs(r, params):
    """Each parameter's spec text from the report's rules (logical names resolved by flax)."""
    import flax.linen as nn

    rules = [tuple(x) for x in flax_lm1b.RULES]
    out = {}
    for path, box in jax.tree_util.tree_flatten_with_path(
            params, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]:
        spec = nn.logical_to_mesh_axes(box.names, rules)
        out[jax.tree_util.keystr(path) + ".value"] = str(spec).replace("tensor", "model")
    return out


def test_flax_imagenet_batchnorm_on_the_batch_axis_is_synchronised_and_exact():
    """BatchNorm(axis_name='batch') of flax's imagenet example: the name is bound to the data
    axis on its own (the only unbound name), so the statistics are global and the step exact."""
    r = run("imagenet", {"data": 4})
    assert r.exact and r.semantics == "synchronised" and r.axis_name == "batch", r.reason
    assert "synchronised" in r.reason
    never_accuses(r)


def test_a_model_where_nothing_splits_says_so_and_names_the_fix():
    r = run("linear", {"data": 2, "model": 2})
    tp = r.tensor_parallel
    assert not tp["split"] and re.search(r"nothing is split over model=2: .* give partition "
                                         r"rules .* or sharding annotations", tp["notice"])
    assert set(tp["replicated"]) == {"['params']['Dense_0']['kernel']",
                                     "['params']['Dense_0']['bias']"}


def _nnx_mlp():
    """A flax nnx MLP annotated the nnx way (``nnx.with_partitioning`` with logical names),
    created without a mesh (eager sharding off), split into graph and state."""
    import jax.numpy as jnp
    import optax
    from flax import nnx

    init = nnx.initializers.lecun_normal()

    class Mlp(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(16, 64, kernel_init=nnx.with_partitioning(init, ("embed", "mlp")),
                                 rngs=rngs)
            self.down = nnx.Linear(64, 16, rngs=rngs,
                                   kernel_init=nnx.with_partitioning(init, ("mlp", "embed")))

        def __call__(self, x):
            return self.down(jax.nn.relu(self.up(x)))

    with nnx.use_eager_sharding(False):
        graphdef, state = nnx.split(Mlp(nnx.Rngs(0)))
    x = jax.random.normal(jax.random.key(1), (8, 16))

    def loss_fn(state, batch):
        return jnp.mean((nnx.merge(graphdef, state)(batch["x"]) - batch["x"]) ** 2)
    return loss_fn, state, {"x": x}, optax.adam(1e-3), [("mlp", "model"), ("embed", None)]


FACTORIES["nnx"] = _nnx_mlp


def test_nnx_sharding_metadata_is_honoured_with_logical_rules():
    r = run("nnx", {"data": 2, "model": 2})
    assert r.exact, r.reason
    tp = r.tensor_parallel
    assert tp["source"] == "annotations"
    assert sorted(tp["split"]) == ["['down']['kernel']", "['up']['kernel']"]
    assert r.forward_all_reduces == {"measured": 1, "megatron": 1}


def _counts(name, data=2):
    """Non-padding tokens per shard and in the batch, counted here from the example batch."""
    inputs = np.asarray(built(name)[2]["inputs"])
    shards = np.split(inputs > 0, data)
    return [int(s.sum()) for s in shards], int((inputs > 0).sum())


def test_lm1b_without_padding_is_equal_on_this_batch_and_says_why():
    sep = verdict("lm1b")
    assert not sep.separable and sep.equal_here
    assert [m.kind for m in sep.mixing] == ["normaliser"]
    assert "the count of entries with batch['inputs'] > 0" in sep.causes[0]
    shards, whole = _counts("lm1b")
    assert len(set(shards)) == 1
    assert "every shard holds the same value" in sep.why_equal
    assert f"{shards[0]} of the batch's {whole}" in sep.why_equal


def test_lm1b_with_padding_is_not_separable_and_names_the_counts():
    sep = verdict("lm1b_padded")
    assert not sep.separable and not sep.equal_here
    assert "the count of entries with batch['inputs'] > 0" in sep.causes[0]
    shards, whole = _counts("lm1b_padded")
    assert len(set(shards)) > 1
    assert f"{', '.join(map(str, shards))} in the shards, {whole} in the batch" in sep.causes[0]


def test_per_example_dropout_keys_in_the_batch_are_separable():
    """equinox's ViT example vmaps the model with one dropout key per example: separable."""
    sep = verdict("vit")
    assert sep.separable and not sep.mixing and sep.grads.within
