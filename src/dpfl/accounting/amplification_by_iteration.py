"""Privacy amplification by iteration (Feldman, Mironov, Talwar, Thakurta 2018) for one pass of projected noisy SGD
over disjoint batches: a per-position Renyi bound on the last iterate, converted to a hockey-stick bound.

**The theorem.** A contractive noisy iteration (CNI) is X_t = psi_t(X_{t-1}) + N_t with every psi_t 1-Lipschitz and
N_t ~ N(0, s_t^2 I). Feldman et al. 2018, Theorem 22: if two CNIs from the same X_0 use maps psi_t, psi'_t with
sup_x ||psi_t(x) - psi'_t(x)|| <= d_t and the same noise, then for any shifts a_t >= 0 whose running sums
z_t = sum_{i<=t} (d_i - a_i) stay >= 0 and end at z_T = 0,

    D_alpha(X_T || X'_T) <= sum_t alpha a_t^2 / (2 s_t^2)        for every alpha > 1.

**Projected noisy SGD is a CNI.** Step t of Algorithm 1 of Asoodeh et al. (2021) is W_t = proj_rho(Psi_t(W_{t-1}) -
N_t), Psi_t(w) = w - eta_t (mean_j g_j(w) + lambda w), N_t ~ N(0, s_t^2 I) with s_t = eta_t sigma_t / sqrt(m) (the
mean of m users' noise eta_t sigma_t Z_j). With Y_t = Psi_t(proj_rho(Y_{t-1})) - N_t the released W_T = proj_rho(Y_T)
is post-processing, and psi_t = Psi_t o proj_rho is 1-Lipschitz where Psi_t is: a convex, beta-smooth objective and
eta_t <= 2/beta (the projection onto a convex set is 1-Lipschitz). These are Theorem 2's convexity assumptions.

**Conditioning on the batches.** Given the secret partition, the owner of the differing record is in one batch t0
(or none); the two runs' maps differ at step t0 only, by d_t0 = sup ||eta_t0 (g - g') / m|| <= 2 eta_t0 L / m
(clipping: replacing one user moves its gradient by at most 2L). No step needs to contract at t0 itself (both runs
enter it from the same law); the steps after it must, until the shift is spent: with e(t0) the last step of the run
of contracting steps after t0 (steps after e(t0) are post-processing of X_e(t0), whatever their maps), the shifts
a_t = d_t0 s_t^2 / S (S = sum_{t=t0..e(t0)} s_t^2, zero elsewhere) minimise sum_t a_t^2 / s_t^2 subject to
sum_t a_t = d_t0 (Cauchy-Schwarz), which gives

    D_alpha(W_T^{t0} || W'_T^{t0}) <= alpha mu_t0^2 / 2,     mu_t0^2 = (2 eta_t0 L / m)^2 / S.

For a constant schedule of contracting steps, mu_t0 = 2L / (sigma sqrt(m k)) with k = T - t0 + 1 the noisy steps
from t0 on: the shift is spread over every noise draw the owner's contribution goes through. A step that does not
contract ends the window: with no contracting step after t0, mu_t0 = 2L / (sqrt(m) sigma_t0), the single step.

**Conversion.** The conditional pair has Renyi divergence at most alpha mu^2 / 2 at every order, so by Canonne,
Kamath, Steinke (2020, Prop. 12) its hockey-stick divergence at e^eps is at most

    min_{alpha > 1} exp((alpha - 1)(alpha mu^2 / 2 - eps)) (1 - 1/alpha)^alpha / (alpha - 1).

The exponent is convex in alpha (second derivative mu^2 + 1 / (alpha (alpha - 1)) > 0); ``log_delta_gaussian_rdp``
takes Newton steps from alpha = eps / mu^2 + 1/2 (the minimiser without the last two factors), and any alpha > 1 it
stops at gives a valid bound. The mixture over t0 (joint convexity of E_eps over the partition, as in Theorem 2 of
Asoodeh et al.) is ``dpfl.accounting.last_iterate``'s business.

**Not used here.** Altschuler & Talwar (2022, Theorem 3.1) bound the Renyi divergence of noisy SGD whose batches are
drawn afresh at every step (a record is used many times), constant in T beyond a burn-in T = O(D n / (L eta)) that
comes from the diameter D capping the accumulated shift; in one pass over disjoint batches each record enters once,
its shift is one step's 2 eta L / m, and the diameter helps only when rho < eta L / m. Ye & Shokri (2022) need strong
convexity (shifts contract by 1 - eta lambda per step): with dpfl's lambda that factor is close to 1. Both reduce to
the bound above in dpfl's setting up to these effects, which dpfl does not claim.
"""

from __future__ import annotations

import numpy as np

_NEWTON_STEPS = 20
_ALPHA_MIN = 1 + 1e-9


def shift_mu(lrs: np.ndarray, sigmas: np.ndarray, contractive: np.ndarray, batch_size: int,
             lipschitz: float) -> np.ndarray:
    """mu_t0 of every position t0 = 1..T (the module docstring): (2 eta_t0 L / m) / sqrt(sum_{t0..e(t0)} s_t^2).

    lrs, sigmas, contractive: per-step arrays of the T steps (eta_t, sigma_t, whether Psi_t is 1-Lipschitz).
    """
    lrs, sigmas = np.asarray(lrs, dtype=float), np.asarray(sigmas, dtype=float)
    contractive = np.asarray(contractive, dtype=bool)
    variance = (lrs * sigmas) ** 2 / batch_size  # s_t^2
    steps = variance.size
    # The window of t0 ends before the first step after t0 that does not contract (after the last step if none).
    breaks = np.flatnonzero(~contractive)
    later = np.searchsorted(breaks, np.arange(steps), side="right")  # index in breaks of the first break after t0
    next_break = np.append(breaks, steps)[later]
    suffix = np.concatenate([np.cumsum(variance[::-1])[::-1], [0.0]])  # suffix[t] = sum_{u >= t} s_u^2
    window = suffix[np.arange(steps)] - suffix[next_break]
    return (2 * lrs * lipschitz / batch_size) / np.sqrt(window)


def log_delta_gaussian_rdp(eps: float, mu: np.ndarray) -> np.ndarray:
    """log of the hockey-stick bound at e^eps implied by the Renyi curve alpha mu^2 / 2 (Canonne, Kamath, Steinke
    2020, Prop. 12), elementwise in mu > 0, capped at log 1 = 0."""
    mu2 = np.asarray(mu, dtype=float) ** 2
    alpha = np.maximum(eps / mu2 + 0.5, 1.5)
    for _ in range(_NEWTON_STEPS):  # f'(alpha) = (2 alpha - 1) mu^2 / 2 - eps + log(1 - 1/alpha), f'' > 0
        slope = (2 * alpha - 1) * mu2 / 2 - eps + np.log1p(-1 / alpha)
        step = alpha - slope / (mu2 + 1 / (alpha * (alpha - 1)))
        alpha = np.where(step > _ALPHA_MIN, step, (1 + alpha) / 2)  # an overshoot below 1 halves the way to 1
    value = (alpha - 1) * (alpha * mu2 / 2 - eps) + alpha * np.log1p(-1 / alpha) - np.log(alpha - 1)
    return np.minimum(value, 0.0)
