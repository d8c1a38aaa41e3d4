"""The audit's canaries, run through the real ``client_round`` of any algorithm that takes its per-example gradients
from the gradient oracle ``ctx.grads`` (``CohortGradients.clipped_sum``): the canaries wrap that oracle and mark the
data, nothing else. A white-box "Dirac" canary (below) and an input-space canary (``input_canary``: a real record;
``NullRecordGradients``: its zero-out neighbour).

Nasr, Hayes, Steinke, Balle, Tramer, Jagielski, Carlini, Terzis (USENIX Security 2023), "Tight auditing of
differentially private machine learning", Sec. 4: the strongest record for auditing DP-SGD is one whose clipped
gradient is a fixed direction e that no other record's gradient touches ("Dirac canary"); the attacker then reads
the update's coordinate along e, where the other records contribute nothing and only the noise hides the canary.

``DiracCanaryGradients`` wraps the run's ``CohortGradients`` (any gradient oracle with ``initial_params`` and
``clipped_sum``) and appends **one extra parameter coordinate** (index P, initialised to 0) to the model: the model's
loss does not depend on it, so no real record's gradient touches it, and weight decay and the noise treat it like
any other coordinate. A record is marked through its label (the data's labels are >= 0):

* ``CANARY`` (-1): the canary, gradient exactly C e (norm C = the clip bound in l2 and in l1, so clipping in either
  norm does not change it);
* ``OPPOSITE`` (-2): its replace-one neighbour, gradient -C e. Replacing a record changes one clipped term of the
  batch sum by at most 2C in norm; -C e attains that along e (and changes nothing else), so it is the worst-case
  replacement: the sum moves by exactly the sensitivity 2C the accounting assumes (``RecordSampler.mean_sensitivity``);
* ``ABSENT`` (-3): the zero-out neighbour (Poisson record sampling's relation), a null record of gradient 0. The
  client's count, hence the divisor q n_i (the expected batch size), stays the same; the sum moves by exactly C, the
  zero-out sensitivity. (Really deleting it would change n_i, the divisor and the noise scale: an add/remove claim
  does not hold for Poisson record sampling, tests/audit/test_findings.py.)

The **flipping** Dirac canary (``flip``) reverses its gradient once the model has left the initial point along e:
-C e at theta_e = 0 (the initial model), +C e anywhere else, and its neighbour the opposite. A per-example gradient
is any map of the model into the C-ball, so this is as admissible as the fixed one; it is the worst case of a
gradient DIFFERENCE g(w_r) - g(w_{r-1}) between the initial model and the next (norm 2C, the bound B_r of
FedProx-SPIDER without a verified smoothness, ``dpfl.algorithms.isrl_spider``), which a fixed-direction canary
leaves at 0: with it, SPIDER's difference stream carries the canary, and an accounting that leaves that stream out
is caught (tests/audit/test_spider_audit.py). It is not smooth, so it does not audit a sensitivity that relies on a
verified smoothness (SPIDER with ``feature_clip``).

A marked record's own features are ignored (its model gradient is replaced, not added to). ``scale`` multiplies the
canary's gradient (``scale = 10``: a planted bug, clipping skipped for a record of norm 10 C).

**Through the clip** (``raw``, ``dpfl audit --canary-norm K``). With ``raw = K`` the canary's gradient before
clipping is K C e (its neighbour's -K C e), and the engine's clip rule weighs it as it weighs every record
(``dpfl.engine.clipping.clip_weights``, the same function, looked up when called): min(1, C' / (K C)) K C e = C' e, the
fixed canary's shift to 2^-20 relative. A clip rule that lets a record of norm above C through (skipped, applied with
the wrong bound) then moves the sum by K times what the claim assumes, which the audit sees as a bound far above it.
It exercises the clip rule on a gradient the canary states, not a strategy's computation of the norm (a ghost norm's
bug stays invisible to it: the ghost clipping tests cover those).

**The randomiser's input** (``RandomiserInput``). A local randomiser (the shuffle-DP families' P_vec,
``dpfl.algorithms.sdp``) encodes every example's vector on its own, and its event assumes each vector lies in the l2
ball of radius C (``l2_shift``: replacing a record moves one vector by at most 2C); the randomiser itself only refuses
coordinates outside [-C, C], so a vector left unclipped (norm up to C sqrt(d)) would pass it. Every oracle here hands
those vectors out through ``clipped_examples`` and keeps the largest ||x|| / C it handed out (``largest_input``), the
canary's and its neighbour's included: the audit reports it beside its bound, and a value above 1 breaks the premise
of the claim (``dpfl.audit.runs``).
"""

