"""Does an optimized program compute what the original computes? The end-to-end value check.

``mlsys-jax optimize`` prints its verdict. Both ClosedJaxprs run (compiled together with
``jax.jit``) on the example inputs and on ``FRESH`` seeded inputs drawn like them — same shapes and
dtypes, floats at each array's own mean and spread, integers in its range, booleans at its rate,
PRNG keys folded to new ones. Then, element by element:

- integer, boolean and PRNG-key outputs must be equal;
- a float element is wrong where ``|a − b| > atol + rtol·|a|`` for that element (the tolerance of
  the least precise float dtype *that output's* computation passes through in the original,
  ``ir.precision.least_precise_dtype``: a float32 head beside a bfloat16 side output keeps
  float32's tolerance) *and* beyond the float64 twin's bound:
  the original run in float64 (``ir.widen``) gives r, and b may be as far from r as twice the
  original's own error there, ``|b − r| ≤ 2·|a − r| + atol + rtol·|r|`` (rounding that cancels at
  an element, where the sum of large terms is small, is the original's too), or, since the
  original's error at one element is a single draw that can be small by luck, ``NOISE_SIGMAS``
  times σ, the original's rounding noise at that element measured on the original itself
  (``rounding_noise``: runs with every rounding result perturbed by its dtype's eps). Both are
  per element, so a large region elsewhere in an output never widens another element's bound;
- a NaN or Inf where the original is finite is wrong, and so is a changed NaN/Inf.

Evidence must be able to refute the claim: an output that is the same on every input checked
(a zero-initialised last layer, a constant) shows nothing, and the verdict then is "not
established", never "yes". XLA's stateful RNG (``lax.rng_uniform``) gives other values on every
run, so both programs get the same draws in the same order (the state threaded identically); an
output whose draws cannot be threaded so (inside a loop) is not compared, and the reason named.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import ClosedJaxpr, Literal, bind_equation
from mlsys_jax.errors import MlsysError
from mlsys_jax.ir.interpret import lifted_indices, with_lifted
from mlsys_jax.ir.precision import least_precise_dtype
from mlsys_jax.ir.primitives import CONTROL, TRANSPARENT_CALLS
from mlsys_jax.ir.walk import bodies, walk
from mlsys_jax.ir.widen import is_float

# (rtol, atol) per float dtype: rounding a correct numeric rewrite (a BN folded into a conv)
# stays orders of magnitude below these; a wrong rewrite differs by the output's own size.
TOLERANCES = {"float64": (1e-9, 1e-12), "float32": (1e-4, 1e-6), "float16": (1e-2, 1e-3),
              "bfloat16": (5e-2, 1e-2)}
FRESH = 2                 # fresh input sets beside the example
# b may be this many σ of the original's measured rounding noise from the float64 twin
# (``rounding_noise``; ResNet-18's correct folds measured ≤ 5.9σ, a wrong fold thousands)
NOISE_SIGMAS = 8
STATEFUL_RNG = frozenset({"rng_uniform"})


@dataclass
class ValueCheck:
    """What the check saw: how many input sets, the worst difference, the elements wrong, the
    outputs that prove nothing (constant on every input) or could not be compared, and what
    failed."""

    inputs: int = 0
    max_abs_diff: float = 0.0      # over positions where both outputs are finite
    wrong: int = 0                 # float elements beyond tolerance and the twin's bound
    new_nonfinite: int = 0         # NaN/Inf in the optimized output where the original is finite
    vacuous: list = field(default_factory=list)      # output indices constant on every input
    uncompared: dict = field(default_factory=dict)   # output index -> why it is not compared
    problems: list = field(default_factory=list)
    tolerance: str = ""            # each float output's, in words (outputs named where they differ)
    within_twin: int = 0           # float elements past the tolerance, within the twin's bound

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def verdict(self) -> str:
        """'yes', 'no', or 'not established' (nothing wrong seen, but some output showed
        nothing: constant, or not comparable)."""
        if self.problems:
            return "no"
        return "not established" if self.vacuous or self.uncompared else "yes"

    def why_not_established(self) -> str:
        parts = []
        if self.vacuous:
            which = ", ".join(map(str, self.vacuous))
            parts.append(f"output {which} is the same on all {self.inputs} inputs checked "
                         "(constant or zero): a wrong rewrite could not show there")
        parts += [f"output {k} not compared: {why}" for k, why in self.uncompared.items()]
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {"inputs_checked": self.inputs, "max_abs_diff": self.max_abs_diff,
                "wrong_elements": self.wrong, "new_nonfinite": self.new_nonfinite,
                "vacuous_outputs": list(self.vacuous),
                "uncompared_outputs": {str(k): v for k, v in self.uncompared.items()},
                "problems": list(self.problems), "tolerance": self.tolerance,
                "within_twin_bound": self.within_twin,
                "check": self.verdict}


def tolerance(dtype) -> tuple:
    """(rtol, atol) for a float dtype."""
    return TOLERANCES.get(str(dtype), TOLERANCES["float32"])


def tolerance_dtypes(closed) -> list:
    """Per output of the original: the float dtype its tolerance is read in — the least precise
    its own computation passes through (``ir.precision``), its own dtype included; None for a
    non-float output. Not the program's least precise anywhere: that would judge a float32
    output by a bfloat16 side output's tolerance."""
    return [d if is_float(v.aval.dtype) else None
            for v, d in zip(closed.jaxpr.outvars, least_precise_dtype(closed))]


