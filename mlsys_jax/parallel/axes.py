"""The mesh-axis vocabulary, named once, and the axes each parallel path accepts.

Every path that lays work on a mesh names its axes from here, so the tensor-parallel axis is
``model`` in the lecture's 3D step, in a user's sharded step and in the flax annotations alike,
and which axes a path accepts is a row below rather than a tuple in the path's own module.
"""
from __future__ import annotations

DATA = "data"            # the batch split; ZeRO (parallel/stages.py) shards over it
MODEL = "model"          # tensor parallelism: Megatron's column and row splits
PIPE = "pipe"            # pipeline stages
FSDP = "fsdp"            # parameters split over the batch axis: a rules' name, ZeRO-3 here
SEQUENCE = "sequence"    # reserved for sequence parallelism; no path accepts it yet

SHARD_AXES = (DATA, MODEL)           # a user's step under jit + NamedSharding (parallel/shard)
PIPE_AXES = (DATA, PIPE)             # a user's step as pipeline stages (parallel/pipe)
LECTURE_3D_AXES = (DATA, MODEL, PIPE)  # the lecture's 3D step (parallel/lecture/threed.py)

# Mesh axes that logical axis rules may name, read as this mesh's: flax's lm1b convention
# (t5x, maxtext) calls the tensor-parallel axis "tensor"; "fsdp" is left to --zero 3.
MODEL_AXES = {MODEL: MODEL, "tensor": MODEL}
ZERO_AXES = (FSDP,)
