"""``optimize``'s rewrites and refusals grouped, and its module table compact, for the terminal.

A ResNet-18 gets ~140 ``fold_constants`` rewrites, one per equation, and 20 ``fold_conv_bn``
whose details differ only in the equation they name: one row per rule says the same in a few
lines. Details are grouped by their text with the numbers that differ between them replaced by
``N`` (``folded BatchNorm ... into conv at N ×16``), numbers they share kept; the paths are the
first and last (``--ops`` and ``--json`` list every row).
"""
from __future__ import annotations

import re

_NUMBER = re.compile(r"(\d+(?:\.\d+)?)")
SHOWN_WHERE = 2  # paths named in a group's "where" before it becomes "first … last"


def _skeleton(text: str) -> tuple:
    """``text`` split at its numbers: (the text between them, the numbers)."""
    parts = _NUMBER.split(text)
    return tuple(parts[0::2]), tuple(parts[1::2])


def templates(texts: list[str]) -> list[tuple[str, int]]:
    """``(template, count)`` per distinct text skeleton, in first-seen order: the numbers that
    differ within a skeleton's texts read ``N``."""
    groups: dict = {}
    for t in texts:
        words, numbers = _skeleton(t)
        groups.setdefault(words, []).append(numbers)
    out = []
    for words, numbers in groups.items():
        slots = [col[0] if len(set(col)) == 1 else "N" for col in zip(*numbers)]
        text = "".join(w + (slots[i] if i < len(slots) else "") for i, w in enumerate(words))
        out.append((text, len(numbers)))
    return out


def _where(paths: list[str]) -> str:
    return ", ".join(paths) if len(paths) <= SHOWN_WHERE else f"{paths[0]} … {paths[-1]}"


def _after_shared(text: str, first: str) -> str:
    """``text`` with the words it shares with ``first`` at its start shown as ``…``."""
    words, lead = text.split(" "), first.split(" ")
    n = next((i for i, (a, b) in enumerate(zip(words, lead)) if a != b), min(len(words),
                                                                              len(lead)))
    return "… " + " ".join(words[n:]) if n > 1 and n < len(words) else text


def _joined(texts: list[str]) -> str:
    """The group's distinct details, each with its count when there are several; short ones
    (one word) on one line; a detail that starts as the first one does shows only the rest."""
    found = templates(texts)
    if len(found) == 1:
        return found[0][0]
    first = found[0][0]
    parts = [f"{t if i == 0 else _after_shared(t, first)} ×{n}"
             for i, (t, n) in enumerate(found)]
    return ", ".join(parts) if all(" " not in t for t in texts) else "; ".join(parts)


def grouped(rows: list[dict], text: str, by: tuple = ("rule",)) -> list[dict]:
    """One row per distinct ``by`` key (the rule, for refusals also the check), in first-seen
    order: the rule, how many (``n``), where (first … last), and ``text``
    (``detail``/``reason``) templated."""
    keys: dict = {}
    for r in rows:
        keys.setdefault(tuple(r.get(k) for k in by), []).append(r)
    out = []
    for key, members in keys.items():
        n = len(members)
        row = {"rule": key[0], "n": n, "where": _where([str(r["where"]) for r in members]),
               text: _joined([str(r[text]) for r in members])}
        row.update({k: v for k, v in zip(by[1:], key[1:])})
        out.append(row)
    return out
