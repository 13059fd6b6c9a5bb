"""Where an equation came from: the module of the user's model that traced it.

A module is a path of names, ``("GPT2", "h_0", "attn")``. Each equation gets one, from the first
of these that says something:

1. **Its name stack.** flax linen pushes module paths (``GPT2/h_0/attn``), haiku its module names
   (``res_net50/block_group_0/block_0/conv_0``), Keras 3 its layer names (``conv2_block1_1_conv``),
   and so does any ``jax.named_scope``. Transforms (``jvp``, ``vmap``, ``transpose``) are left
   out, so a gradient's backward equations belong to the module of their forward ones. Inside a
   call or a loop, an equation's names follow the call's (:func:`mlsys_jax.ir.opview.open_calls`).
2. **The weights it reads.** equinox names its scopes by layer class (``eqx.nn.Conv``), not by
   instance, and plain JAX code has no scopes: there the pytree path of the parameter an
   equation reads names its module (``[0].convs[0].weight`` → ``convs[0]``, as
   ``jax.tree_util.keystr`` spells it), also through ops that only reshape or convert weights.
   An equation without weights takes the module of a neighbour (producer or consumer) traced in
   the same scope from the same line — BatchNorm's statistics beside its scale.
3. **Trace order.** JAX records a module's call as one run of equations, so an equation with no
   name and no weight between two equations of one module — a residual add between a block's
   attention and its MLP — belongs to the innermost module holding both.
4. Otherwise **the user's source line** (``model.py:27``): the innermost frame outside JAX,
   installed libraries and mlsys_jax.
"""
from __future__ import annotations

import os
import re
import sysconfig
from dataclasses import dataclass
from typing import Iterable

from mlsys_jax.compat import Var, name_scopes, name_stack_text, source_frames
from mlsys_jax.ir.walk import bodies

Module = tuple  # of str: ("GPT2", "h_0", "attn"); () is the whole program

# equinox's layers name their scope after their class (``eqx.nn.Conv``), the same for every
# instance: a class, not a module of this model
_CLASS_SCOPE = re.compile(r"^eqx\.")
# a method call on a module, as flax names it (``wte.attend``): the module is ``wte``
_METHOD = re.compile(r"^([A-Za-z_][\w\-]*)\.[A-Za-z_]\w*$")
# mlsys_jax's own frames (the CLI, --grad's wrapper) are never the user's line
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LIBRARIES = tuple(os.path.realpath(sysconfig.get_paths()[k]) + os.sep
                   for k in ("purelib", "platlib", "stdlib"))


@dataclass(frozen=True)
class Origin:
    """An equation's module and how it was found: ``name``, ``weight``, ``neighbour``,
    ``order`` or ``line`` (the steps of the module docstring)."""

    module: Module
    how: str


def common(paths: Iterable[Module]) -> Module:
    """The innermost module holding all of ``paths`` (their longest common prefix)."""
    out = None
    for p in paths:
        if out is None:
            out = tuple(p)
            continue
        n = 0
        while n < min(len(out), len(p)) and out[n] == p[n]:
            n += 1
        out = out[:n]
    return out or ()


def owner(module: Module) -> Module:
    """The module object behind a path: a method call ``wte.attend`` is ``wte``'s."""
    return tuple(m.group(1) if (m := _METHOD.match(c)) else c for c in module)


def scopes(eqn, prefix: Module = ()) -> Module:
    """The module an equation's name stack names (class scopes left out); for an equation
    holding bodies (a call kept whole, a loop), the innermost module of the equations inside
    that name more than it does."""
    own = prefix + tuple(s for s in name_scopes(eqn.source_info) if not _CLASS_SCOPE.match(s))
    deeper = [m for b in bodies(eqn) for e in b.jaxpr.eqns
              if len(m := scopes(e, own)) > len(own)]
    return common(deeper) if deeper else own


def leaf_module(path) -> Module:
    """The module of a parameter from its pytree key path (the leaf's own name left out): dict
    keys and attributes are names, haiku's ``res_net50/~/conv_0`` is split at ``/``, a sequence
    index joins the name before it (``convs[0]``)."""
    out: list[str] = []
    for key in path[:-1]:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                value = getattr(key, attr)
                break
        else:
            value = str(key)
        if isinstance(value, int):
            if out:
                out[-1] += f"[{value}]"
            else:
                out.append(f"[{value}]")
            continue
        out += [part for part in str(value).split("/") if part and part != "~"]
    return tuple(out)


UNNAMED = "(unnamed)"  # no frame outside JAX and mlsys_jax: stax's layers, --grad's sum


def user_line(eqn) -> str:
    """``file.py:LINE`` of the innermost frame outside JAX, installed libraries and mlsys_jax;
    else the innermost outside JAX and mlsys_jax (a library's), else :data:`UNNAMED`."""
    line = _lines(eqn)
    return line[0] or line[1] or UNNAMED