def _describe_tolerances(used: dict) -> str:
    """``{output: its tolerance in words}`` as one line: the tolerance alone where every output
    has the same, else each with the outputs it is theirs."""
    texts = list(dict.fromkeys(used[k] for k in sorted(used)))
    if len(texts) <= 1:
        return texts[0] if texts else ""
    parts = []
    for t in texts:
        ks = [k for k in sorted(used) if used[k] == t]
        parts.append(f"{t} (output{'s' if len(ks) > 1 else ''} {', '.join(map(str, ks))})")
    return "; ".join(parts)


# ---- inputs ------------------------------------------------------------------------------------

def drawn_like(x, rng, k: int):
    """A fresh value like ``x``: same shape and dtype, and its scale."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.fold_in(x, 1000 + k)
    a = np.asarray(x)
    if a.dtype == np.bool_:
        p = float(a.mean()) if a.size else 0.5
        return rng.random(a.shape) < (p if 0 < p < 1 else 0.5)
    if np.issubdtype(a.dtype, np.integer):
        lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 1)
        return rng.integers(lo, max(hi, lo + 1) + 1, a.shape).astype(a.dtype)
    wide = a.astype(np.float64)
    mean, std = (float(wide.mean()), float(wide.std())) if a.size else (0.0, 1.0)
    std = std if std > 0 else max(abs(mean), 1.0)
    return (mean + std * rng.standard_normal(a.shape)).astype(a.dtype)


def input_sets(inputs, fresh: int = FRESH, seed: int = 0) -> list:
    """The example inputs, then ``fresh`` seeded sets drawn like them."""
    rng = np.random.default_rng(seed)
    return [list(inputs)] + [[drawn_like(x, rng, k) for x in inputs] for k in range(fresh)]


# ---- running both programs ----------------------------------------------------------------------

def _stateful_sites(closed) -> list:
    """Stateful RNG equations, and whether each can be threaded (not inside control flow)."""
    found = []

    def visit(jaxpr, looped):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in STATEFUL_RNG:
                found.append((eqn, looped))
            for b in bodies(eqn):
                visit(b.jaxpr, looped or eqn.primitive.name in CONTROL)
    visit(closed.jaxpr, False)
    return found


def _threaded(closed, draws: list, big: list = ()):
    """A function running ``closed`` with its k-th stateful RNG draw replaced by ``draws[k]``;
    ``big`` (from :func:`mlsys_jax.ir.interpret.lifted`) replaces its large constants, so that
    under ``jax.jit`` they are arguments, not copies compiled into the program."""
    def interpret(jaxpr, consts, args, counter):
        env = dict(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))

        def read(v):
            return v.val if type(v) is Literal else env[v]
        for eqn in jaxpr.eqns:
            vals = [read(v) for v in eqn.invars]
            inner = bodies(eqn) if eqn.primitive.name in TRANSPARENT_CALLS else []
            if eqn.primitive.name in STATEFUL_RNG:
                outs = [jnp.asarray(draws[counter[0]], eqn.outvars[0].aval.dtype)]
                counter[0] += 1
            elif len(inner) == 1 and any(e.primitive.name in STATEFUL_RNG
                                         for _, e in walk(inner[0].jaxpr)):
                outs = interpret(inner[0].jaxpr, inner[0].consts, vals, counter)
            else:
                outs = bind_equation(eqn, vals)
            env.update(zip(eqn.outvars, outs))
        return [read(v) for v in jaxpr.outvars]
    return lambda *args: interpret(closed.jaxpr, with_lifted(closed, big), list(args), [0])


def _draws(sites, seed: int) -> list:
    """Seeded values for each stateful RNG site (uniform in its literal bounds, else [0, 1))."""
    rng = np.random.default_rng(seed)
    out = []
    for eqn, _ in sites:
        lo, hi = (float(np.asarray(v.val)) if type(v) is Literal else d
                  for v, d in zip(eqn.invars[:2], (0.0, 1.0)))
        out.append(rng.uniform(lo, hi, eqn.params["shape"]))
    return out


def _outputs_reading(closed, eqns) -> set:
    """Indices of the outputs computed (transitively, nested bodies too) from any of ``eqns``."""
    marks, tainted = {id(e) for e in eqns}, set()
    for eqn in closed.jaxpr.eqns:
        inside = any(id(e) in marks for b in bodies(eqn) for _, e in walk(b.jaxpr))
        if id(eqn) in marks or inside or any(type(v) is not Literal and v in tainted
                                             for v in eqn.invars):
            tainted.update(eqn.outvars)
    return {k for k, v in enumerate(closed.jaxpr.outvars) if type(v) is not Literal and v in tainted}


def _rng_plan(before, after) -> tuple:
    """(sites to thread, {output: why not compared}) for the stateful RNG of both programs."""
    sb, sa = _stateful_sites(before), _stateful_sites(after)
    if not sb and not sa:
        return [], {}
    same = len(sb) == len(sa) and all(x.params == y.params for (x, _), (y, _) in zip(sb, sa))
    looped = any(lp for _, lp in sb + sa)
    if same and not looped:
        return sb, {}
    why = ("it draws from XLA's stateful RNG (lax.rng_uniform) inside a loop, where every run "
           "draws other values and the draws cannot be given alike" if looped else
           "the programs draw from XLA's stateful RNG (lax.rng_uniform) a different number of "
           "times, so their draws cannot be given alike")
    return [], {k: why for k in _outputs_reading(before, [e for e, _ in sb])}


# ---- judging -----------------------------------------------------------------------------------

def _twin(before):
    """``twin(inputs)``: the original in float64 on one input set (None if it cannot run
    widened). Its large constants enter the compiled program as arguments, in their own dtype
    (``ir.interpret.lifted``), and are widened where they are read (``ir.evaluate``: a large
    kernel a block of output features at a time), so the twin holds no float64 copy of a
    factory's parameters."""
    from mlsys_jax.ir.evaluate import eval_open

    big = [before.consts[i] for i in lifted_indices(before)]

    def widened(values, *args):
        return eval_open(before.jaxpr, with_lifted(before, values), list(args), widen=True)
    fn, broken = jax.jit(widened), []

    def twin(xs):
        if broken:
            return None
        try:
            with jax.enable_x64(True):
                return [np.asarray(o, np.float64) for o in fn(big, *xs)]
        except Exception:  # a primitive without a float64 meaning: the plain tolerance stands
            broken.append(True)
            return None
    return twin


