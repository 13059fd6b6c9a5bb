"""``optimize --constants ARG,...``: which of a factory's arguments are folded in as constants.

By default ``optimize`` folds a factory's first argument (the parameters, JAX's
``apply(params, x)`` habit) into the graph: an inference graph. Some functions take their
constants elsewhere (``f(x, weights)``, a lookup table, a mask) or several of them; the user names
them, by 0-based index or by the function's parameter name, and :func:`with_constants` returns a
Target whose first argument holds them, so everything downstream (tracing with
``constant_params``, the parameters' modules, the value check's inputs) is unchanged.
"""
from __future__ import annotations

import inspect

from mlsys_jax.errors import UsageError

FLAG = "--constants"


def _names(fn) -> list[str]:
    """The names of ``fn``'s positional parameters, in order (empty where it has no signature)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds]


def _known(names: list[str], count: int) -> str:
    """``0 variables, 1 x`` (indices alone past the named ones)."""
    return ", ".join(f"{i} {names[i]}" if i < len(names) else str(i) for i in range(count))


def indices(spec: str, fn, count: int, target: str) -> list[int]:
    """The argument indices ``spec`` names (``"0,2"``, ``"variables,table"``), sorted, each
    once; a UsageError naming the bad entry and the arguments there are."""
    names = _names(fn)
    out = set()
    for word in (w.strip() for w in spec.split(",")):
        if word.lstrip("-").isdigit():
            i = int(word)
            if not 0 <= i < count:
                raise UsageError(f"{FLAG}: argument index {i} is out of range: {target} takes "
                                 f"{count} argument(s) ({_known(names, count)}); give indices "
                                 f"0 to {count - 1} or parameter names")
        elif word in names[:count]:
            i = names.index(word)
        else:
            what = f"{word!r} is not an argument of" if word else "an empty entry in the list for"
            raise UsageError(f"{FLAG}: {what} {target} (its arguments: {_known(names, count)}); "
                             "name them by 0-based index or parameter name, comma-separated")
        out.add(i)
    return sorted(out)


def with_constants(user, spec: str | None):
    """``user`` (a ``cli.target.Target``) with the arguments ``spec`` names moved to the front,
    the one first argument its ``constant_params`` closes over (a tuple of them when several);
    ``user`` itself for the default (``None``: the first argument)."""
    from dataclasses import replace

    if spec is None:
        return user
    if not user.examples:
        raise UsageError(f"{FLAG} names example values to fold in: it needs an example factory "
                         "(FILE.py:FN returning (f, args)); with --arg every input is traced")
    picked = indices(spec, user.fn, len(user.args), user.name)
    if picked == [0]:
        return user
    rest = [i for i in range(len(user.args)) if i not in picked]
    fn, one = user.fn, len(picked) == 1

    def reordered(consts, *others):
        values = dict(zip(picked, (consts,) if one else consts))
        values.update(zip(rest, others))
        return fn(*(values[i] for i in range(len(values))))
    first = user.args[picked[0]] if one else tuple(user.args[i] for i in picked)
    return replace(user, fn=reordered, args=(first, *(user.args[i] for i in rest)))
