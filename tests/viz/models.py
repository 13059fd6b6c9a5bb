"""Tiny factories the viz tests run through the CLI (written to a temporary file): a scoped
model with parameters (``make``), 120 scoped layers (``deep``: over 300 equations), a pipeline
step (``train``) and a residual stack whose remat plan recomputes (``loss``)."""
import textwrap

USER_FILE = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, optax

    def net(p, x):
        with jax.named_scope("net"):
            for i, b in enumerate(p["blocks"]):
                with jax.named_scope(f"block{i}"):
                    with jax.named_scope("attn"):
                        x = x + jnp.tanh(x @ b["q"])
                    with jax.named_scope("mlp"):
                        x = x + jax.nn.relu(x @ b["up"]) @ b["down"]
            return jnp.sum(x)

    def make():
        rng = np.random.default_rng(0)
        w = lambda *s: jnp.asarray(rng.standard_normal(s) * 0.1, jnp.float32)
        blocks = [{"q": w(8, 8), "up": w(8, 16), "down": w(16, 8)} for _ in range(2)]
        return net, ({"blocks": blocks}, w(4, 8))

    def deep():
        def f(x):
            for i in range(120):
                with jax.named_scope(f"layer{i}"):
                    x = jnp.sin(x) * 2.0 + 1.0
            return x
        return f, (jnp.ones(4),)

    def train():
        rng = np.random.default_rng(0)
        params = [{"w": rng.standard_normal((4, 4)).astype(np.float32)} for _ in range(3)]
        def loss(p, b):
            h = b["x"]
            for i, layer in enumerate(p):
                with jax.named_scope(f"layer{i}"):
                    h = jnp.tanh(h @ layer["w"])
            return jnp.mean(h ** 2)
        return loss, params, {"x": jnp.ones((8, 4))}, optax.sgd(0.1)

    def _residual(ws, batch):
        h = batch["x"]
        for i in range(ws.shape[0]):
            h = h + jnp.tanh(h @ ws[i, 0]) * jax.nn.sigmoid(h @ ws[i, 1])
        return jnp.mean(h ** 2)

    def loss():
        rng = np.random.default_rng(0)
        ws = (rng.standard_normal((6, 2, 64, 64)) / 8).astype(np.float32)
        return _residual, ws, {"x": jnp.asarray(rng.standard_normal((128, 64)), jnp.float32)}
""")


def write(tmp_path) -> str:
    path = tmp_path / "model.py"
    path.write_text(USER_FILE)
    return str(path)


def check_trace(doc) -> None:
    """The Trace Event Format's documented fields, checked here independently of
    ``viz.trace.problems``: a ``traceEvents`` list; every event a ``ph``; complete events (X)
    ``ts``, ``dur``, ``pid``, ``tid`` as numbers; counters (C) numeric ``args``; metadata (M)
    naming a process or a thread (``args.name``) or ordering one."""
    assert isinstance(doc["traceEvents"], list) and doc["traceEvents"]
    assert doc.get("displayTimeUnit") in ("ms", "ns")
    for e in doc["traceEvents"]:
        assert "ph" in e and "name" in e and "pid" in e, e
        if e["ph"] == "X":
            for k in ("ts", "dur", "pid", "tid"):
                assert isinstance(e[k], (int, float)), (k, e)
            assert e["dur"] >= 0
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
            assert isinstance(e["ts"], (int, float))
        else:
            assert e["ph"] == "M", e
            if e["name"] in ("process_name", "thread_name"):
                assert isinstance(e["args"]["name"], str) and e["args"]["name"], e
            else:
                assert e["name"] in ("thread_sort_index", "process_sort_index"), e


def tracks(doc) -> dict:
    """(pid, tid) -> the track's name, from the thread_name metadata."""
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}