from __future__ import annotations

import numpy as np
import torch

from dpfl.engine import clipping

CANARY, OPPOSITE, ABSENT = -1, -2, -3
#: The canary's gradient along e per mark (in units of the clip bound C).
SIGNS = {CANARY: 1.0, OPPOSITE: -1.0, ABSENT: 0.0}


#: Relative float error allowed above the clip bound in ``RandomiserInput.within_clip``.
INPUT_TOLERANCE = 1e-5


class RandomiserInput:
    """The view of a local randomiser's input (module docstring): ``largest_input``, the largest ||x|| / C over the
    vectors handed out by ``clipped_examples`` (None until one is)."""

    largest_input: float | None = None

    def _handed_out(self, vectors: torch.Tensor, clip) -> torch.Tensor:
        if vectors.numel():
            largest = float(vectors.double().norm(dim=-1).max()) / float(clip)
            self.largest_input = max(self.largest_input or 0.0, largest)
        return vectors


def within_clip(largest_input: float | None) -> bool:
    """Whether every vector a local randomiser received lay in the clip's ball (up to ``INPUT_TOLERANCE``)."""
    return largest_input is None or largest_input <= 1 + INPUT_TOLERANCE


class DiracCanaryGradients(RandomiserInput):
    """The run's gradient oracle with one extra coordinate e (index ``base.num_params``) for the canary (module
    docstring). Duck-typed like ``CohortGradients`` for ``LocalSGD``: ``initial_params``, ``clipped_sum``."""

    def __init__(self, base, scale: float = 1.0, flip: bool = False, raw: float | None = None):
        self.base, self.scale, self.flip, self.raw = base, float(scale), bool(flip), raw
        self.num_params = int(base.initial_params().shape[0]) + 1
        #: whether the clip rule has weighed the raw canary (an algorithm that never clips its records, e.g. one
        #: that clips a client's update instead, leaves it False: ``raw`` then exercises nothing)
        self.raw_clipped = False

    @property
    def coordinate(self) -> int:
        """The index of e in the (extended) parameter vector."""
        return self.num_params - 1

    def initial_params(self) -> torch.Tensor:
        x0 = self.base.initial_params()
        return torch.cat([x0, torch.zeros(1, dtype=x0.dtype)])

    def _split(self, y, mask):
        marked = y < 0
        signs = torch.zeros(y.shape, dtype=torch.float64)
        for label, sign in SIGNS.items():
            signs = torch.where(y == label, torch.tensor(sign, dtype=torch.float64), signs)
        return y.masked_fill(marked, 0), mask * (~marked).to(mask.dtype), signs * mask.double()

    def clipped_sum(self, theta, x, y, mask, clip, **kwargs):
        """[clients, P + 1]: the base model's clipped sum over the unmarked records, and along e the marked records'
        ``scale`` x sign x C."""
        y_base, mask_base, signs = self._split(y, mask)
        base = self.base.clipped_sum(theta[:, :-1], x, y_base, mask_base, clip, **kwargs)
        bound = torch.ones(theta.shape[0], dtype=torch.float64) if clip is None else \
            torch.as_tensor(clip, dtype=torch.float64).expand(theta.shape[0])
        along_e = self.scale * self._through_clip(signs, clip, bound).sum(1) * bound * direction(theta, self.flip)
        return torch.cat([base, along_e.to(base.dtype).unsqueeze(1)], dim=1)

    def _through_clip(self, signs: torch.Tensor, clip, bound: torch.Tensor) -> torch.Tensor:
        """[clients, batch]: each marked record's signed gradient along e in units of C, after the clip rule where
        the canary's raw norm is ``raw`` C (module docstring), else its sign."""
        if self.raw is None or clip is None:
            return signs
        norms = self.raw * bound.unsqueeze(1) * signs.abs()
        self.raw_clipped = True
        return signs * self.raw * clipping.clip_weights(clip, norms, (signs != 0).to(norms.dtype))

    def clipped_examples(self, theta, x, y, mask, clip):
        """[clients, batch, P + 1]: ``clipped_sum``'s terms one example at a time (for local randomisers)."""
        y_base, mask_base, signs = self._split(y, mask)
        base = self.base.clipped_examples(theta[:, :-1], x, y_base, mask_base, clip)
        bound = torch.full((theta.shape[0],), float(clip), dtype=torch.float64)
        along_e = self.scale * self._through_clip(signs, clip, bound) * float(clip) * \
            direction(theta, self.flip).unsqueeze(1)
        return self._handed_out(torch.cat([base, along_e.to(base.dtype).unsqueeze(2)], dim=2), clip)

    def example_norms(self, theta, x, y, mask, **kwargs):
        raise NotImplementedError("the Dirac canary audits a fixed clip bound (algorithm.clip_heuristic = 'fixed')")