CHUNK = 1 << 20           # elements judged at a time: float64 temporaries stay ~30 MiB


def _floats(k, i, a, b, rtol, atol, *, twin, noise, check: ValueCheck) -> None:
    """Judge float output ``k`` on input set ``i``, ``CHUNK`` elements at a time, so that the
    float64 temporaries of a large output never exist whole (the verdict is per element)."""
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    new_bad = changed = past = n = 0
    worst = (-1.0, 0)  # (err, flat index) of the worst wrong element
    for lo in range(0, max(flat_a.size, 1), CHUNK):
        part = slice(lo, lo + CHUNK)
        got = _floats_chunk(flat_a[part], flat_b[part], rtol, atol, k=k, i=i, part=part,
                            twin=twin, noise=noise, check=check)
        new_bad, changed, past, n = (x + y for x, y in zip((new_bad, changed, past, n), got[:4]))
        if got[4][0] > worst[0]:
            worst = (got[4][0], lo + got[4][1])
    check.new_nonfinite += new_bad
    if new_bad:
        check.problems.append(f"output {k} on input {i}: {new_bad} NaN/Inf value(s) where the "
                              "original is finite")
    if changed:
        check.problems.append(f"output {k} on input {i}: {changed} NaN/Inf value(s) of the "
                              "original changed")
    check.within_twin += past - n
    if n:
        check.wrong += n
        at = tuple(int(j) for j in np.unravel_index(worst[1], a.shape)) if a.shape else ()
        a_at, b_at = (float(np.asarray(x[at], np.float64)) for x in (a, b))
        check.problems.append(f"output {k} on input {i}: {n} of {a.size} elements beyond "
                              f"atol + rtol·|original| (element {at}: {a_at:.6g} vs "
                              f"{b_at:.6g}) and beyond the float64 twin's bound (2·|original − "
                              f"float64| + {NOISE_SIGMAS}σ of the original's rounding noise)")


