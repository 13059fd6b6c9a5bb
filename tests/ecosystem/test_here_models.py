"""``--hw here`` on a third-party model as shipped (Keras' MobileNetV2: convolutions, depthwise
ones, BatchNorm), the flax transformer (matmuls, attention) and the models it was not tuned on
(a Keras ConvNeXt-like net, an equinox MLP-Mixer, an nnx CNN), at small sizes: every kernel of the
fused model runs alone, and a second model object reads them all back from the cache for a second
trace. Prediction accuracy on haiku's ResNet18 and Keras' MobileNetV2, and a second process
reading the cache, are benchmark figures (``bench passes``).

Each factory runs on shapes (``run_abstract``, as ``--abstract`` runs one): the kernels, and so
what is measured and cached, are those of the model's jaxpr, which its parameters' values do not
change, while building the values would compile every initializer op by op (most of the work)."""
import pytest

import flax_transformer
import inference_nets
import jax
from benchmarks import _here_models_unseen as unseen
from mlsys_jax import cost, ir
from mlsys_jax.cost.here import OperatorModel, here_hardware
from mlsys_jax.cost.here.dispatch import DispatchCost
from mlsys_jax.ir.abstract import is_abstract, run_abstract

FACTORIES = {
    "keras_mobilenet": lambda: inference_nets.keras_mobilenet(batch=1, size=32, classes=10),
    "flax_transformer": flax_transformer.inspect,
    # models the model was not tuned on (benchmarks/_here_models_unseen.py), small
    "keras_convnext": lambda: unseen.keras_convnext(batch=1, size=32, dims=(8, 16),
                                                    depths=(1, 1)),
    "equinox_mlp_mixer": lambda: unseen.equinox_mlp_mixer(batch=2, size=16, dim=16, blocks=1),
    "nnx_cnn": lambda: unseen.nnx_cnn(batch=2, size=16, widths=(8, 16)),
}


@pytest.fixture(scope="module", autouse=True)
def cache_home(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


def model_at(path) -> OperatorModel:
    model = OperatorModel(path, repeats=2, min_time_s=2e-4, progress=False)
    model.entries.setdefault("dispatch", DispatchCost(5.0, 0.3, 1.0, 0.4).to_dict())
    return model


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_every_kernel_runs_alone_and_is_read_back_under_the_same_key(name, tmp_path):
    with jax.enable_x64(False):  # users' models, under JAX's defaults
        f, args = run_abstract(FACTORIES[name])
        assert is_abstract(args)
        first = cost.estimate(ir.trace(f, *args),
                              hw=here_hardware(model_at(tmp_path / "ops.json")))
        assert [k.why for k in first.kernels if k.model == "roofline"] == []
        assert len(first.kernels) > 5
        later = model_at(tmp_path / "ops.json")
        again = cost.estimate(ir.trace(f, *args), hw=here_hardware(later))  # a new jaxpr
    assert later.measured_now == 0 and {k.model for k in again.kernels} == {"cached"}
    assert again.time_us == pytest.approx(first.time_us)
