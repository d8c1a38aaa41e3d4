"""FedAvg, FedSGD, SCAFFOLD, SCAFFOLD-warm and their record-level DP versions: one algorithm, four switches.

Noble, Bellet, Dieuleveut (AISTATS 2022), Algorithm 1 (DP-SCAFFOLD) and Algorithm 2 (DP-FedAvg). For a
cohort C_t of clients, each i in C_t starts from y = x_{t-1} and runs K local steps

    H~  = (1/b_i) sum_{j in S} clip_C(grad f_i(y, d_j)) + (2C/b_i) N(0, sigma_g^2 I) + lambda y        (Alg. 1, l. 9)
    y  <- y - eta_l (H~ - c_i + c)                                                                     (Alg. 1, l. 10)

with eta_l = eta0 / (s K) (Noble et al. Sec. 5), fresh minibatches S of size b_i = floor(s n_i) at every step, and
lambda y the L2 regulariser's gradient, added after the noise (it does not touch the data: post-processing). Then

    c_i+ = c_i - c + (x_{t-1} - y) / (K eta_l)  ( = the mean of the K noisy gradients H~ )            (Alg. 1, l. 12)
    x_t  = x_{t-1} + eta_g mean_{i in C_t} (y_i - x_{t-1})
    c_t  = c_{t-1} + (1/M) sum_{i in C_t} (c_i+ - c_i)          (keeps c = mean_i c_i; not c += l mean(dc))

The switches:
* control_variates=False drops the correction c - c_i: DP-FedAvg (Algorithm 2).
* move_locally=False evaluates all K noisy gradients at x_{t-1} and sends -eta_l K (their mean): FedSGD, i.e. one
  large-batch gradient step per round (with K s = 1 one pass over the data in expectation, as the authors' code).
* warm_rounds > 0 (SCAFFOLD-warm): the first round(4/l) rounds only fit c_i0 = mean_k H~_k(x0) for the sampled
  clients and leave x unchanged; they sample users at rate l and are counted in T (Noble et al. Sec. 4, "warm start").
* noise_multiplier = 0 and clip = None: the non-private algorithms.
* run.secure_noise: the mechanism is ``dpfl.noise.DiscreteGaussianMechanism`` (``registry.Setting.gaussian``); it draws
  its own noise from each client's secure stream (``mechanism.draws``), so the steps below do not change.
* clip_heuristic = "median-nonprivate": the experiments' heuristic (Noble et al. Sec. 5: C = the median per-example
  gradient norm of the current batch, per client and step). The bound then depends on the data, which the privacy
  analysis does not cover: the noise is still added (scaled to that C) but the run's events are NonPrivate, so every
  observer's epsilon is reported as infinite (null in JSON), and a warning says why. Never the default.
* noise_sharing = "cohort-nonprivate": what Noble et al. (2022)'s public code does (it reseeds the global generator
  at every local step with a seed of the run, round and step, not of the user): every client of a round's cohort
  draws the SAME N(0, 1) vector at local step k, each scaling it by its own sensitivity. The server, which sees each
  message, can then cancel the noise (message_i - (Delta_i / Delta_j) message_j is noise free), and the aggregate's
  noise is not averaged down by the cohort; the run's events are NonPrivate (epsilon = inf), with a warning. The
  default, "independent", draws each client's noise from its own stream.

Control variates are post-processing of the noisy gradients (Noble et al. 2022, Claim 4.1), so every variant releases
the same mechanism per local step, ``step_noise_event``, towards an observer of one client's messages. Towards an
observer of the aggregate they differ: another client's noise share hides the owner's draw only if nothing computed
afterwards depends on it (``additive_steps``).

On the algorithm protocol (``dpfl.engine.protocol``): the server state is {x, c}, each client's state {c} (SCAFFOLD
only), the messages {dy} and, with control variates, {dc}; the server step reads only their sums, so it runs behind
secure aggregation too. A client draws its minibatch keys and its noise for the round's K steps from its own streams
at the round's start.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field

import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import OBSERVERS, Release, local_steps_additive
from dpfl.accounting.owners import declare_owners
from dpfl.algorithms.registry import AlgorithmSpec, Calibration, Setting, register
from dpfl.engine.boundary import Delivery
from dpfl.engine.client_table import ClientTable
from dpfl.noise import DiscreteGaussianMechanism, GaussianMechanism
from dpfl.engine.randomness import ClientStreams
from dpfl.engine.protocol import Algorithm, ClientContext, ClientData, ClientOutput, ServerContext, State
from dpfl.engine.sampling import RecordSampler
from dpfl.errors import ConfigError, check_noise_multiplier, check_range

CLIP_HEURISTICS = ("fixed", "median-nonprivate")
NOISE_SHARINGS = ("independent", "cohort-nonprivate")
#: sigma_g when neither algorithm.noise_multiplier nor privacy.epsilon is given: z = 1, DP-SGD's usual multiplier (Abadi
#: et al. 2016), as dp-fedavg-user and dp-ftrl use: a first run's value, not a paper's. Noble et al. (2022, Sec. 5)'s
#: sigma_g = 60 trains their synthetic data but diverges at round 1 on digits, breast_cancer, MNIST, FEMNIST and
#: CIFAR-10 files (benchmarks/default_sweep.py); the items that reproduce their paper pin it. The privacy accounting is
#: the same at any z: only the multiplier charged changes.
DEFAULT_NOISE = 1.0
#: eta0 when algorithm.lr is not given: Noble et al.'s eta0 = 1 diverges at z = 1 too on digits (its features are
#: pixels 0..16); eta0 = 0.1 (a local step eta0 / (s K) = 0.01 at the defaults) trains there
#: (benchmarks/default_sweep.py)
DEFAULT_LR = 0.1


@dataclass(frozen=True)
class LocalSGD(Algorithm):
    """The FedAvg/FedSGD/SCAFFOLD family (see the module docstring for the equations)."""

    local_steps: int
    lr: float
    sampler: RecordSampler
    mechanism: GaussianMechanism | DiscreteGaussianMechanism
    clip: float | None = None
    global_lr: float = 1.0
    weight_decay: float = 0.0
    control_variates: bool = False
    move_locally: bool = True
    warm_rounds: int = 0
    clip_heuristic: str = "fixed"
    noise_sharing: str = "independent"

    def __post_init__(self):
        if self.clip_heuristic not in CLIP_HEURISTICS:
            raise ConfigError("algorithm.clip_heuristic", self.clip_heuristic, f"one of {list(CLIP_HEURISTICS)}")
        if self.clip_heuristic == "median-nonprivate":
            warnings.warn("algorithm.clip_heuristic = 'median-nonprivate' clips at a data-dependent bound (the batch's "
                          "median gradient norm): the run is NOT differentially private and reports epsilon = inf",
                          stacklevel=2)
        if self.noise_sharing not in NOISE_SHARINGS:
            raise ConfigError("algorithm.noise_sharing", self.noise_sharing, f"one of {list(NOISE_SHARINGS)}")
        if self.noise_sharing == "cohort-nonprivate":
            warnings.warn("algorithm.noise_sharing = 'cohort-nonprivate' gives every client of a cohort the same noise "
                          "draws, which the server can cancel: the run is NOT differentially private and reports "
                          "epsilon = inf", stacklevel=2)
        check_range("algorithm.local_steps", self.local_steps, 1, integer=True)
        check_range("algorithm.lr", self.lr, 0.0, low_open=True)
        check_range("algorithm.global_lr", self.global_lr, 0.0, low_open=True)
        check_range("algorithm.weight_decay", self.weight_decay, 0.0)
        if self.clip is not None:
            check_range("algorithm.clip", self.clip, 0.0, low_open=True)
        if self.mechanism.is_private and self.clip is None:
            raise ConfigError("algorithm.clip", None, "a positive clip norm C when noise_multiplier > 0")

    @property
    def local_lr(self) -> float:
        """eta_l = eta0 / (s K) (Noble et al. Sec. 5)."""
        return self.lr / (self.sampler.rate * self.local_steps)

    @property
    def step_noise_event(self) -> dp_event.DpEvent:
        """The noise mechanism of one local step of one client, in units of its sensitivity."""
        if self.clip_heuristic == "median-nonprivate" or self.noise_sharing == "cohort-nonprivate":
            return dp_event.NonPrivateDpEvent()
        return self.mechanism.event

    @property
    def additive_steps(self) -> tuple[bool, ...]:
        """Which local steps' noise enters the round's aggregate additively with nothing computed after it, in this
        round or a later one (``dpfl.accounting.observers.local_steps_additive``): the last step of FedAvg, every step
        of FedSGD, none of SCAFFOLD (c_i carries the noisy steps into later rounds)."""
        return local_steps_additive(self.local_steps, self.move_locally, carries_noise=self.control_variates)

    @property
    def neighboring(self) -> str:
        """The record-level relation the release is accounted under (``RecordSampler.neighboring``)."""
        return self.sampler.neighboring

    # -- the protocol -------------------------------------------------------------------------------------------
    def init_state(self, x0: torch.Tensor, num_clients: int) -> State:
        clients = {"c": ClientTable.zeros(num_clients, x0.shape[0])} if self.control_variates else {}
        return State({"x": x0.clone(), "c": torch.zeros_like(x0)}, clients)

    def release(self, round_index: int, state: State, counts: torch.Tensor) -> Release:
        """K draws of the record-level step event (record sampling around the Gaussian, for the client with the
        largest sampling ratio), with ``additive_steps``; r = min/max client sensitivity. When clients differ (their
        sampling ratios or sensitivities), per owner too (``owners.declare_owners``): a record of client o is
        released by o's own K draws at o's own ratio, its additive draws credited with the others' shares in the
        units of the averaged messages. Client j's message carries noise z Delta_j (one multiplier z),
        Delta_j proportional to 1 / divisor_j, so the shares are (1 / divisor_j, 1 / divisor_j): only their ratios
        enter the credit, (Delta_o^2 + the k smallest Delta_j^2) / Delta_o^2 - 1 in units of the owner's variance
        (``Release.credited_variance``); the release above, the least credit at the largest ratio, bounds them all
        (and is what the paper's accountant charges)."""
        step = self.sampler.event(self.step_noise_event, counts)
        divisors = self.sampler.divisor(counts)  # sensitivity_j is proportional to 1 / divisor_j
        bound = Release((step,) * self.local_steps, self.additive_steps, float(divisors.min() / divisors.max()))
        return declare_owners(
            bound, lambda o: (self.sampler.event(self.step_noise_event, counts[o:o + 1]),) * self.local_steps,
            tuple((1 / float(d), 1 / float(d)) for d in divisors))

    def examples_per_client(self, counts: torch.Tensor) -> int:
        """The largest minibatch of a local step (what memory chunking must hold per client)."""
        return int(self.sampler.batch_sizes(counts).max())

    def client_round(self, round_index: int, server: dict, clients: dict, data: ClientData,
                     ctx: ClientContext) -> ClientOutput:
        """K local steps for a chunk of the cohort; messages {dy[, dc]}, client state {c} (SCAFFOLD). The server
        state may carry a leading row axis (one server state per row: ``dpfl.engine.protocol``)."""
        x = server["x"]
        n, P, K = data.counts.shape[0], x.shape[-1], self.local_steps
        keys = ctx.streams("records").uniform([(K, int(c)) for c in data.counts.tolist()])  # [n, K, max count]
        private = self.mechanism.is_private
        noise = self.standard_normal(ctx, n, (K, P)) if private else None  # [n, K, P]
        start = x.expand(n, P)
        y = start.clone()
        h_sum = torch.zeros(n, P)
        warm = round_index < self.warm_rounds
        move = self.move_locally and not warm
        correction = (server["c"] - clients["c"]) if self.control_variates else None
        events = []
        for k in range(K):
            h, event = self.noisy_gradient(ctx.grads, y if move else start, data, keys[:, k],
                                           None if noise is None else noise[:, k])
            events.append(event)
            h_sum += h
            if move:
                y -= self.local_lr * (h if correction is None else h + correction)
        h_mean = h_sum / K
        if warm:
            dy = torch.zeros_like(y)
        elif move:
            dy = y - start
        else:
            dy = -self.local_lr * K * h_mean
        if not self.control_variates:
            return ClientOutput({"dy": dy}, {}, events)
        return ClientOutput({"dy": dy, "dc": h_mean - clients["c"]}, {"c": h_mean}, events)

    def standard_normal(self, ctx: ClientContext, n: int, shape: tuple[int, ...]) -> torch.Tensor:
        """The noise draws of the chunk's n clients for a round, [n, *shape]: each client's own stream, or with
        noise_sharing = "cohort-nonprivate" one stream of the round that every client of the cohort reads (whatever
        the chunking), as Noble et al. (2022)'s code does."""
        if self.noise_sharing == "independent":
            return self.mechanism.draws(ctx.streams("noise"), shape)
        shared = ClientStreams(ctx.seed, ctx.round, [0], "shared_noise")
        return self.mechanism.draws(shared, shape).expand(n, *shape)

    def noisy_gradient(self, grads, point, data: ClientData, keys: torch.Tensor, standard_normal,
                       clip: torch.Tensor | None = None, noise_sensitivity: torch.Tensor | None = None):
        """H~ for every client of the chunk at ``point`` [clients, P]: one minibatch (the records of the smallest
        ``keys``), clip, mean, noise (``standard_normal`` scaled by the mechanism's event). ``clip`` (per client;
        default C) and ``noise_sensitivity`` (what the noise std is z times; default the mean's sensitivity) are for
        algorithms whose clients differ (``dpfl.algorithms.joint_relaxations``)."""
        indices, mask = self.sampler.sample(data.counts, keys)
        xb, yb = data.batch(indices)
        divisor = self.sampler.divisor(data.counts).to(point.dtype).unsqueeze(1)
        clip = self.clip if clip is None else clip
        if self.clip_heuristic == "median-nonprivate":  # data dependent: see the module docstring
            norms = grads.example_norms(point, xb, yb, mask).masked_fill(mask == 0, float("nan"))
            clip = torch.nanmedian(norms, dim=1).values
        mean = grads.clipped_sum(point, xb, yb, mask, clip) / divisor
        event = self.mechanism.event  # the event of the noise actually drawn (checked against the declaration)
        if self.mechanism.is_private:
            if noise_sensitivity is None:
                noise_sensitivity = self.sampler.mean_sensitivity(clip, data.counts)
            mean, event = self.mechanism(mean, noise_sensitivity, standard_normal)
        if self.weight_decay:
            mean = mean + self.weight_decay * point
        return mean, event

    def server_update(self, round_index: int, server: dict, delivered: Delivery, ctx: ServerContext) -> dict:
        """x += eta_g mean(dy); c += (1/M) sum(dc), from the sums alone (row-wise where the state and the sums carry a
        leading row axis)."""
        if delivered.count == 0:
            return server
        updated = {"x": server["x"] + self.global_lr * delivered.sum("dy") / delivered.count, "c": server["c"]}
        if self.control_variates:
            updated["c"] = server["c"] + delivered.sum("dc") / delivered.population
        return updated

    def divergence_hint(self, counts: torch.Tensor) -> str:
        """What to change when the model diverges, with the noise of the record sampler actually in use: the step
        sizes, and for the private names the knobs of the noise on a client's mean gradient (its std is z times the
        mean's sensitivity, proportional to C: a smaller algorithm.noise_multiplier, which a larger privacy.epsilon
        calibrates, or a smaller algorithm.clip lowers it; so does a larger batch)."""
        hint = f"lower algorithm.lr (now {self.lr:g}) or algorithm.global_lr (now {self.global_lr:g})"
        if not self.mechanism.is_private:
            return hint
        hint += (f", lower algorithm.noise_multiplier (now {self.mechanism.noise_multiplier:g}; or set a larger "
                 f"privacy.epsilon) or algorithm.clip (now {self.clip:g})")
        if self.sampler.scheme == "fixed":
            formula = "noise_multiplier * 2C / floor(s n_i), with fixed-size batches of floor(s n_i) records at s = "
        else:
            formula = "noise_multiplier * C / (q n_i), q n_i the expected batch size of Poisson record sampling at q = "
        hint += (f", or raise algorithm.sample_rate (the noise on a client's mean gradient has std {formula}"
                 f"{self.sampler.rate:g}")
        if self.clip_heuristic == "fixed":
            worst = self.mechanism.noise_multiplier * self.sampler.mean_sensitivity(self.clip, counts)
            hint += f"; up to {float(worst.max()):.3g} here"
        return hint + ")"

    def regulariser(self, x: torch.Tensor) -> float:
        """The L2 term of the train objective the runs report."""
        return 0.5 * self.weight_decay * float(x.double().square().sum())


NAMES = ("fedavg", "fedsgd", "scaffold", "scaffold-warm", "dp-fedavg", "dp-fedsgd", "dp-scaffold", "dp-scaffold-warm")


@dataclass(frozen=True)
class LocalSGDConfig:
    """The ``[algorithm]`` keys of the LocalSGD family (beyond name, rounds, client_rate, client_sampling)."""

    local_steps: int = field(default=50, metadata={"help": "K, noisy local steps per round", "min": 1})
    sample_rate: float = field(default=0.2, metadata={"help": "s, each step's minibatch is floor(s n_i) records "
                                                               "(fixed) or each record with probability s (poisson)"})
    record_sampling: str = field(default="fixed", metadata={"choices": ("fixed", "poisson"),
                                                             "help": "fixed size without replacement (replace-one "
                                                                     "DP) or Poisson (zero-out DP: a record replaced "
                                                                     "by a null one)"})
    lr: float = field(default=DEFAULT_LR, metadata={"help": "eta0; the local step is eta0 / (s K)"})
    global_lr: float = field(default=1.0, metadata={"help": "eta_g, the server's step on the mean update"})
    weight_decay: float = field(default=5e-3, metadata={"help": "L2 regularisation lambda"})
    clip: float = field(default=1.0, metadata={"help": "C, the per-example l2 clip norm", "private": True})
    noise_multiplier: float | None = field(default=None, metadata={
        "help": f"sigma_g: noise std is sigma_g times the sensitivity (default: calibrated to privacy.epsilon, else "
                f"{DEFAULT_NOISE:g})", "private": True})
    clip_heuristic: str = field(default="fixed", metadata={"choices": CLIP_HEURISTICS, "private": True,
                                                            "help": "'median-nonprivate': Noble et al. 2022's "
                                                                    "data-dependent clip (NOT private: epsilon = inf)"})
    noise_sharing: str = field(default="independent", metadata={
        "choices": NOISE_SHARINGS, "private": True,
        "help": "'cohort-nonprivate': every client of a round draws the same noise, as Noble et al. 2022's code "
                "(NOT private: epsilon = inf)"})


def build_local_sgd(name: str, config: LocalSGDConfig, client_rate: float,
                    gaussian=GaussianMechanism) -> LocalSGD:
    """Maps an algorithm name to its switches (the non-private names take no clip or noise; a private name's
    algorithm.noise_multiplier left unset is ``DEFAULT_NOISE``); ``gaussian``: the mechanism at a noise multiplier
    (``registry.Setting.gaussian`` under run.secure_noise)."""
    if name not in NAMES:
        raise ConfigError("algorithm.name", name, f"one of {list(NAMES)}")
    private = name.startswith("dp-")
    base = name.removeprefix("dp-")
    noise_multiplier = DEFAULT_NOISE if config.noise_multiplier is None else config.noise_multiplier
    if private:
        check_noise_multiplier("algorithm.noise_multiplier", noise_multiplier)
    return LocalSGD(
        local_steps=config.local_steps,
        lr=config.lr,
        sampler=RecordSampler(config.sample_rate, config.record_sampling),
        mechanism=gaussian(noise_multiplier) if private else GaussianMechanism(0.0),
        clip=config.clip if private else None,
        global_lr=config.global_lr,
        weight_decay=config.weight_decay,
        control_variates=base.startswith("scaffold"),
        move_locally=base != "fedsgd",
        warm_rounds=round(4 / client_rate) if base == "scaffold-warm" else 0,
        clip_heuristic=config.clip_heuristic if private else "fixed",
        noise_sharing=config.noise_sharing if private else "independent",
    )


def _build(name: str, config: LocalSGDConfig, setting: Setting) -> LocalSGD:
    """The algorithm of a config: sigma_g from algorithm.noise_multiplier, or solved for privacy.epsilon (refused for
    a name that adds no noise, and for a data-dependent clip, whose epsilon no noise makes finite)."""
    if setting.epsilon is not None and not name.startswith("dp-"):
        raise ConfigError("privacy.epsilon", setting.epsilon,
                          f"None for {name!r}: it adds no noise, so no epsilon holds for it (its private version: "
                          f"'dp-{name}')")
    if setting.epsilon is not None and config.noise_sharing != "independent":
        raise ConfigError("privacy.epsilon", setting.epsilon,
                          f"None with algorithm.noise_sharing = {config.noise_sharing!r}: the server can cancel noise "
                          "that the clients share, so epsilon is infinite whatever the noise")
    if setting.epsilon is not None and config.clip_heuristic != "fixed":
        raise ConfigError("privacy.epsilon", setting.epsilon,
                          f"None with algorithm.clip_heuristic = {config.clip_heuristic!r}: it clips at a "
                          "data-dependent bound, so epsilon is infinite whatever the noise")
    if name.startswith("dp-"):
        config = dataclasses.replace(config, noise_multiplier=setting.noise_multiplier(config.noise_multiplier,
                                                                                       DEFAULT_NOISE))
    return build_local_sgd(name, config, setting.client_rate, setting.gaussian)


def every_observer(name: str, config: LocalSGDConfig, setting: Setting) -> tuple[str, ...]:
    """Whom privacy.epsilon bounds: every observer of the run's boundary, so the worst of them. Each client adds its
    own noise to every local step, so even the server, which sees each client's message, sees only noised steps:
    no observer's epsilon is infinite (Noble et al. 2022, Claim 4.1: the messages are post-processing of the noisy
    gradients)."""
    return OBSERVERS


def initial_noise(name: str, config: LocalSGDConfig, setting: Setting) -> float:
    """Where the search for privacy.epsilon starts: sigma_g ~ s sqrt(2 ln(1 / delta) l K T) / epsilon (at least 0.5),
    the moments accountant's order of magnitude for l K T steps of the Gaussian at sampling rate s (Abadi et al.
    2016, Thm. 1), l K T the noisy steps a client expects to take."""
    steps = setting.client_rate * config.local_steps * setting.rounds
    return max(0.5, config.sample_rate * math.sqrt(2 * math.log(1 / setting.delta) * steps) / setting.epsilon)


register(AlgorithmSpec(
    names=NAMES, config=LocalSGDConfig, build=_build, private=lambda name: name.startswith("dp-"),
    help="FedAvg / FedSGD / SCAFFOLD(-warm) and their record-level DP versions (Noble et al. 2022)",
    secure_noise=True, calibration=Calibration(every_observer, initial_noise),
))
