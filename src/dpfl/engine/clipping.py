"""The per-example clip of DP-SGD as the engine applies it, on every gradient strategy: each example's weight
w_j = min(1, C' / ||g_j||), so that its contribution w_j g_j has norm at most C for every input, finite or not.

The sensitivity argument of DP-SGD (Abadi et al. 2016; Noble et al. 2022, Alg. 1) needs one thing of the clipped sum:
adding, removing or replacing one example changes it by a vector of norm at most C (2C for a replacement). Any
contribution inside the ball of radius C serves, zero included. Two ways float32 arithmetic can break it:

* **Non-finite norms.** A record with large finite features (1e20 ... 3.4e38 pass the data checks) gives gradient
  entries whose squares overflow float32 (anything above 1.8e19 squares to inf), or entries that are inf or NaN
  themselves (an activation that overflows, inf - inf in a matmul). Its norm is then inf or NaN, and
  min(1, C / ||g||) g is 0 * inf = NaN or NaN * g: one record turns the client's sum, and the released model, into
  NaN. Here an example whose norm, as its strategy computes it in the model's dtype, is not finite gets weight 0 and
  its gradient's non-finite entries are replaced by 0 before the weighted sum (``finite_or_zero``), so it contributes
  exactly the zero vector; ``zeroed_examples`` counts such examples among the real (unmasked) ones, and the simulator
  reports the count (``RoundMetrics.nonfinite_examples``).
  Zeroing rather than rescaling (max-abs scaling, or float64 for the norm) is the choice: it is inside the ball, so
  the privacy argument is unchanged; it costs nothing on finite inputs, whose results stay bit for bit what they were
  (a float64 norm costs 6 to 10 % of a ghost step of Noble et al. 2022's synthetic workload, and changes the factor's
  rounding); and it only concerns gradients of norm above about 1.8e19, which no training record produces (a step
  along one would wreck the model without clipping): such a record is corrupt data, counted, not silently learned
  from. Zeroing may differ between strategies on the edge (the ghost strategy's norm is a product of layer factors,
  e.g. ||delta||^2 (||h||^2 + 1), which can overflow where the full sum would not): both are inside the ball. A finite
  norm means finite entries (each |g_i| <= ||g||), so a finite huge norm times a tiny factor is no 0 * inf: |w g_i| <=
  C, and w >= C' / 1.8e19 is a normal float32 for C >= 1e-18.
* **Rounding.** The weight and the product w g_i are rounded: with the exact factor C / ||g|| the clipped vector's
  norm can exceed C by a few units in the last place. The weight uses C' = C (1 - 2^-20) (``MARGIN``). The rounding
  between the float32 gradient entries and the clipped vector is: the norm's (a sum of squares of n nonnegative
  terms: each square and the square root within u = 2^-24 relative, the sum's error below (n - 1) u in the worst case
  and in practice some u for torch's blocked reductions; Higham 2002, Sec. 4), C' and the division (u each), and the
  product w g_i (u; two products, w delta_i then times h_j, on the ghost strategy's dense layers). The margin,
  2^-20 = 16 u, covers the 4 u of the factor and the products with 12 u left for the norm's sum. That is proven for
  the factor and the products, and for the norm up to that 12 u, which torch's float32 reductions keep in practice
  (the adversarial tests recompute each clipped vector's norm in float64 from its float32 entries); a worst-case
  bound for n terms would need a margin of n u (0.7 % for 110,526 parameters). On the ghost strategy's Gram route
  (``dpfl.engine.ghost``) the per-example gradient is never formed: its norm comes from Gram matrices and its
  contribution from a contraction over positions, so a cancellation within that contraction adds rounding the
  margin does not bound.
Examples the clip does not bite (||g|| <= C') keep weight exactly 1, so their sums are bit for bit what they were;
a clipped one's weight is the former C / (||g|| + 1e-12) times 1 - 2^-20 (to float32 rounding).
"""

from __future__ import annotations

import math

import torch

#: C' / C, the clip's float32 margin (module docstring).
MARGIN = 1.0 - 2.0**-20


def clip_weights(clip: float | torch.Tensor, norms: torch.Tensor, mask: torch.Tensor,
                 nonfinite: bool = True) -> torch.Tensor:
    """Each example's weight mask_j * min(1, C' / ||g_j||) [clients, batch], 0 where its norm is not finite. ``clip``:
    C, a number or one bound per client ([clients] tensor). ``nonfinite``: whether some norm may not be finite
    (``any_nonfinite``); False skips the steps that only such norms need.

    For a finite number C (the common case, few operations): min(1, C' / ||g||) is exactly 1 up to C' (a norm of 0
    included: C' / 0 = inf), C' / ||g|| above it, so 0 for an infinite norm and NaN for a NaN one, which
    ``nan_to_num_`` makes 0. For one bound per
    client, or an infinite C: the same weights with an explicit test of finiteness."""
    if not isinstance(clip, torch.Tensor) and clip != float("inf"):
        limit = MARGIN * clip
        weights = torch.clamp(limit / norms, max=1.0)
        return mask * (weights.nan_to_num_(nan=0.0) if nonfinite else weights)
    if isinstance(clip, torch.Tensor):
        clip = clip.to(norms.dtype).unsqueeze(-1)
    limit = MARGIN * clip
    finite = torch.isfinite(norms)
    weights = torch.where(finite & (norms > limit), limit / norms, 1.0)  # norm 0 (and C = inf) keep weight 1
    return torch.where(finite, mask * weights, 0.0)


def zeroed_examples(norms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The number of real examples (mask_j != 0) whose norm is not finite, which ``clip_weights`` gives weight 0 (a
    tensor on the norms' device: read it once a round, not once a step)."""
    return (~torch.isfinite(norms) & (mask != 0)).sum()


def any_nonfinite(norms: torch.Tensor) -> bool:
    """Whether some norm may not be finite, so that the weights need their NaN step, the zeroed examples their count
    and the gradient factors their cleaning (``finite_or_zero``) before the weighted sum: on a CPU, whether some norm
    is not finite (a host read costs nothing there, and finite inputs then skip that work); on another device always
    (no host read inside a step)."""
    return norms.device.type != "cpu" or not math.isfinite(float(norms.sum()))  # a huge finite sum: cleaned too


def finite_or_zero(values: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """``values`` with its infinite and NaN entries replaced by 0: the gradient factors of a zero-weighted example
    (0 * inf is NaN); the finite entries, among them every entry of an example whose norm is finite, are unchanged.
    ``in_place``: overwrite ``values`` (a temporary of the caller's) rather than copy it."""
    return torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0, out=values if in_place else None)


__all__ = ["MARGIN", "clip_weights", "zeroed_examples", "any_nonfinite", "finite_or_zero"]
