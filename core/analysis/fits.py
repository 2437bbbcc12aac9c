"""Least-squares fits of throughput X(N) against device count N: Amdahl and the Universal Scalability Law.

Pure Python (no numpy): the problems are tiny (a handful of points, at most three parameters).

- Amdahl:  X(N) = X1 * N / (1 + s (N - 1)); s the serial fraction, X1 the one-device throughput.
- USL:     X(N) = lambda * N / (1 + sigma (N - 1) + kappa N (N - 1))  (Gunther), peak at
           N* = sqrt((1 - sigma) / kappa) when kappa > 0.

Both minimize relative residuals (X_fit / X - 1): throughput spans orders of magnitude across N and a
1% miss at N=512 should weigh what a 1% miss at N=8 weighs. Parameters are kept physical (s in [0, 1],
sigma >= 0, kappa >= 0): a superlinear series is fitted at the bound rather than with a negative
contention term that would invent a peak.

The fits are total: any input (any finite or non-finite float, any N) gives parameters or a `FitRefused`
with its reason, never an exception. Throughput is normalised by the baseline (X at the smallest N) before
fitting, so the arithmetic sees values near 1 whether tokens/s is 1e-300 or 1e300; relative residuals make
the fit scale-free, and X1 and lambda are scaled back at the end (refused if that leaves the float range). A
series whose per-device throughput spans more than MAX_PER_DEVICE_SPAN across N is refused: no scaling law
describes it, and the arithmetic of the fits is only checked within that span.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

MIN_FIT_POINTS = 3
MAX_FIT_DEVICES = 2**24  # N beyond this is refused (the import and the matrix stop at 65,536)
MAX_PER_DEVICE_SPAN = 1e6  # max / min of X(N) / N across a series; beyond it the fit is refused
MIN_NORMALISED_X1 = 1e-9  # a fitted one-device throughput below this share of X(N0) is a collapsed fit
_GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True)
class FitRefused:
    """A fit that was not made, and why (shown as the fit's `reason`)."""

    reason: str


@dataclass(frozen=True)
class FitQuality:
    r_squared: float | None  # on X itself; None when every X is equal
    rms_rel_error: float  # sqrt(mean((X_fit / X - 1)^2)), a fraction
    num_points: int
    dof: int  # points minus fitted parameters


@dataclass(frozen=True)
class AmdahlParams:
    tokens_per_sec_one_device: float  # X1
    serial_fraction: float  # s
    quality: FitQuality

    def predict(self, num_devices: float) -> float:
        return amdahl_x(num_devices, self.tokens_per_sec_one_device, self.serial_fraction)


@dataclass(frozen=True)
class USLParams:
    lambda_tokens_per_sec: float  # throughput of one device at N=1
    sigma: float  # contention
    kappa: float  # coherency (crosstalk)
    quality: FitQuality

    def predict(self, num_devices: float) -> float:
        return usl_x(num_devices, self.lambda_tokens_per_sec, self.sigma, self.kappa)

    @property
    def peak_num_devices(self) -> float | None:
        if self.kappa <= 0 or self.sigma >= 1:
            return None
        return math.sqrt((1 - self.sigma) / self.kappa)


def amdahl_x(n: float, x1: float, s: float) -> float:
    return x1 * (n / (1 + s * (n - 1)))  # the speed-up first: x1 * n may overflow where the answer does not


def usl_x(n: float, lam: float, sigma: float, kappa: float) -> float:
    return lam * (n / (1 + sigma * (n - 1) + kappa * n * (n - 1)))


def fit_quality(ns: Sequence[float], xs: Sequence[float], predicted: Sequence[float], num_params: int) -> FitQuality:
    """R^2 and the RMS relative error; never raises (R^2 is scale-free: it is computed on X / max |X|, whose
    squares cannot overflow; a relative error against X = 0 is infinite)."""
    scale = max((abs(v) for v in (*xs, *predicted) if math.isfinite(v)), default=1.0) or 1.0
    xs_s, pred_s = [x / scale for x in xs], [p / scale for p in predicted]
    mean_x = sum(xs_s) / len(xs_s)
    ss_tot = sum((x - mean_x) * (x - mean_x) for x in xs_s)
    ss_res = sum((p - x) * (p - x) for p, x in zip(pred_s, xs_s))
    rel = [p / x - 1 if x else math.inf for p, x in zip(predicted, xs)]
    r2 = 1 - ss_res / ss_tot if ss_tot > 0 else None
    rms = math.sqrt(sum(r * r for r in rel) / len(rel))
    return FitQuality(r_squared=r2, rms_rel_error=rms, num_points=len(xs), dof=len(xs) - num_params)


def _normalised(ns: Sequence[float], xs: Sequence[float]) -> tuple[list[float], list[float], float] | FitRefused:
    """(N, X / X_ref, X_ref) with X_ref the throughput at the smallest N, or why the points cannot be fitted."""
    if len(ns) != len(xs):
        return FitRefused(f"not fitted: num_devices ({len(ns)}) and tokens_per_sec ({len(xs)}) differ in length")
    if any(not (isinstance(n, (int, float)) and 1 <= n <= MAX_FIT_DEVICES) for n in ns):
        return FitRefused(f"not fitted: num_devices must be in 1..{MAX_FIT_DEVICES} at every point")
    if len(set(ns)) < MIN_FIT_POINTS:
        return FitRefused(f"not fitted: fewer than {MIN_FIT_POINTS} points ({len(set(ns))} distinct N)")
    if any(not (math.isfinite(x) and x > 0) for x in xs):
        return FitRefused("not fitted: tokens_per_sec must be finite and > 0 at every point")
    x_ref = xs[min(range(len(ns)), key=ns.__getitem__)]
    per_device = [x / x_ref / n for n, x in zip(ns, xs)]  # the ratio first: x / n may underflow
    lo, hi = min(per_device), max(per_device)
    if not (lo > 0 and math.isfinite(hi) and hi <= lo * MAX_PER_DEVICE_SPAN):
        return FitRefused(
            f"not fitted: per-device throughput spans more than {MAX_PER_DEVICE_SPAN:g}x across N "
            "(no scaling law describes that; check the stored values)"
        )
    return [float(n) for n in ns], [x / x_ref for x in xs], x_ref


def _finite_fields(*values: float | None) -> bool:
    return all(v is None or math.isfinite(v) for v in values)


def _out_of_range(normalised_x1: float) -> FitRefused:
    return FitRefused(
        f"not fitted: the fitted one-device throughput ({normalised_x1:.3g} x X(N0)) is outside the float range"
    )


# ------------------------------------------------------------------------------------------ Amdahl


def _amdahl_x1_and_sse(ns: Sequence[float], xs: Sequence[float], s: float) -> tuple[float, float]:
    """Closed-form X1 for a fixed s (relative least squares), and the residual sum of squares."""
    u = [n / (1 + s * (n - 1)) / x for n, x in zip(ns, xs)]  # X_fit / X = X1 * u
    x1 = sum(u) / sum(v * v for v in u)
    return x1, sum((x1 * v - 1) ** 2 for v in u)


def fit_amdahl(ns: Sequence[float], xs: Sequence[float]) -> AmdahlParams | FitRefused:
    """Amdahl fit: a 1-D grid over s in [0, 1] (X1 closed form at each s), then golden-section refinement, on
    throughput normalised by the baseline."""
    prepared = _normalised(ns, xs)
    if isinstance(prepared, FitRefused):
        return prepared
    ns, ys, x_ref = prepared
    fit = _fit_amdahl_normalised(ns, ys)
    x1 = fit.tokens_per_sec_one_device * x_ref
    if not _finite_fields(x1, fit.serial_fraction, fit.quality.r_squared, fit.quality.rms_rel_error) or x1 <= 0:
        return _out_of_range(fit.tokens_per_sec_one_device)
    return AmdahlParams(tokens_per_sec_one_device=x1, serial_fraction=fit.serial_fraction, quality=fit.quality)


def _fit_amdahl_normalised(ns: Sequence[float], xs: Sequence[float]) -> AmdahlParams:
    # 1e-7 .. 1, log-spaced, 8 per decade: the error in s is unimodal at this resolution, and the golden-section
    # search below refines within the best cell (a 40-per-decade grid cost 4x more for the same answer).
    grid = [0.0] + [10 ** (-7 + i / 8) for i in range(57)]
    sse = [_amdahl_x1_and_sse(ns, xs, s)[1] for s in grid]
    best = min(range(len(grid)), key=sse.__getitem__)
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    s = _golden_min(lambda v: _amdahl_x1_and_sse(ns, xs, v)[1], lo, hi)
    if sse[best] < _amdahl_x1_and_sse(ns, xs, s)[1]:
        s = grid[best]
    x1, _ = _amdahl_x1_and_sse(ns, xs, s)
    quality = fit_quality(ns, xs, [amdahl_x(n, x1, s) for n in ns], num_params=2)
    return AmdahlParams(tokens_per_sec_one_device=x1, serial_fraction=s, quality=quality)


def _golden_min(f: Callable[[float], float], lo: float, hi: float, iters: int = 50) -> float:
    a, b = lo, hi
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = f(d)
    return (a + b) / 2


# --------------------------------------------------------------------------------------------- USL


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-300:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for k in range(col, n + 1):
                m[r][k] -= f * m[col][k]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (m[r][n] - sum(m[r][k] * out[k] for k in range(r + 1, n))) / m[r][r]
    return out


def _weighted_lstsq(cols: list[list[float]], y: list[float], w: list[float]) -> list[float] | None:
    """min sum w_i (sum_j c_j cols[j][i] - y_i)^2, columns scaled for conditioning."""
    scale = [math.sqrt(sum(wi * v * v for wi, v in zip(w, c))) or 1.0 for c in cols]
    sc = [[v / s for v in c] for c, s in zip(cols, scale)]
    ata = [[sum(wi * p * q for wi, p, q in zip(w, ci, cj)) for cj in sc] for ci in sc]
    aty = [sum(wi * p * yi for wi, p, yi in zip(w, ci, y)) for ci in sc]
    sol = _solve(ata, aty)
    return None if sol is None else [v / s for v, s in zip(sol, scale)]


def _usl_linear(ns: Sequence[float], xs: Sequence[float], free: tuple[str, ...]) -> tuple[float, float, float] | None:
    """USL linearization N/X = a + b (N-1) + c N (N-1), with a = 1/lambda, b = sigma/lambda, c = kappa/lambda.

    Weights 1/y^2 make the residuals relative (a relative error in y is one in X). `free` names which of
    sigma and kappa are fitted; the others are held at 0.
    """
    y = [n / x for n, x in zip(ns, xs)]
    cols = [[1.0] * len(ns)]
    cols += [[n - 1.0 for n in ns]] if "sigma" in free else []
    cols += [[n * (n - 1.0) for n in ns]] if "kappa" in free else []
    sol = _weighted_lstsq(cols, y, [1 / (v * v) for v in y])
    if sol is None or sol[0] <= 0:
        return None
    coef = dict(zip(("a",) + free, sol))
    return 1 / coef["a"], coef.get("sigma", 0.0) / coef["a"], coef.get("kappa", 0.0) / coef["a"]


def _usl_sse(ns: Sequence[float], xs: Sequence[float], p: tuple[float, float, float]) -> float:
    return sum((usl_x(n, *p) / x - 1) ** 2 for n, x in zip(ns, xs))


def _usl_refine(
    ns: Sequence[float], xs: Sequence[float], p: tuple[float, float, float], free: tuple[str, ...], iters: int = 50
) -> tuple[float, float, float]:
    """Levenberg-Marquardt on relative residuals in X (the linearization weighs them slightly differently)."""
    lam_damp, best = 1e-3, _usl_sse(ns, xs, p)
    idx = [0] + [1 + ("sigma", "kappa").index(f) for f in free]
    for _ in range(iters):
        jac, res = [], []
        for n, x in zip(ns, xs):
            d = 1 + p[1] * (n - 1) + p[2] * n * (n - 1)
            full = [n / (d * x), -p[0] * n * (n - 1) / (d * d * x), -p[0] * n * n * (n - 1) / (d * d * x)]
            jac.append([full[i] for i in idx])
            res.append(usl_x(n, *p) / x - 1)
        improved = False
        for _ in range(10):
            step = _lm_step(jac, res, lam_damp)
            if step is None:
                break
            trial = list(p)
            for i, s in zip(idx, step):
                trial[i] = max(trial[i] + s, 0.0 if i else 1e-300)
            trial_p = (trial[0], trial[1], trial[2])
            sse = _usl_sse(ns, xs, trial_p)
            if sse < best:
                p, best, lam_damp, improved = trial_p, sse, lam_damp / 10, True
                break
            lam_damp *= 10
        if not improved or best < 1e-28:
            break
    return p


def _lm_step(jac: list[list[float]], res: list[float], damp: float) -> list[float] | None:
    k = len(jac[0])
    jtj = [[sum(row[i] * row[j] for row in jac) for j in range(k)] for i in range(k)]
    for i in range(k):
        jtj[i][i] *= 1 + damp
    jtr = [-sum(row[i] * r for row, r in zip(jac, res)) for i in range(k)]
    return _solve(jtj, jtr)


def _snap_roundoff(p: tuple[float, float, float], n_max: float) -> tuple[float, float, float]:
    """Zero a term whose share of the denominator at the largest N is round-off (a kappa of 1e-20 would
    otherwise report a peak at N = 1e9)."""
    sigma = p[1] if p[1] * (n_max - 1) > 1e-9 else 0.0
    kappa = p[2] if p[2] * n_max * (n_max - 1) > 1e-9 else 0.0
    return p[0], sigma, kappa


def fit_usl(ns: Sequence[float], xs: Sequence[float]) -> USLParams | FitRefused:
    """USL fit: the linearized least squares (active set over sigma >= 0, kappa >= 0), then LM refinement, on
    throughput normalised by the baseline."""
    prepared = _normalised(ns, xs)
    if isinstance(prepared, FitRefused):
        return prepared
    ns, ys, x_ref = prepared
    fit = _fit_usl_normalised(ns, ys)
    if isinstance(fit, FitRefused):
        return fit
    lam = fit.lambda_tokens_per_sec * x_ref
    if not _finite_fields(lam, fit.sigma, fit.kappa, fit.quality.r_squared, fit.quality.rms_rel_error) or lam <= 0:
        return _out_of_range(fit.lambda_tokens_per_sec)
    return USLParams(lambda_tokens_per_sec=lam, sigma=fit.sigma, kappa=fit.kappa, quality=fit.quality)


def _fit_usl_normalised(ns: Sequence[float], xs: Sequence[float]) -> USLParams | FitRefused:
    candidates = []
    for r in (2, 1, 0):
        for free in combinations(("sigma", "kappa"), r):
            p = _usl_linear(ns, xs, free)
            if p is None or p[1] < 0 or p[2] < 0:
                continue
            p = _usl_refine(ns, xs, p, free)
            candidates.append((_usl_sse(ns, xs, p), -len(free), p, free))
        if candidates:
            break  # the fullest feasible model wins; smaller models only when it is infeasible
    if not candidates:  # the pure linear model is feasible whenever the arithmetic is (always, normalised)
        return FitRefused("not fitted: no USL model is feasible for these points (numerically degenerate)")
    _, _, p, free = min(candidates, key=lambda c: (c[0], c[1]))
    if p[0] < MIN_NORMALISED_X1:  # relative residuals prefer X_fit -> 0 (every residual -1) to a 5x overshoot
        return FitRefused(
            "not fitted: the USL collapses to zero throughput on these points (they do not follow "
            "a scaling law; check the stored values)"
        )
    p = _snap_roundoff(p, max(ns))
    quality = fit_quality(ns, xs, [usl_x(n, *p) for n in ns], num_params=1 + len(free))
    return USLParams(lambda_tokens_per_sec=p[0], sigma=p[1], kappa=p[2], quality=quality)
