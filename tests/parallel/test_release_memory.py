"""``simulate``'s garbage collections walk only what its run created (``gc.freeze`` over what the
process held), and leave a freeze they did not make alone."""
import gc

from mlsys_jax.parallel.shard.step import collections_of_this_run, release_memory


def test_objects_held_before_the_run_are_frozen_within_it_and_thawed_after():
    before = gc.get_freeze_count()
    assert before == 0
    held = [[] for _ in range(100)]
    with collections_of_this_run():
        assert gc.get_freeze_count() >= len(held)
        release_memory()
        assert gc.get_freeze_count() >= len(held)   # a full collection does not thaw them
    assert gc.get_freeze_count() == 0


def test_a_freeze_made_elsewhere_is_left_alone():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with collections_of_this_run():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
