"""The layouts a plan considers: every factorization with its ZeRO stages, refusals that name the
rule they break, and the link each axis's collectives cross."""
from mlsys_jax.planning.candidates import (AS_WRITTEN, PIPE_ZERO, STAGE_REMAT,
                                           enumerate_candidates)
from mlsys_jax.planning.links import LINKS, collective_seconds, crosses_nodes


def test_every_factorization_and_stage_is_there_once():
    found = enumerate_candidates(16, gpus_per_node=8, global_batch=32)
    meshes = {(c.data, c.model, c.pipe) for c, _ in found}
    assert (16, 1, 1) in meshes and (2, 8, 1) in meshes and (1, 16, 1) in meshes
    assert (2, 2, 4) in meshes
    assert len(found) == len(set(c for c, _ in found))
    assert all(c.data * c.model * c.pipe == 16 for c, _ in found)
    assert all(c.zero in PIPE_ZERO for c, _ in found if c.pipe > 1)
    assert {c.remat for c, _ in found if c.pipe == 1} == {AS_WRITTEN}
    assert {c.remat for c, _ in found if c.pipe > 1} == {AS_WRITTEN, STAGE_REMAT}
    assert all("no model axis" in why for c, why in found if c.pipe > 1 and c.model > 1)


def test_refusals_name_the_rule():
    found = dict(enumerate_candidates(16, gpus_per_node=8, global_batch=4))
    reasons = {(c.data, c.model, c.pipe): why for c, why in found.items() if c.zero == 0
               and c.microbatches in (1, c.pipe)}
    assert reasons[(1, 16, 1)] == "TP 16 crosses a node (8 GPUs per node)"
    assert reasons[(16, 1, 1)] == "the global batch 4 does not split over data=16"
    assert reasons[(2, 8, 1)] == ""


def test_an_axis_crosses_nodes_when_its_group_spans_more_than_a_node():
    mesh = {"data": 8, "model": 8}
    assert not crosses_nodes(mesh, "model", 8) and crosses_nodes(mesh, "data", 8)
    assert not crosses_nodes({"data": 2, "model": 4}, "data", 8)


def test_alpha_beta_time_of_a_ring():
    h100 = LINKS["h100"]
    t = collective_seconds("all-reduce", 450e9, 1, 8, inter=False, links=h100)
    assert t == 1.0 + 2 * 7 * h100.intra_latency_s
    assert collective_seconds("all-gather", 50e9, 2, 4, inter=True, links=h100) == \
        1.0 + 2 * 3 * h100.inter_latency_s
