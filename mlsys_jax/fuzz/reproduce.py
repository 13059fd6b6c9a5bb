"""Shrinking a failing program and saving it as a pytest reproducer (docs/verification.md §4).

Shrinking is greedy: drop outputs, drop nodes (their uses rewired to the node's first argument),
drop wrapper-body nodes — keeping each step only if the same pass still fails for the same reason
(same kind, same message up to numbers).
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import pprint
from dataclasses import replace

from mlsys_jax.fuzz.judge import check_program, reason
from mlsys_jax.fuzz.spec import Spec
from mlsys_jax.passes import registry

MAX_ATTEMPTS = 200


def replay(spec, pass_name: str, seed: int, gradients: bool = True, passes=None) -> list:
    """Failures of ``pass_name`` on one program: ``[(kind, message), ...]`` (empty: it passes).

    The pass is the registered one, or ``passes[pass_name]`` (e.g. the broken pass a campaign
    caught)."""
    spec = spec if isinstance(spec, Spec) else Spec.from_json(spec)
    if pass_name == "rebuild":
        passes = {}
    elif passes is not None:
        passes = {pass_name: passes[pass_name]}
    else:
        passes = registry.instantiate([pass_name], "replay")
    out = check_program(spec, passes, seed, gradients)
    if out.rejected:
        return [("rejected", out.rejected)]
    return [(f.kind, f.message) for f in out.failures if f.pass_name == pass_name]


def _drop_value(nodes: list, n_in: int, k: int, outputs: list):
    """Nodes and outputs without node ``k``: uses of its value go to its first argument (a node
    without arguments, such as a constant, goes only if nothing uses it)."""
    vid, node = n_in + k, nodes[k]
    if not node["args"] and (vid in outputs or any(vid in n["args"] for n in nodes)):
        return None
    sub = node["args"][0] if node["args"] else None

    def remap(a):
        a = sub if a == vid else a
        return a - 1 if a > vid else a
    new_nodes = []
    for i, n in enumerate(nodes):
        if i == k:
            continue
        n = dict(n, args=[remap(a) for a in n["args"]])
        new_nodes.append(n)
    new_outputs = []
    for o in outputs:
        o = remap(o)
        if o not in new_outputs and o >= n_in:
            new_outputs.append(o)
    return (new_nodes, new_outputs) if new_outputs else None


def _candidates(spec: Spec):
    n_in = len(spec.inputs)
    if spec.special:  # plain inputs first: a failure that needs no NaN is simpler to read
        yield replace(spec, special=False)
    for j in range(len(spec.outputs)):
        if len(spec.outputs) > 1:
            yield replace(spec, outputs=spec.outputs[:j] + spec.outputs[j + 1:])
    for k in range(len(spec.nodes) - 1, -1, -1):
        r = _drop_value(spec.nodes, n_in, k, spec.outputs)
        if r is not None:
            yield replace(spec, nodes=r[0], outputs=r[1])
    for k, node in enumerate(spec.nodes):
        body = node.get("body")
        for b in range(len(body or ()) - 1, -1, -1):
            r = _drop_value(body, 1, b, [len(body)])
            if r is not None and r[1] == [len(body) - 1]:
                nodes = copy.deepcopy(spec.nodes)
                nodes[k]["body"] = r[0]
                yield replace(spec, nodes=nodes)
    if len(spec.inputs) > 1 and all(a != 1 for n in spec.nodes for a in n["args"]):
        shift = lambda a: a - 1 if a > 1 else a  # noqa: E731
        yield replace(spec, inputs=spec.inputs[:1],
                      nodes=[dict(n, args=[shift(a) for a in n["args"]]) for n in spec.nodes],
                      outputs=[shift(o) for o in spec.outputs])


def shrink(failure, passes=None):
    """A smaller program on which ``failure.pass_name`` (the registered pass, or the one in
    ``passes``) still fails for the same reason."""
    spec, attempts, why = failure.spec, 0, reason(failure.kind, failure.message)

    def still_fails(candidate) -> bool:
        try:
            got = replay(candidate, failure.pass_name, failure.seed, passes=passes)
        except Exception:
            return False
        return any(reason(kind, message) == why for kind, message in got)

    progress = True
    while progress and attempts < MAX_ATTEMPTS:
        progress = False
        for cand in _candidates(spec):
            attempts += 1
            if attempts > MAX_ATTEMPTS:
                break
            if still_fails(cand):
                spec, progress = cand, True
                break
    got = replay(spec, failure.pass_name, failure.seed, passes=passes)
    message = next((m for k, m in got if reason(k, m) == why), failure.message)
    return type(failure)(failure.pass_name, failure.kind, message, spec, failure.seed,
                         failure.program)


TEMPLATE = '''"""Fuzz reproducer: {kind} in pass {pass_name!r} (campaign program {program}).

{message}
"""
import pytest

from mlsys_jax.fuzz.reproduce import replay

SPEC = {spec}
PASS = {pass_name!r}
SEED = {seed}

{marker}def test_reproducer():
    assert replay(SPEC, PASS, SEED) == []
'''


def reproducer_source(failure, xfail_reason: str | None = None) -> str:
    """A standalone pytest file that regenerates a failure's program and checks it again."""
    spec = json.loads(failure.spec.to_json())
    marker = (f"@pytest.mark.xfail(strict=True, reason={xfail_reason!r})\n"
              if xfail_reason else "")
    return TEMPLATE.format(kind=failure.kind, pass_name=failure.pass_name,
                           program=failure.program, message=failure.message.replace('"""', "'''"),
                           spec=pprint.pformat(spec, width=96, sort_dicts=True),
                           seed=failure.seed, marker=marker)


def save_reproducer(failure, out_dir: str, xfail_reason: str | None = None) -> str:
    """Write ``test_fuzz_<pass>_<kind>_<hash>.py`` into ``out_dir``; returns its path."""
    os.makedirs(out_dir, exist_ok=True)
    digest = hashlib.sha256(failure.spec.to_json().encode()).hexdigest()[:8]
    path = os.path.join(out_dir, f"test_fuzz_{failure.pass_name}_{failure.kind}_{digest}.py")
    with open(path, "w") as f:
        f.write(reproducer_source(failure, xfail_reason))
    return path
