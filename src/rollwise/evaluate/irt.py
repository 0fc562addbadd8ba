"""A 2PL item response model: p_ij = sigmoid(a_j (theta_i - b_j)).

Fit by MAP (design.md §4): theta ~ N(0, 1), b ~ N(0, 1), a ~ LogNormal(0, 0.5); the prior on
`a` is applied to log a (a normal with sd 0.5, i.e. the mode in log space), which keeps the fit
a smooth unconstrained problem. Missing cells (NaN) carry no likelihood, so a candidate that ran
only some items is fit on those. Outcomes may be fractional (a reward in [0, 1]): the Bernoulli
log-likelihood takes soft labels unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

LOG_A_SD = 0.5


@dataclass(frozen=True)
class Irt:
    theta: np.ndarray  # (C,) candidate abilities
    a: np.ndarray  # (I,) item discriminations, > 0
    b: np.ndarray  # (I,) item difficulties


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # stable for large |z|


def prob(theta: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """P(success) of every candidate on every item, (C, I)."""
    return _sigmoid(a[None, :] * (theta[:, None] - b[None, :]))  # (C, I)


def information(theta: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Fisher information a^2 p (1 - p) of each item at each ability, (C, I): where an item
    separates candidates near these abilities."""
    p = prob(theta, a, b)  # (C, I)
    return a[None, :] ** 2 * p * (1.0 - p)  # (C, I)


def _neg_log_post(x: np.ndarray, y: np.ndarray, m: np.ndarray) -> tuple[float, np.ndarray]:
    """Negative log posterior and its gradient over x = [theta (C), log a (I), b (I)]."""
    c, i = y.shape
    theta, log_a, b = x[:c], x[c : c + i], x[c + i :]
    a = np.exp(log_a)  # (I,)
    z = a[None, :] * (theta[:, None] - b[None, :])  # (C, I)
    nll = (m * (np.logaddexp(0.0, z) - y * z)).sum()
    g = m * (_sigmoid(z) - y)  # (C, I) dNLL/dz
    prior = 0.5 * (theta @ theta + b @ b + log_a @ log_a / LOG_A_SD**2)
    grad = np.concatenate(
        [
            (g * a[None, :]).sum(1) + theta,  # (C,)
            (g * z).sum(0) + log_a / LOG_A_SD**2,  # (I,)
            -(g * a[None, :]).sum(0) + b,  # (I,)
        ]
    )
    return float(nll + prior), grad


def fit_2pl(y: np.ndarray, max_iter: int = 500) -> Irt:
    """MAP fit of abilities and item parameters on a (C, I) matrix with NaN for missing cells.
    Deterministic: starts at the prior mode (theta 0, a 1) with b from each item's pass rate."""
    m = ~np.isnan(y)  # (C, I)
    y0 = np.where(m, y, 0.0)  # (C, I)
    c, i = y.shape
    rate = (y0.sum(0) + 0.5) / (m.sum(0) + 1.0)  # (I,) smoothed pass rate
    x0 = np.concatenate([np.zeros(c), np.zeros(i), -np.log(rate / (1 - rate))])
    res = minimize(
        _neg_log_post, x0, args=(y0, m.astype(float)), jac=True, method="L-BFGS-B",
        options={"maxiter": max_iter},
    )  # fmt: skip
    x = res.x
    return Irt(theta=x[:c], a=np.exp(x[c : c + i]), b=x[c + i :])


def fit_theta(
    y: np.ndarray, a: np.ndarray, b: np.ndarray, iters: int = 40
) -> tuple[np.ndarray, np.ndarray]:
    """Abilities with the items fixed (MAP, N(0,1) prior), by Newton steps vectorized over
    candidates; each candidate is fit on the cells it has. Returns (theta, its standard error),
    both (C,): the error is 1/sqrt(posterior information), so it shrinks with informative items."""
    m = ~np.isnan(y)  # (C, I)
    y0 = np.where(m, y, 0.0)  # (C, I)
    theta = np.zeros(y.shape[0])  # (C,)
    for _ in range(iters):
        p = prob(theta, a, b)  # (C, I)
        grad = (m * (p - y0) * a[None, :]).sum(1) + theta  # (C,)
        hess = (m * a[None, :] ** 2 * p * (1 - p)).sum(1) + 1.0  # (C,)
        theta = np.clip(theta - np.clip(grad / hess, -1.0, 1.0), -8.0, 8.0)  # (C,) damped
    p = prob(theta, a, b)  # (C, I)
    hess = (m * a[None, :] ** 2 * p * (1 - p)).sum(1) + 1.0  # (C,)
    return theta, 1.0 / np.sqrt(hess)
