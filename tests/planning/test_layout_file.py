"""The layout file: written from a layout's specs, read back with one-line errors, its tensor-
parallel part handed to shard, and a model it was not made for refused by name."""
import json

import pytest
from jax.sharding import PartitionSpec as P

from mlsys_jax.errors import MlsysError
from mlsys_jax.planning import layout_file


def _data():
    return layout_file.to_data(
        mesh={"data": 4, "model": 2, "pipe": 1}, zero=3, remat="as written",
        param_specs={"['w']": P(("model", "data"), None), "['b']": P("data")})


def test_round_trip_and_the_tensor_parallel_part(tmp_path):
    path = tmp_path / "layout.json"
    layout_file.write(str(path), _data())
    data = layout_file.read(str(path))
    assert data["mesh"] == {"data": 4, "model": 2} and data["zero"] == 3
    rules = dict(layout_file.tp_rules(data))
    assert rules[r"\['w'\]$"] == P("model", None) and rules[r"\['b'\]$"] == P(None)
    layout_file.check_held(data, {"['w']": P(("model", "data")), "['b']": P("data")}, "f")


def test_a_layout_for_another_model_is_named(tmp_path):
    data = _data()
    with pytest.raises(MlsysError, match=r"no rule matches the parameter \['c'\]"):
        layout_file.check_held(data, {"['c']": P()}, "f")
    with pytest.raises(MlsysError, match="would be kept as"):
        layout_file.check_held(data, {"['w']": P("model")}, "f")


@pytest.mark.parametrize("text, match", [
    ("{", "not JSON"), ('{"mesh": {"data": 2}}', "needs the keys"),
    ('{"mesh": {"dp": 2}, "zero": 0, "rules": []}', "mesh must map axes"),
    ('{"mesh": {"data": 2}, "zero": 5, "rules": []}', "zero must be one of"),
    ('{"mesh": {"data": 2}, "zero": 0, "rules": [["(", [null]]]}', "is not a regex")])
def test_bad_files_get_one_line(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(MlsysError, match=match):
        layout_file.read(str(path))
    assert json.dumps(_data())      # the good object is plain JSON