def _floats_chunk(a, b, rtol, atol, *, k, i, part, twin, noise, check) -> tuple:
    """(new NaN/Inf, changed NaN/Inf, past the tolerance, wrong, (worst err, its index)) over
    one flat chunk of output ``k``; the float64 references are read on the same chunk."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    fa, fb = np.isfinite(a64), np.isfinite(b64)
    new_bad = int(np.sum(fa & ~fb))
    changed = int(np.sum(~fa & ~((np.isnan(a64) & np.isnan(b64)) | (a64 == b64))))
    both = fa & fb
    with np.errstate(invalid="ignore"):
        err = np.where(both, np.abs(a64 - b64), 0.0)
    check.max_abs_diff = max(check.max_abs_diff, float(np.max(err, initial=0.0)))
    bad = both & (err > atol + rtol * np.abs(a64))
    past = int(bad.sum())
    if bad.any() and twin(i) is not None:
        r = twin(i)[k].reshape(-1)[part]
        bad &= ~_within_twin(r, a64, b64, rtol, atol)
        if bad.any() and noise(i) is not None:
            bad &= ~_within_twin(r, a64, b64, rtol, atol, noise(i)[k].reshape(-1)[part])
    n = int(bad.sum())
    worst = (-1.0, 0)
    if n:
        j = int(np.argmax(np.where(bad, err, -1)))
        worst = (float(err[j]), j)
    return new_bad, changed, past, n, worst


def _within_twin(r, a64, b64, rtol, atol, sigma=None):
    """Where b is as close to the float64 twin ``r`` as rounding puts the original: twice the
    original's own error there, or (``sigma``: the original's rounding noise at each element,
    ``rounding_noise``) NOISE_SIGMAS of it."""
    with np.errstate(invalid="ignore"):
        bound = 2 * np.abs(a64 - r) + atol + rtol * np.abs(r)
        if sigma is not None:
            bound = bound + NOISE_SIGMAS * sigma
        return np.abs(b64 - r) <= bound


def check_values(before: ClosedJaxpr, after: ClosedJaxpr, inputs, fresh: int = FRESH,
                 seed: int = 0) -> ValueCheck:
    """Run both programs on ``inputs`` and ``fresh`` sets drawn like them; judge every output
    element (see the module doc). One input set at a time: its outputs, float64 twin and
    rounding noise are dropped before the next set runs, so a large output is held a few times,
    not once per set and reference."""
    if not before.jaxpr.outvars:
        raise MlsysError("the function returns no outputs (None?): there is nothing to check; "
                         "return the values the model computes")
    sites, uncompared = _rng_plan(before, after)
    # a factory's parameters, folded in as constants, enter the program as arguments
    big = [[g.consts[i] for i in lifted_indices(g)] for g in (before, after)]
    both = jax.jit(lambda draws, bb, ba, *a: (_threaded(before, draws, bb)(*a),
                                              _threaded(after, draws, ba)(*a)))
    computes_in = tolerance_dtypes(before)
    sets = input_sets(inputs, fresh, seed)
    check = ValueCheck(inputs=len(sets), uncompared=uncompared)
    references = _lazy_references(before, big[0], sites)
    found, first, same, skip = {}, {}, {}, set()  # found: (k, order) -> that output's problems
    used = {}  # float output -> its tolerance in words
    for i, xs in enumerate(sets):
        run = both(_draws(sites, seed + i), *big, *xs)
        twin, noise = references(i, xs, run)
        for k in range(len(before.jaxpr.outvars)):
            if k in uncompared or k in skip:
                continue
            a, b = np.asarray(_data(run[0][k])), np.asarray(_data(run[1][k]))
            if a.dtype != b.dtype or a.shape != b.shape:
                found[k, 0] = [f"output {k} is {b.dtype}{list(b.shape)}, was "
                               f"{a.dtype}{list(a.shape)}"]
                skip.add(k)
                continue
            if i == 0:
                first[k], same[k] = _reference_of(a), True
            else:
                same[k] = same[k] and _same_as(first[k], a)
            check.problems, kept = found.setdefault((k, 1 + i), []), check.problems
            if is_float(a.dtype):
                used[k] = _tolerance_text(a.dtype, computes_in[k])
            _judge(k, i, a, b, computes_in[k], twin=twin, noise=noise, check=check)
            check.problems = kept
        run = twin = noise = a = b = None  # freed before the next set runs
    check.vacuous = [k for k in sorted(same) if same[k]]
    check.tolerance = _describe_tolerances(used)
    check.problems = [p for key in sorted(found) for p in found[key]]
    return check


def _judged_in(dtype, computes_in):
    """The dtype a float output of ``dtype`` is judged in: ``computes_in`` (its dataflow's least
    precise, :func:`tolerance_dtypes`) where that is less precise."""
    if computes_in is not None and jnp.finfo(computes_in).eps > jnp.finfo(dtype).eps:
        return computes_in
    return dtype


def _tolerance_text(dtype, computes_in) -> str:
    dtype = _judged_in(dtype, computes_in)
    rtol, atol = tolerance(dtype)
    return f"{dtype}: {atol:g} + {rtol:g}·|original| per element"


def _judge(k, i, a, b, computes_in, *, twin, noise, check: ValueCheck) -> None:
    """Output ``k`` on input set ``i``: equal (integers, booleans, keys) or within the tolerance
    of ``computes_in``, the least precise dtype its own computation passes through."""
    if not is_float(a.dtype):
        if not np.array_equal(a, b):
            check.problems.append(f"output {k} ({a.dtype}) on input {i} differs in "
                                  f"{int(np.sum(a != b))} of {a.size} elements")
        return
    rtol, atol = tolerance(_judged_in(a.dtype, computes_in))
    _floats(k, i, a, b, rtol, atol, twin=twin, noise=noise, check=check)


# ---- is an output the same on every input set? ---------------------------------------------------

DIGEST_MIN_ELEMENTS = 1 << 20  # a larger output is kept as a digest of its values, not a copy


def _reference_of(a):
    """What later sets' outputs are compared with: a copy of a small output, a digest of the
    canonical bytes of a large real one (NaNs made one NaN, −0 made +0: bytes equal exactly
    where ``np.array_equal(..., equal_nan=True)`` says equal; BLAKE2b-256, so a collision is
    no practical risk), so the first set's large outputs are not held to the end."""
    if a.size < DIGEST_MIN_ELEMENTS or np.iscomplexobj(a):
        return ("copy", np.array(a))
    return ("digest", a.dtype, a.shape, _digest(a))