def direction(theta: torch.Tensor, flip: bool) -> torch.Tensor:
    """[rows]: the sign of the canary's gradient along e at models ``theta`` [rows, P + 1] (e last): +1, or for the
    flipping canary -1 at the initial point theta_e = 0 and +1 once the model has moved along e (module
    docstring)."""
    ones = torch.ones(theta.shape[0], dtype=torch.float64)
    return torch.where(theta[:, -1] == 0, -ones, ones) if flip else ones


#: One-run canaries are marked ``FIRST_OF_MANY - i`` (canary i, i = 0..m-1): below every single-canary mark.
FIRST_OF_MANY = -4


class ManyDiracCanaryGradients(RandomiserInput):
    """The one-run audit's oracle: m canaries, canary i a Dirac gradient ``signs[i]`` x C along its own extra
    coordinate e_i (index ``base.num_params + i``, initialised to 0); a record marked ``FIRST_OF_MANY - i`` is canary
    i (its features ignored, as for ``DiracCanaryGradients``). ``signs[i]`` is +1 for an included canary and the
    neighbour's sign (-1 replace-one, 0 zero-out) for an excluded one, times ``scale``."""

    def __init__(self, base, signs: torch.Tensor):
        self.base, self.signs = base, torch.as_tensor(signs, dtype=torch.float64)
        self.base_params = int(base.initial_params().shape[0])
        self.num_params = self.base_params + self.signs.numel()

    def initial_params(self) -> torch.Tensor:
        x0 = self.base.initial_params()
        return torch.cat([x0, torch.zeros(self.signs.numel(), dtype=x0.dtype)])

    def clipped_sum(self, theta, x, y, mask, clip, **kwargs):
        m = self.signs.numel()
        index = FIRST_OF_MANY - y  # canary i at index i; real records (y >= 0) and single marks negative
        marked = (index >= 0) & (index < m)
        base = self.base.clipped_sum(theta[:, :self.base_params], x, y.masked_fill(marked, 0),
                                     mask * (~marked).to(mask.dtype), clip, **kwargs)
        bound = torch.ones(theta.shape[0], dtype=torch.float64) if clip is None else \
            torch.as_tensor(clip, dtype=torch.float64).expand(theta.shape[0])
        weight = torch.where(marked, self.signs[index.clamp(0, m - 1)], 0.0) * mask.double()
        rows, cols = marked.nonzero(as_tuple=True)
        along = torch.zeros(theta.shape[0], m, dtype=torch.float64)
        along.index_put_((rows, index[rows, cols]), weight[rows, cols], accumulate=True)
        return torch.cat([base, (along * bound.unsqueeze(1)).to(base.dtype)], dim=1)

    def clipped_examples(self, theta, x, y, mask, clip):
        """[clients, batch, P + m]: ``clipped_sum``'s terms one example at a time (for local randomisers)."""
        m = self.signs.numel()
        index = FIRST_OF_MANY - y
        marked = (index >= 0) & (index < m)
        base = self.base.clipped_examples(theta[:, :self.base_params], x, y.masked_fill(marked, 0),
                                          mask * (~marked).to(mask.dtype), clip)
        weight = torch.where(marked, self.signs[index.clamp(0, m - 1)], 0.0) * mask.double() * float(clip)
        along = torch.nn.functional.one_hot(index.clamp(0, m - 1), m).double() * weight.unsqueeze(2)
        return self._handed_out(torch.cat([base, along.to(base.dtype)], dim=2), clip)

    def example_norms(self, theta, x, y, mask, **kwargs):
        raise NotImplementedError("the Dirac canary audits a fixed clip bound (algorithm.clip_heuristic = 'fixed')")


