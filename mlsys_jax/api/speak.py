"""Errors and hints in the Python API's words: the library and the commands name their options
as command-line flags (``--mesh data=3``, ``--zero``); a caller of ``mlsys_jax.shard`` wrote
``mesh={'data': 3}`` and ``zero=``. :func:`translate` rewrites one message; :func:`speaking`
re-raises an :class:`~mlsys_jax.errors.MlsysError` with its message translated.

Each API function gives its own table, flag name -> how to say it:

- ``"mesh"``-like (``kind="pairs"``): ``--mesh data=4,model=2`` -> ``mesh={'data': 4, 'model': 2}``
  (placeholders stay: ``--mesh data=N`` -> ``mesh={'data': N}``);
- a value option: ``--zero 3`` -> ``zero=3``, ``--zero must be`` -> ``zero must be``;
- a switch (``kind="bool"``): ``--search`` -> ``search=True``;
- anything else, literally: ``--ops`` -> ``table(ops=True)``.

``--devices N`` becomes the environment variable that gives a process N simulated devices.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

from mlsys_jax.errors import MlsysError

DEVICES_HOW = "XLA_FLAGS=--xla_force_host_platform_device_count={n} (set before importing jax)"
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)(?: ([^\s-]\S*|-\d\S*))?")
_NUMBER = re.compile(r"-?\d[\d_.,]*(e-?\d+)?")
_PLACEHOLDER = re.compile(r"[A-Z][A-Z_]*")
_TRAILING = ".,;:)"
# whole phrases that only make sense on a command line
PHRASES = {"give one --arg SPEC per positional argument":
           "pass one argument per positional parameter after the function"}


@dataclass(frozen=True)
class Say:
    """How one flag is said in the API: its keyword ``name`` and its ``kind``: ``value``,
    ``bool``, ``pairs`` (a dict from ``NAME=VALUE,...``) or ``literal`` (``name`` as is)."""

    name: str
    kind: str = "value"


def translate(message: str, flags: dict[str, Say], given: dict | None = None) -> str:
    """``message`` with every flag in ``flags`` (and ``--devices N``) said as the API says it.

    ``given`` (keyword -> the caller's value) lets a flag's value be recognised as one, e.g.
    ``--hw h9`` -> ``hw='h9'``.
    """
    for phrase, said in PHRASES.items():
        message = message.replace(phrase, said)
    given = given or {}

    def one(m: re.Match) -> str:
        flag, token = m.group(1), m.group(2)
        if flag == "devices" and token and _NUMBER.fullmatch(token.rstrip(_TRAILING)):
            bare = token.rstrip(_TRAILING)
            return DEVICES_HOW.format(n=bare) + token[len(bare):]
        say = flags.get(flag)
        if say is None:
            return m.group(0)
        rest = f" {token}" if token is not None else ""
        if say.kind == "literal":
            return say.name + rest
        if say.kind == "bool":
            return f"{say.name}=True{rest}"
        bare = (token or "").rstrip(_TRAILING)
        tail = (token or "")[len(bare):]
        if say.kind == "pairs" and "=" in bare:
            return f"{say.name}={_pairs(bare, quote=say.name != 'mesh')}{tail}"
        value = _value(bare, given.get(say.name)) if bare else None
        if value is None:
            return say.name + rest
        return f"{say.name}={value}{tail}"

    return _FLAG.sub(one, message)


def _pairs(text: str, quote: bool) -> str:
    """``data=4,[model=M]`` -> ``{'data': 4, 'model': M}`` (values quoted with ``quote``,
    numbers and placeholders never)."""
    items = []
    for part in text.replace("[", "").replace("]", "").split(","):
        key, _, value = part.partition("=")
        if not key:
            continue
        plain = _NUMBER.fullmatch(value) or _PLACEHOLDER.fullmatch(value) or not quote
        items.append(f"{key!r}: {value if plain else repr(value)}")
    return "{" + ", ".join(items) + "}"


def _value(token: str, given) -> str | None:
    """How ``token`` (the word after a flag) reads as the keyword's value, or None when it is
    not one (``--zero must be ...``)."""
    if _NUMBER.fullmatch(token) or _PLACEHOLDER.fullmatch(token) or token[:1] in "'\"":
        return token
    if given is not None and token == str(given):
        return repr(given)
    if re.fullmatch(r"[\d.]+%|[\d.]+[A-Za-z]{1,3}|min", token):
        return repr(token)
    return None


@contextlib.contextmanager
def speaking(flags: dict[str, Say], given: dict | None = None):
    """Re-raise an MlsysError from the block with its message translated (same class)."""
    try:
        yield
    except MlsysError as e:
        said = translate(str(e), flags, given)
        if said == str(e):
            raise
        try:
            new = type(e)(said)
        except TypeError:
            new = MlsysError(said)
        raise new from None


def mesh_text(mesh: dict) -> str:
    """``{'data': 4}`` -> ``data=4``, the command's form."""
    return ",".join(f"{k}={v}" for k, v in mesh.items())
