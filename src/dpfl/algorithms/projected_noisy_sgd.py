"""Projected noisy SGD over disjoint batches of users, releasing only the last iterate (Asoodeh, Chen, Calmon, Ozgur
2021, Algorithm 1), and its randomly stopped variant (their Corollary 3).

A trusted aggregator splits the n users into T = n/m disjoint batches by a secret, uniformly random partition (each
user takes part in exactly one round) and runs, from W_0 = proj_rho(the model's initialisation),

    user j in B_t sends    eta_t (g_j(W_{t-1}) + lambda W_{t-1} + sigma_t Z_j),   Z_j ~ N(0, I) from j's own stream
    W_t = proj_rho(W_{t-1} - (1/m) sum_{j in B_t} (what j sent)),    proj_rho(v) = v min(1, rho / ||v||)

and publishes only W_T ("projected-noisy-sgd"), or W_tau for tau uniform on {1..T}, drawn from the run's seed and
kept secret ("projected-noisy-sgd-random-stop": the rounds after tau contact nobody). Step sizes: eta_t = lr
(``lr_schedule = "constant"``) or eta_t = 1 / (lambda t) (``"inverse"``, their Corollary 1, lambda =
``weight_decay``, the strong convexity the L2 term guarantees).

**The unit of privacy.** The paper's user holds one data point x_i and neighbouring datasets replace one user's
point. In dpfl a user is a client and its point is the client's whole local data: g_j is the mean over the client's
records of their gradients, each clipped to norm L = ``clip`` (on features scaled to norm <= ``feature_clip`` when
given), so ||g_j|| <= L and replacing a client's entire data moves g_j by at most 2L. The guarantee is therefore
user-level (client-level) DP, which implies record-level DP; with one record per client (``data.samples_per_client
= 1``) the two coincide and this is exactly the paper's setting. sigma_t = 2 L z, z = ``noise_multiplier`` (dpfl's
convention: noise std over the replace-one sensitivity).

**Accounting.** Each round declares one Gaussian draw per user (``Release``) and, for an observer of the final
model only, the round as a ``ProjectedStepDpEvent``. With ``privacy.release = "final"`` (this family's default,
with ``privacy.boundary = "trusted"``: the paper's aggregator, which sees every message and is no observer) the third
party is charged by the last-iterate accountant, and the run reports beside it what composing every iterate would
cost. With ``privacy.analysis = "sound"`` (the default) that accountant takes, for each round a user may be in, the
smaller of Theorem 2's bound (Corollary 3 for random stopping) and amplification by iteration's (Feldman et al. 2018,
Theorem 22: ``dpfl.accounting.amplification_by_iteration``), which needs the same non-expansive steps as the diameter
2 rho below; ``"paper"`` is Theorem 2 / Corollary 3 alone. results.json's privacy.assumptions.bounds says which
bound applies and why. Every other observer sees iterates (a user in batch t receives
W_{t-1}) and is charged by composition. With ``privacy.release = "every_round"`` the third party is charged by
composition too.

**Theorem 2's assumptions.** The contraction of step t hides the earlier steps through the diameter D_t of
Psi_t(ball(rho)), Psi_t(w) = w - eta_t (mean_j g_j(w) + lambda w). Always, with clipping, D_t <= 2 (rho + eta_t L)
when eta_t lambda <= 2 (the non-convex diameter; checked). D_t <= 2 rho needs Psi_t non-expansive: a convex,
beta-smooth loss and eta_t <= 2/beta. The user states it (``convex = true``, optionally ``smoothness``); dpfl
verifies it where it can: logistic regression on features scaled to norm <= R (``feature_clip``), where each clipped
per-record gradient is the gradient of a convex function (two classes: a clipped generalised linear model;
more classes: only when the clip never binds, L >= sqrt(2 (R^2 + b))), with beta = (R^2 + b)/2 + lambda (b = 1
with a bias). A step with eta_t > 2/beta, or a claim dpfl cannot verify, falls back to the non-convex diameter; the
run says so on stderr and in results.json (privacy.assumptions); such a step also ends the rounds over which
amplification by iteration spreads a user's shift.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field

import torch

from dpfl.accounting.events import ProjectedStepDpEvent
from dpfl.accounting.last_iterate import ANALYSES
from dpfl.accounting.observers import THIRD_PARTY, Cohort, Release
from dpfl.accounting.units import USER_LEVEL
from dpfl.algorithms.registry import AlgorithmSpec, Calibration, Setting, register
from dpfl.engine import keys, randomness
from dpfl.engine.boundary import Delivery
from dpfl.noise import GaussianMechanism
from dpfl.engine.protocol import Algorithm, ClientContext, ClientData, ClientOutput, ServerContext, State
from dpfl.errors import ConfigError, check_noise_multiplier, check_range

NAMES = ("projected-noisy-sgd", "projected-noisy-sgd-random-stop")
SCHEDULES = ("constant", "inverse")


@dataclass(frozen=True)
class ProjectedNoisySGDConfig:
    """The ``[algorithm]`` keys of projected noisy SGD (beyond name and rounds)."""

    clients_per_round: int = field(default=1, metadata={"help": "m, the users of each disjoint batch (T = n/m "
                                                                "rounds make one pass)"})
    drop_remainder: bool = field(default=False, metadata={"help": "allow an m that does not divide n: the n mod m "
                                                                  "users the partition leaves over never take part"})
    lr: float = field(default=0.1, metadata={"help": "eta, the constant step size"})
    lr_schedule: str = field(default="constant", metadata={"choices": SCHEDULES,
                                                           "help": "'inverse': eta_t = 1 / (weight_decay t)"})
    weight_decay: float = field(default=0.01, metadata={"help": "lambda, the L2 regulariser (strong convexity)"})
    clip: float = field(default=1.0, metadata={"help": "L, each record's gradient norm bound (a user's gradient is "
                                                       "the mean of its records')"})
    radius: float = field(default=5.0, metadata={"help": "rho, the radius of the ball every iterate is projected "
                                                         "on", "min": 0})
    noise_multiplier: float | None = field(default=None, metadata={"help": "z: each user's noise std is z 2L "
                                                                           "(None: calibrated to privacy.epsilon)"})
    convex: bool = field(default=False, metadata={"help": "state that the loss is convex and smooth (Theorem 2's "
                                                          "diameter 2 rho); dpfl verifies it for logreg with "
                                                          "feature_clip, else keeps 2 (rho + eta_t L)"})
    smoothness: float | None = field(default=None, metadata={"help": "beta, the stated smoothness (dpfl uses the "
                                                                     "larger of it and its own bound)"})
    feature_clip: float | None = field(default=None, metadata={"help": "R: each record's features are scaled to "
                                                                       "norm <= R before its gradient", "min": 0})


@dataclass(frozen=True)
class ProjectedNoisySGD(Algorithm):
    """Projected noisy SGD over disjoint batches (see the module docstring)."""

    population: int  # n, the users
    batch_size: int  # m
    horizon: int  # T, the rounds planned (algorithm.rounds <= n // m)
    mechanism: GaussianMechanism  # z
    clip: float  # L
    radius: float  # rho
    lr: float = 0.1
    lr_schedule: str = "constant"
    weight_decay: float = 0.0
    smoothness: float | None = None  # beta where convexity is verified, else None (the non-convex diameter)
    feature_clip: float | None = None
    stop: int | None = None  # tau: rounds 0..tau-1 run, W_tau is released (random stopping); None: all T
    accountant: dict | None = None  # {"third_party": "last_iterate"} when only the final model is released
    analysis: str = "sound"  # privacy.analysis: "paper" charges the last iterate by Theorem 2 / Corollary 3 alone
    assumptions: dict = field(default_factory=dict)  # what the accounting relies on, for results.json

    neighboring = "replace_one"
    privacy_unit = USER_LEVEL

    @property
    def sigma(self) -> float:
        """sigma_t = 2 L z, each user's noise std (Asoodeh et al.'s sigma, in the units of L)."""
        return 2 * self.clip * self.mechanism.noise_multiplier

    def step_size(self, t: int) -> float:
        """eta_t of round t (0-based): lr, or 1 / (lambda (t + 1)) (Asoodeh et al. Corollary 1)."""
        return self.lr if self.lr_schedule == "constant" else 1.0 / (self.weight_decay * (t + 1))

    def nonconvex(self, t: int) -> bool:
        """Whether step t uses the diameter 2 (rho + eta_t L): no verified smoothness, or eta_t > 2/beta."""
        return self.smoothness is None or self.step_size(t) > 2 / self.smoothness

    def hidden_step(self, t: int) -> ProjectedStepDpEvent:
        return ProjectedStepDpEvent(self.population, self.batch_size, self.clip, self.radius, self.step_size(t),
                                    self.sigma, self.nonconvex(t), self.stop is not None, self.horizon,
                                    analysis=self.analysis)

    def runs(self, t: int) -> bool:
        """Whether round t contacts its batch (random stopping: only rounds before tau do)."""
        return self.stop is None or t < self.stop

    # -- the protocol -------------------------------------------------------------------------------------------
    def init_state(self, x0: torch.Tensor, num_clients: int) -> State:
        return State({"x": project(x0.clone(), self.radius)})

    def release(self, round_index: int, state: State, counts: torch.Tensor) -> Release:
        """One Gaussian draw per user of the batch (each user is in one batch: the composition view charges it
        once, in round 0, with the batch's m shares), and the round as a hidden step for the last iterate."""
        cohort = Cohort.scheduled(self.population, self.batch_size, self.batch_size, round_index == 0)
        hidden = self.hidden_step(round_index)
        if not self.runs(round_index):
            return Release((), (), cohort=cohort, paper="asoodeh", hidden=hidden)
        return Release((self.mechanism.event,), (True,), 1.0, cohort, paper="asoodeh", hidden=hidden)

    def examples_per_client(self, counts: torch.Tensor) -> int:
        return int(counts.max())

    def user_gradient(self, grads, point: torch.Tensor, data: ClientData) -> torch.Tensor:
        """g_j: the mean over each user's records of their L-clipped gradients [users, P], ||g_j|| <= L."""
        width = data.x.shape[1]
        mask = (torch.arange(width).unsqueeze(0) < data.counts.unsqueeze(1)).to(torch.float32)
        x = data.x if self.feature_clip is None else scale_to_norm(data.x, self.feature_clip)
        total = grads.clipped_sum(point, x, data.y, mask, self.clip)
        return total / data.counts.clamp(min=1).to(point.dtype).unsqueeze(1)

    def client_round(self, round_index: int, server: dict, clients: dict, data: ClientData,
                     ctx: ClientContext) -> ClientOutput:
        """Each user of the batch sends eta_t (g_j + lambda W + sigma_t Z_j): {dw}. The server state may carry a
        leading row axis (one server state per row: ``dpfl.engine.protocol``)."""
        if not self.runs(round_index):
            return ClientOutput({}, {}, [])
        x = server["x"]
        users, P = data.counts.shape[0], x.shape[-1]
        point = x.expand(users, P)
        gradient = self.user_gradient(ctx.grads, point, data)
        sensitivity = torch.full((users,), 2 * self.clip, dtype=torch.float64)  # replacing a user's data
        noisy, event = self.mechanism(gradient, sensitivity, ctx.streams("noise").normal((P,)))
        if self.weight_decay:
            noisy = noisy + self.weight_decay * point
        return ClientOutput({"dw": self.step_size(round_index) * noisy}, {}, [event])

    def server_update(self, round_index: int, server: dict, delivered: Delivery, ctx: ServerContext) -> dict:
        """W_t = proj_rho(W_{t-1} - the batch's mean message)."""
        if delivered.count == 0:
            return server
        return {"x": project(server["x"] - delivered.sum("dw") / delivered.count, self.radius)}

    def regulariser(self, x: torch.Tensor) -> float:
        return 0.5 * self.weight_decay * float(x.double().square().sum())

    def divergence_hint(self, counts: torch.Tensor) -> str:
        return "lower algorithm.lr or algorithm.radius (every iterate is projected on the ball of that radius)"


def project(w: torch.Tensor, radius: float) -> torch.Tensor:
    """proj_rho(w) = w min(1, rho / ||w||) over the last axis."""
    norm = w.norm(dim=-1, keepdim=True)
    return w * torch.clamp(radius / norm.clamp(min=torch.finfo(w.dtype).tiny), max=1.0)


def scale_to_norm(x: torch.Tensor, bound: float) -> torch.Tensor:
    """Each record's features [clients, records, ...] scaled to l2 norm <= ``bound`` (a public map, the same on
    every dataset: the data domain becomes the ball of radius ``bound``)."""
    flat = x.reshape(*x.shape[:2], -1)
    norm = flat.norm(dim=-1, keepdim=True).clamp(min=torch.finfo(x.dtype).tiny)
    return (flat * torch.clamp(bound / norm, max=1.0)).reshape(x.shape)


# -- building -----------------------------------------------------------------------------------------------------
def cohort_of(config: ProjectedNoisySGDConfig, num_clients: int) -> tuple[float, str]:
    """(m / n, "disjoint"): the secret random partition into batches of m (``ClientSampler``'s disjoint batches)."""
    m = check_range("algorithm.clients_per_round", config.clients_per_round, 1, num_clients, integer=True)
    if num_clients % m and not config.drop_remainder:
        raise ConfigError("algorithm.clients_per_round", m,
                          f"a divisor of the {num_clients} clients (T = n/m disjoint batches, each client in exactly "
                          f"one), or set algorithm.drop_remainder = true to leave the {num_clients % m} clients the "
                          "partition leaves over out of the run")
    return m / num_clients, "disjoint"


def max_rounds(config: ProjectedNoisySGDConfig, num_clients: int) -> int:
    """T <= n // m: one pass, each user in one batch."""
    return num_clients // check_range("algorithm.clients_per_round", config.clients_per_round, 1, num_clients,
                                      integer=True)