def _same_as(ref, a) -> bool:
    if ref[0] == "copy":
        return np.array_equal(ref[1], a, equal_nan=is_float(a.dtype))
    return ref[1] == a.dtype and ref[2] == a.shape and ref[3] == _digest(a)


def _digest(a) -> bytes:
    import hashlib

    h, flat = hashlib.blake2b(digest_size=32), a.reshape(-1)
    for lo in range(0, flat.size, CHUNK):
        c = np.array(flat[lo:lo + CHUNK])
        if is_float(c.dtype):
            c[np.isnan(c)] = np.nan
            c[c == 0] = 0
        h.update(c.tobytes())
    return h.digest()


def _lazy_references(before, big, sites):
    """``references(i, xs, run)`` -> ``(twin, noise)`` for input set i: ``twin(i)``, the float64
    original, and ``noise(i)``, the original's rounding noise, each computed only where an
    element needs it (None: not available — stateful RNG, or a primitive without a float64
    meaning) and held only while set i is judged."""
    from mlsys_jax.passes.rounding_noise import noise_of

    run_twin = None if sites else _twin(before)
    run_noise = None if sites else noise_of(before, big)

    def references(i, xs, run):
        cache: dict = {}

        def twin(_):
            if "twin" not in cache:
                cache["twin"] = None if run_twin is None else run_twin(xs)
            return cache["twin"]

        def noise(_):
            if "noise" not in cache:
                cache["noise"] = None if run_noise is None else run_noise(
                    xs, [_data(o) for o in run[0]])
            return cache["noise"]
        return twin, noise
    return references


def _data(x):
    """PRNG keys are compared by their key data."""
    return jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x