def _lines(eqn) -> tuple:
    """(the user's line or None, a library's line or None)."""
    return lines_of((file, line) for file, line, _ in source_frames(eqn.source_info))


def lines_of(frames) -> tuple:
    """(the user's line or None, a library's line or None) of ``frames``, ``(file, line)`` pairs
    innermost first: the first outside installed libraries and mlsys_jax, and the first outside
    mlsys_jax (``<frozen ...>`` and other pseudo-files are neither)."""
    library = None
    for file, line in frames:
        path = os.path.realpath(file)
        if path.startswith(_OURS) or file.startswith("<"):
            continue
        here = f"{os.path.basename(file)}:{line}"
        if not path.startswith(_LIBRARIES):
            return here, library
        library = library or here
    return None, library


def origins(eqns: list, weights: dict) -> list[Origin]:
    """The :class:`Origin` of each equation of a flat list in trace order (a jaxpr's top level,
    or ``open_calls``' view), whose weights are ``weights`` (Var → module of the parameter)."""
    derived = dict(weights)  # Var → module, for values computed from one module's weights alone
    found: list = [None] * len(eqns)
    for i, e in enumerate(eqns):
        named = scopes(e)
        ins = [v for v in e.invars if isinstance(v, Var)]
        reads = [derived[v] for v in ins if v in derived]
        held = common(reads)
        if named:
            found[i] = Origin(named, "name")
        elif held:
            found[i] = Origin(held, "weight")
        if held and len(reads) == len(ins):
            derived.update((v, held) for v in e.outvars)
    _from_neighbours(eqns, found)
    _from_trace_order(found)
    return [f if f is not None else Origin((user_line(e),), "line") for f, e in zip(found, eqns)]


def _from_neighbours(eqns: list, found: list) -> None:
    """Unresolved equations take the module of resolved neighbours traced in the same scope
    from the same line, when all such neighbours agree: first their consumers only (a layer's
    weight is applied after its statistics, and a layer's producer may be the previous instance
    of the same layer, in a loop), then producers too; each to a fixpoint."""
    producer, users = {}, {}
    for i, e in enumerate(eqns):
        for v in e.outvars:
            producer[v] = i
        for v in e.invars:
            if isinstance(v, Var):
                users.setdefault(v, []).append(i)
    sites: dict = {}

    def site(i):  # None where nothing tells the place (no scope, no user line)
        if i not in sites:
            scope, line = name_stack_text(eqns[i].source_info), _lines(eqns[i])[0]
            sites[i] = (scope, line) if scope and line else None
        return sites[i]

    def consumers(i):
        return [j for v in eqns[i].outvars for j in users.get(v, ())]

    def neighbours(i):
        ins = [producer[v] for v in eqns[i].invars if isinstance(v, Var) and v in producer]
        return ins + consumers(i)

    todo = [i for i in range(len(eqns)) if found[i] is None and site(i) is not None]
    for near in (consumers, neighbours):
        while todo:
            later = []
            for i in todo:
                agree = {found[j].module for j in near(i)
                         if found[j] is not None and site(j) == site(i)}
                if len(agree) == 1:
                    found[i] = Origin(agree.pop(), "neighbour")
                else:
                    later.append(i)
            if len(later) == len(todo):
                break
            todo = later


def _from_trace_order(found: list) -> None:
    """Unresolved equations between two resolved ones take the innermost module holding both,
    when that is a module (not the whole program)."""
    resolved = [i for i, f in enumerate(found) if f is not None]
    for a, b in zip(resolved, resolved[1:]):
        if b - a < 2:
            continue
        inside = common([found[a].module, found[b].module])
        if inside:
            for i in range(a + 1, b):
                found[i] = Origin(inside, "order")


def raised_at(e: BaseException) -> str:
    """``file.py:LINE`` of the innermost frame of ``e``'s traceback that is the user's (outside
    installed libraries and mlsys_jax: the rule of :func:`lines_of`), or ''."""
    import traceback

    frames = reversed(traceback.extract_tb(e.__traceback__))  # innermost first
    return lines_of((f.filename, f.lineno) for f in frames)[0] or ""


# what JAX's messages call the primitives a gradient cannot go through
_NAMED_IN_MESSAGES = {"while": ("while_loop", "fori_loop"),
                      "pure_callback": ("callback",), "io_callback": ("callback",)}


def blamed_line(closed, message: str) -> str:
    """The user's line of the first equation (nested bodies too) whose primitive ``message``
    names (a gradient's failure names ``lax.while_loop``, a callback), or ''."""
    from mlsys_jax.ir.walk import walk

    text = message.lower()
    for _, eqn in walk(closed):
        words = _NAMED_IN_MESSAGES.get(eqn.primitive.name, ())
        if any(w in text for w in words):
            line = user_line(eqn)
            return "" if line == UNNAMED else line
    return ""