def verified_smoothness(config: ProjectedNoisySGDConfig, setting: Setting) -> tuple[float | None, str]:
    """(beta, why) when dpfl can verify that every user's clipped loss plus lambda ||w||^2 / 2 is convex and
    beta-smooth on the whole data domain; (None, why not) otherwise (see the module docstring)."""
    model = setting.model.get("name", "logreg")
    if model != "logreg":
        return None, f"model.name = {model!r} is not a convex model (dpfl verifies 'logreg' only)"
    if setting.loss is not None:
        return None, f"the loss {setting.loss!r} is a caller's (dpfl verifies logistic regression's cross-entropy only)"
    if config.feature_clip is None:
        return None, ("algorithm.feature_clip is not set: without a bound R on a record's features the logistic "
                      "loss has no smoothness bound over the data domain")
    bias = 1.0 if setting.model.get("bias", True) else 0.0
    u2 = config.feature_clip ** 2 + bias  # ||(x, 1)||^2 <= R^2 + b
    if (setting.num_classes or 2) > 2 and config.clip < math.sqrt(2 * u2):
        return None, (f"{setting.num_classes} classes with algorithm.clip = {config.clip:g} < sqrt(2 (R^2 + b)) = "
                      f"{math.sqrt(2 * u2):.4g}: a clipped softmax gradient is not the gradient of a convex function "
                      "(raise algorithm.clip to that bound, where clipping never binds)")
    beta = u2 / 2 + config.weight_decay
    return beta, (f"logistic regression on features of norm <= R = {config.feature_clip:g}: convex, "
                  f"beta = (R^2 + b)/2 + lambda = {beta:.6g}")


