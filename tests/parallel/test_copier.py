"""``step.copier``: fresh copies on the mesh that a step may donate, whatever the layout — a
replicated leaf included, whose copy on the source's own device ``device_put`` would otherwise
alias to the source's buffer (donating it would delete the source)."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from mlsys_jax.parallel import make_mesh
from mlsys_jax.parallel.shard.step import copier


def test_copies_survive_donation_for_every_layout():
    mesh = make_mesh({"data": 4, "model": 2})
    tree = {"replicated": jnp.arange(8.0), "rows": jnp.arange(32.0).reshape(8, 4),
            "both": jnp.arange(64.0).reshape(8, 8), "count": jnp.zeros((), jnp.int32)}
    layout = {"replicated": NamedSharding(mesh, P()), "rows": NamedSharding(mesh, P("data")),
              "both": NamedSharding(mesh, P("data", "model")),
              "count": NamedSharding(mesh, P())}
    before = jax.tree.map(np.array, tree)
    copies = copier(layout)(tree)
    assert jax.tree.map(lambda x: x.sharding, copies) == layout
    step = jax.jit(lambda t: jax.tree.map(lambda x: x + 1, t), donate_argnums=0,
                   out_shardings=layout)
    after = step(copies)
    for name, x in tree.items():
        assert not x.is_deleted(), name
        np.testing.assert_array_equal(np.asarray(x), before[name])
        np.testing.assert_array_equal(np.asarray(after[name]), before[name] + 1)
