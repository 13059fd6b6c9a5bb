"""Collective bytes read from compiled HLO, and the ring formulas they are compared with."""
import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from mlsys_jax.parallel import comm, make_mesh

HLO = """
  %all-reduce.1 = (f32[10,4]{1,0}, f64[]) all-reduce(%a, %b), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%add
  %ag = f64[16,4]{1,0} all-gather(%p), channel_id=2, replica_groups=[2,4]<=[8], dimensions={0}
  %rs = bf16[2,8]{1,0} reduce-scatter(%q), channel_id=3, replica_groups={{0,1},{2,3}}, dimensions={0}
  %cp = f32[3]{0} collective-permute(%r), channel_id=4, source_target_pairs={{0,1}}
  %not = f32[3]{0} add(%x, %y)
"""


def test_parse_synthetic_hlo():
    got = comm.collectives(HLO)
    assert [(c.kind, c.result_bytes, c.group_size) for c in got] == [
        ("all-reduce", 168, 4), ("all-gather", 512, 4), ("reduce-scatter", 32, 2),
        ("collective-permute", 12, 1)]
    assert comm.collective_counts(HLO) == {"all-reduce": 1, "all-gather": 1,
                                           "reduce-scatter": 1, "collective-permute": 1}
    assert comm.ring_total(got) == pytest.approx(2 * 3 / 4 * 168 + 3 / 4 * 512 + 1 * 32 + 12)


@pytest.mark.parametrize("kind, result, n, want", [
    ("all-reduce", 800, 8, 1400), ("all-gather", 800, 8, 700), ("reduce-scatter", 100, 8, 700),
    ("all-to-all", 800, 8, 700), ("collective-permute", 64, 2, 64), ("all-reduce", 800, 1, 0)])
def test_ring_formulas(kind, result, n, want):
    assert comm.ring_bytes(kind, result, n) == want


def test_compiled_psum_is_one_all_reduce_of_the_payload():
    mesh = make_mesh({"x": 4})
    f = jax.jit(jax.shard_map(lambda a: lax.psum(a * 2, "x"), mesh=mesh, in_specs=P(),
                              out_specs=P()))
    out, compiled = comm.compile_and_run(f, np.ones((5, 3)))
    (c,) = comm.collectives(compiled.as_text())
    assert (c.kind, c.result_bytes, c.group_size) == ("all-reduce", 5 * 3 * 8, 4)
    np.testing.assert_array_equal(np.asarray(out), 8 * np.ones((5, 3)))
    assert comm.nbytes({"a": np.ones(3), "b": np.ones((2, 2), np.float32)}) == 40
    # QUICK_COMPILE only skips LLVM optimisation: same HLO, same buffers
    quick = f.lower(np.ones((5, 3))).compile(comm.QUICK_COMPILE)
    assert quick.as_text() == compiled.as_text()
    assert (quick.memory_analysis().temp_size_in_bytes ==
            compiled.memory_analysis().temp_size_in_bytes)


@pytest.mark.parametrize("attrs, groups", [
    ("replica_groups={{0,1},{2,3}}, to_apply=%add", ((0, 1), (2, 3))),
    ("replica_groups=[2,2]<=[2,2]T(1,0), dimensions={0}", ((0, 2), (1, 3))),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=2] {'axis_0'}, to_apply", ((0, 2), (1, 3))),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=2], device_ids=([2,2]T(1,0)) {'axis_1'}, x",
     ((0, 2), (1, 3))),
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}", ((0, 1), (2, 3), (4, 5), (6, 7))),
    ("channel_id=1, to_apply=%add", ())])
def test_replica_groups_in_every_spelling(attrs, groups):
    assert comm.replica_groups(attrs) == groups
    line = f"  %ar = (f32[], f32[4]{{0}}) all-reduce(%a, %b), {attrs}"
    (c,) = comm.collectives(line, 8)
    assert (c.groups, c.group_size, c.result_bytes, c.scalar_bytes) == (
        groups, len(groups[0]) if groups else 8, 20, 4)


def test_a_collective_in_a_scanned_layer_runs_once_per_layer():
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from mlsys_jax.parallel import comm

    mesh = jax.make_mesh((8,), ("data",))

    def loss(w, x):  # FSDP: each layer's weight is gathered inside the scan's body
        return jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)[0].sum()

    layers = 6
    w = jax.ShapeDtypeStruct((layers, 64, 64), jnp.float32,
                             sharding=NamedSharding(mesh, P(None, "data")))
    x = jax.ShapeDtypeStruct((16, 64), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    hlo = jax.jit(loss).lower(w, x).compile().as_text()
    gathers = [c for c in comm.collectives(hlo) if c.kind == "all-gather"]
    assert gathers and all(c.trips == layers and c.trips_known for c in gathers)
    # what shard's table reads: per step, each gather once per layer
    from mlsys_jax.parallel.shard.collectives import by_axis

    row = by_axis(hlo, mesh)[("all-gather", "data")]
    assert row["count"] == layers * len(gathers)
    assert row["payload_bytes"] == layers * sum(c.result_bytes - c.scalar_bytes for c in gathers)


def test_trips_follow_nested_loops_and_unknown_counts_are_flagged():
    from mlsys_jax.parallel import comm

    hlo = "\n".join([
        '%inner (p: f32[]) -> f32[] {',
        '  %ag = f32[8]{0} all-gather(%p), replica_groups={{0,1}}, dimensions={0}',
        '}',
        '%outer (p: f32[]) -> f32[] {',
        '  %w = (s32[]) while(%t), condition=%c, body=%inner, '
        'backend_config={"known_trip_count":{"n":"3"}}',
        '}',
        '%open (p: f32[]) -> f32[] {',
        '  %ar = f32[4]{0} all-reduce(%p), replica_groups={{0,1}}, to_apply=%add',
        '}',
        'ENTRY %main (p: f32[]) -> f32[] {',
        '  %w1 = (s32[]) while(%t), condition=%c, body=%outer, '
        'backend_config={"known_trip_count":{"n":"4"}}',
        '  %w2 = (s32[]) while(%t), condition=%c, body=%open',
        '}'])
    found = {c.kind: c for c in comm.collectives(hlo)}
    assert (found["all-gather"].trips, found["all-gather"].trips_known) == (12, True)
    assert (found["all-reduce"].trips, found["all-reduce"].trips_known) == (1, False)