def _checked(config: ProjectedNoisySGDConfig, setting: Setting) -> None:
    if config.lr_schedule not in SCHEDULES:
        raise ConfigError("algorithm.lr_schedule", config.lr_schedule, f"one of {list(SCHEDULES)}")
    if setting.analysis not in ANALYSES:
        raise ConfigError("privacy.analysis", setting.analysis, f"one of {list(ANALYSES)} for projected noisy SGD "
                                                                "('paper': Asoodeh et al.'s Theorem 2 alone)")
    check_range("algorithm.clip", config.clip, 0.0, low_open=True)
    check_range("algorithm.radius", config.radius, 0.0, low_open=True)
    check_range("algorithm.weight_decay", config.weight_decay, 0.0)
    check_range("algorithm.lr", config.lr, 0.0, low_open=True)
    for key in ("smoothness", "feature_clip"):
        if getattr(config, key) is not None:
            check_range(f"algorithm.{key}", getattr(config, key), 0.0, low_open=True)
    if config.noise_multiplier is not None:
        check_noise_multiplier("algorithm.noise_multiplier", config.noise_multiplier)
    if config.lr_schedule == "inverse" and config.weight_decay <= 0:
        raise ConfigError("algorithm.weight_decay", config.weight_decay,
                          "a positive lambda with lr_schedule = 'inverse' (eta_t = 1 / (lambda t))")
    if config.lr_schedule == "constant" and config.lr * config.weight_decay > 2:
        raise ConfigError("algorithm.lr", config.lr, f"at most 2 / weight_decay = {2 / config.weight_decay:g} (eta "
                                                     "lambda <= 2 keeps the non-convex diameter 2 (rho + eta L))")
    if config.noise_multiplier is not None and setting.epsilon is not None:
        raise ConfigError("privacy.epsilon", setting.epsilon, "None when algorithm.noise_multiplier is set (or leave "
                                                              "the noise multiplier unset: it is calibrated to epsilon)")
    if config.noise_multiplier is None and setting.epsilon is None:
        raise ConfigError("algorithm.noise_multiplier", None, "a positive number, or set privacy.epsilon to calibrate "
                                                              "the noise to it")