class NullRecordGradients(RandomiserInput):
    """The run's gradient oracle with records marked ``ABSENT`` given gradient 0 (the zero-out neighbour of an input
    canary: the client's count, hence its divisor, stays the same). Duck-typed like ``CohortGradients``. It keeps
    the clipping the algorithm asked for (``clipping``: the bound and the norm of its last call), with which the
    input canary's own gradient is clipped."""

    def __init__(self, base):
        self.base = base
        self.clipping: tuple | None = None

    def initial_params(self) -> torch.Tensor:
        return self.base.initial_params()

    def clipped_sum(self, theta, x, y, mask, clip, **kwargs):
        self.clipping = (clip, kwargs)
        absent = y == ABSENT
        return self.base.clipped_sum(theta, x, y.masked_fill(absent, 0), mask * (~absent).to(mask.dtype), clip,
                                     **kwargs)

    def clipped_examples(self, theta, x, y, mask, clip):
        self.clipping = (clip, {})
        absent = y == ABSENT
        return self._handed_out(self.base.clipped_examples(theta, x, y.masked_fill(absent, 0),
                                                           mask * (~absent).to(mask.dtype), clip), clip)

    def example_norms(self, theta, x, y, mask, **kwargs):
        raise NotImplementedError("the audit audits a fixed clip bound (algorithm.clip_heuristic = 'fixed')")


def input_canary(train, seed: int, distance: float = 3.0) -> tuple[torch.Tensor, int]:
    """(features, label) of an input-space canary (Jagielski, Ullman, Oprea 2020, Sec. 4: a record far from the data
    with a label the data rarely has): a fixed random direction of the feature space (isotropic, drawn from
    ``seed``; nearly orthogonal to the data in high dimension) at ``distance`` times the largest record norm, labelled with the
    training data's least frequent label."""
    real = torch.arange(train.x.shape[1]).unsqueeze(0) < train.counts.unsqueeze(1)
    records = train.x[real]
    # a fixed feature vector, not noise (dpfl's noise is drawn only in dpfl.noise): an isotropic direction
    direction = torch.from_numpy(np.random.default_rng(int(seed)).standard_normal(tuple(records.shape[1:])))
    scale = distance * float(records.flatten(1).norm(dim=1).max()) / float(direction.norm())
    frequency = torch.bincount(train.y[real])
    return (direction * scale).to(train.x.dtype), int(torch.argmin(frequency))


def mark(y: torch.Tensor, client: int, record: int | slice, label: int) -> torch.Tensor:
    """A copy of the labels ``y`` [clients, records] with record ``record`` (or the records of a slice) of client
    ``client`` marked ``label``."""
    if label not in SIGNS:
        raise ValueError(f"label = {label} is not a canary mark: expected one of {sorted(SIGNS)}")
    marked = y.clone()
    marked[client, record] = label
    return marked


def neighbour_mark(neighboring: str) -> int:
    """The mark of the canary's neighbour under the run's relation (module docstring)."""
    if neighboring == "replace_one":
        return OPPOSITE
    if neighboring in ("zero_out", "add_remove"):
        return ABSENT
    raise ValueError(f"neighboring = {neighboring!r}: expected 'replace_one', 'zero_out' or 'add_remove'")


__all__ = ["CANARY", "OPPOSITE", "ABSENT", "SIGNS", "FIRST_OF_MANY", "INPUT_TOLERANCE", "RandomiserInput",
           "within_clip", "DiracCanaryGradients", "direction", "ManyDiracCanaryGradients",
           "NullRecordGradients", "input_canary", "mark", "neighbour_mark"]