def _smoothness(config: ProjectedNoisySGDConfig, setting: Setting) -> tuple[float | None, str]:
    """beta for the convex diameter, or None, and what the accounting relies on (warned when a claim falls back)."""
    if not config.convex:
        return None, "not stated (algorithm.convex = false): the non-convex diameter 2 (rho + eta_t L)"
    beta, why = verified_smoothness(config, setting)
    if beta is None:
        message = (f"algorithm.convex = true is not verified ({why}); the privacy accounting falls back to the "
                   "non-convex diameter 2 (rho + eta_t L)")
        warnings.warn(message, stacklevel=3)
        return None, message
    if config.smoothness is not None and config.smoothness >= beta:
        return config.smoothness, f"stated beta = {config.smoothness:g}, at least dpfl's bound ({why})"
    return beta, f"verified: {why}"


def build(name: str, config: ProjectedNoisySGDConfig, setting: Setting) -> ProjectedNoisySGD:
    if name not in NAMES:
        raise ConfigError("algorithm.name", name, f"one of {list(NAMES)}")
    _checked(config, setting)
    n, m = setting.num_clients, config.clients_per_round
    horizon = check_range("algorithm.rounds", setting.rounds, 1, n // m, integer=True)
    beta, convexity = _smoothness(config, setting)
    stop = None
    if name.endswith("random-stop"):  # tau ~ U{1..T} from the noise key's own stream (secret, data independent)
        key = keys.fresh_key() if setting.secret is None else setting.secret
        stop = 1 + int(torch.randint(horizon, (1,), generator=randomness.generator(key, 0, randomness.SERVER, "stop")))
    algorithm = ProjectedNoisySGD(
        population=n, batch_size=m, horizon=horizon,
        mechanism=GaussianMechanism(setting.calibrated_noise() or config.noise_multiplier),
        clip=config.clip, radius=config.radius, lr=config.lr, lr_schedule=config.lr_schedule,
        weight_decay=config.weight_decay, smoothness=beta, feature_clip=config.feature_clip, stop=stop,
        accountant={THIRD_PARTY: "last_iterate"} if setting.release == "final" else None, analysis=setting.analysis,
    )
    steps = [algorithm.nonconvex(t) for t in range(horizon)]
    diameter = "2 rho" if not any(steps) else "2 (rho + eta_t L)" if all(steps) else \
        f"2 (rho + eta_t L) in the {sum(steps)} rounds where eta_t > 2/beta, 2 rho in the others"
    return dataclasses.replace(algorithm, assumptions={
        "convex_smooth": convexity, "smoothness": beta, "lipschitz": config.clip, "radius": config.radius,
        "diameter": diameter, "noise_multiplier": algorithm.mechanism.noise_multiplier, "sigma": algorithm.sigma,
        "released": ("W_tau, tau ~ U{1..T} (Corollary 3)" if stop is not None else "W_T (Theorem 2)")
        if setting.release == "final" else "every iterate (composition)",
        "bounds": _bounds(setting.analysis, steps, stop is not None, config.lr_schedule),
    })


def _bounds(analysis: str, nonconvex: list[bool], random_stop: bool, schedule: str) -> dict[str, str]:
    """Which proven bounds the last-iterate claim takes the minimum of, and why each applies or not (results.json's
    privacy.assumptions.bounds)."""
    asoodeh = "Asoodeh et al. 2021, Theorem 2" + (" / Corollary 3" if random_stop else "")
    if analysis == "paper":
        return {"claim": f"{asoodeh} alone (privacy.analysis = 'paper'; the other observers: classic conversion)"}
    if random_stop and schedule != "constant":
        iteration = ("not used: random stopping with a varying schedule (eta_t = 1 / (lambda t)) would need every "
                     "pair (entry step, stop) - O(T^2); Corollary 3 alone")
    elif all(nonconvex):
        iteration = ("applies, but hides nothing: no round is verified to contract (convex, beta-smooth, "
                     "eta_t <= 2/beta), so each user's shift is absorbed by its own round's noise alone")
    else:
        contracting = len(nonconvex) - sum(nonconvex)
        iteration = (f"applies: a user's shift 2 eta_t L / m is spread over the noise of its round and of the "
                     f"contracting rounds after it ({contracting} of {len(nonconvex)} rounds contract: convex, "
                     "beta-smooth, eta_t <= 2/beta); Renyi, converted per round by Canonne et al. 2020 Prop. 12")
    return {"claim": "per round a user may be in, the smaller of the bounds below; mixed over the secret partition",
            asoodeh: "applies (the diameter above)",
            "Feldman et al. 2018, Theorem 22 (amplification by iteration)": iteration}


register(AlgorithmSpec(
    names=NAMES, config=ProjectedNoisySGDConfig, build=build, private=lambda name: True,
    help="projected noisy SGD over a secret partition of the users into disjoint batches, releasing only the last "
         "(or a randomly stopped) iterate, accounted by the contraction of hidden steps (Asoodeh et al. 2021)",
    release_keys=("algorithm.rounds",), cohort=cohort_of, max_rounds=max_rounds,
    privacy_defaults={"boundary": "trusted", "release": "final"},
    calibration=Calibration(lambda name, config, setting: (THIRD_PARTY,)),  # the paper's guarantee: the released model
))
