"""FedSGD-DPC: federated SGD whose clients add their own noise (Zhou, Liu, Fu, Wu, Li, Yu 2021, Algorithm 1).

In every round t (a *query*) the server picks b of the N clients (uniformly at random, or round robin) and each picked
client i *replies* with one noisy gradient step from the broadcast model theta_t (Zhou et al. Sec. III-B):

    g_i      = (1 / |B_i|) sum_{j in B_i} clip_xi(grad f(theta_t; d_j)) + w_i,     w_i ~ M_i        (Alg. 1, l. 7-9)
    theta_i  = theta_t - eta_t (g_i + mu_reg theta_t)
    theta_t+1 = sum_{i in P_t} a_i theta_i                                                         (Alg. 1, l. 12)

with per-example clipping in l1 (Laplace) or l2 (Gaussian) norm at xi, the regulariser's gradient added after the noise
(post-processing), and weights a_i:

* ``aggregation = "normalized"`` (default): a_i = d_i / sum_{j in P_t} d_j, a convex combination in every round;
* ``aggregation = "paper"``: a_i = (N / b) (d_i / d), the paper's unbiased weights (Eq. 3). Their sum is 1 only in
  expectation when the d_i differ, so theta_t+1 is rescaled at random from round to round; with equal d_i both agree.

Step sizes: ``lr_schedule = "constant"`` (eta_t = lr), or ``"inverse"``, the rate of Zhou et al.'s Theorem 3,
eta_t = 2 / (mu (t + gamma)) with gamma = 2 lambda / mu, for which the user states mu and lambda (``dpfl plan
queries-replies`` estimates them, non-privately).

**Privacy.** Each reply releases client i's noisy mean gradient to whoever sees its message (the server; the Laplace
shares of different clients do not sum to a Laplace, so every observer is charged the owner's own message; the
Gaussian step enters the aggregate additively, so a third party is credited with the cohort's other shares, in the
units of the sum the server divides: d_i w_i has std z_i d_i Delta_i against the owner's sensitivity d_o Delta_o,
``FedSGDDPC.weighted_shares``). A
client's noise is calibrated to its budget eps_i over m, the number of replies it makes:

* the cohort schedule is drawn from the run's public seed (run.seed, not the secret noise key: the spec's
  ``public_cohorts``) before the first round, independently of the data, so m_i, the
  replies of client i, are known in advance; every client is calibrated to m = max_i m_i replies (a whole number,
  never the paper's expected bT/N, which a client picked more often than average would exceed), so each spends at
  most eps_i. The ledger charges a round when some client makes its r-th reply for a new r (``Release.cohort``), so
  epsilon after round t is that of the client that has replied most so far: exact for the worst client, at every
  round, towards an observer who knows the schedule, and an upper bound towards one who does not.
* Laplace (pure DP, l1 sensitivity 2 xi / |B_i| of the mean over a batch of |B_i| = floor(q d_i) records under
  replace-one, Zhou et al. Lemma 1 with q = 1): per reply Lap(0, m Delta_i / eps_i) per coordinate, eps_i / m each,
  basic composition (the ledger's ``pure`` accountant), with no credit for record sampling.
* Gaussian: minibatches of floor(q d_i) records without replacement (l2 sensitivity 2 xi / floor(q d_i),
  replace-one), and the smallest noise multiplier z_i whose m-fold composition of the sampled Gaussian at the largest
  sampling ratio of any client has epsilon <= eps_i at the run's delta (Zhou et al. Sec. IV-B use the moments
  accountant with unstated constants).

Both are solved against the run's own ledger towards the server (``calibration``: the runner's one calibration
route, ``dpfl.experiments.noise_level``), Laplace's to the same precision as the Gaussian's (1e-4 above m / eps_i).

Per-client budgets (``client_epsilons``) give per-client noise, each solved as if every client had that budget
(``Calibration.budgets``).

**The worst owner** (Gaussian). Clients differ in their sampling ratio r_o = floor(q d_o) / d_o and, in the units
of the sum the server divides, in their sensitivity w_o = d_o Delta_o and noise std s_o = z_o w_o. A record of
client o is released, towards an observer of the sum over the clients S (S = {o} for the server that sees each
message), as the batch of floor(q d_o) of d_o records sampled without replacement around the Gaussian of
multiplier sqrt(sum_{j in S} s_j^2) / w_o: its own ratio with its own sensitivity against the others' noise as it
is in the sum (Zhou et al.'s Eq. 3 weights d_i scale both of client i's terms). Each reply declares that event per
owner (``Release.owners``; the others' noise credited as ``Release.credited_variance`` does for owner o: the
weakest shares the cohort can hold) and the ledger charges the worst owner, max_o of the composition of owner o's
replies (``dpfl.accounting.owners``), an upper bound for every client, exact for the worst one when each part is.
The old single event, the smallest multiplier at the largest ratio of ANY client, combines two owners (on 7
records among nine of 4, q = 0.26: the 7-record owner's noise, the 4-record owners' ratio 1/4 instead of 1/7) and
stays as the bound the ledger falls back to beyond ``owners.MAX_OWNERS`` distinct clients.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from dpfl.accounting.observers import SERVER, Cohort, Release
from dpfl.accounting.owners import declare_owners
from dpfl.algorithms.registry import AlgorithmSpec, Calibration, Setting, register
from dpfl.engine.boundary import Delivery
from dpfl.noise import GaussianMechanism, LaplaceMechanism
from dpfl.engine.protocol import Algorithm, ClientContext, ClientData, ClientOutput, ServerContext, State
from dpfl.engine.sampling import ClientSampler, RecordSampler
from dpfl.errors import ConfigError, check_range

MECHANISMS = ("laplace", "gaussian")
SELECTIONS = {"random": "fixed", "round-robin": "round_robin"}
SCHEDULES = ("constant", "inverse")
AGGREGATIONS = ("normalized", "paper")


@dataclass(frozen=True)
class FedSGDDPCConfig:
    """The ``[algorithm]`` keys of FedSGD-DPC (beyond name and rounds)."""

    mechanism: str = field(default="laplace", metadata={"choices": MECHANISMS,
                                                        "help": "the clients' noise: Laplace (l1 clip, pure DP) or "
                                                                "Gaussian (l2 clip)"})
    clients_per_round: int | None = field(default=None, metadata={"help": "b, the clients queried per round "
                                                                          "(default: all N)"})
    selection: str = field(default="random", metadata={"choices": tuple(SELECTIONS),
                                                       "help": "b clients uniformly at random per round, or round "
                                                               "robin"})
    clip: float = field(default=1.0, metadata={"help": "xi, the per-example gradient bound (l1 for Laplace, l2 "
                                                       "for Gaussian)"})
    sample_rate: float = field(default=1.0, metadata={"help": "q, each reply's minibatch is floor(q d_i) records "
                                                              "(Laplace is credited no amplification for q < 1)"})
    lr: float = field(default=0.05, metadata={"help": "eta, the constant step size"})
    lr_schedule: str = field(default="constant", metadata={"choices": SCHEDULES,
                                                           "help": "'inverse': eta_t = 2 / (mu (t + 2 lambda / mu)), "
                                                                   "Zhou et al. Thm 3"})
    mu: float | None = field(default=None, metadata={"help": "mu, strong convexity (lr_schedule 'inverse')"})
    smoothness: float | None = field(default=None, metadata={"help": "lambda, smoothness (lr_schedule 'inverse')"})
    weight_decay: float = field(default=0.0, metadata={"help": "L2 regularisation, added after the noise"})
    aggregation: str = field(default="normalized", metadata={"choices": AGGREGATIONS,
                                                             "help": "'normalized': weights d_i / sum of the "
                                                                     "cohort's d_j; 'paper': (N / b) d_i / d"})
    client_epsilons: list = field(default_factory=list, metadata={"help": "eps_i per client (default: "
                                                                          "privacy.epsilon for every client)"})


@dataclass(frozen=True)
class ReplySchedule:
    """Who replies when: the cohorts of rounds 0..T-1 drawn from the run's seed, before any data is read."""

    replies: tuple[int, ...]  # m_i, each client's number of replies over the T rounds
    charged: tuple[bool, ...]  # round t makes some client's r-th reply for a new r (the ledger charges it)

    @classmethod
    def draw(cls, clients: ClientSampler, rounds: int, seed: int) -> "ReplySchedule":
        counts = torch.zeros(clients.num_clients, dtype=torch.long)
        charged, most = [], 0
        for t in range(rounds):
            counts[clients.sample(t, seed)] += 1
            charged.append(int(counts.max()) > most)
            most = int(counts.max())
        return cls(tuple(int(c) for c in counts), tuple(charged))

    @property
    def most(self) -> int:
        """m = max_i m_i, the replies every client's noise is calibrated to."""
        return max(self.replies)


@dataclass(frozen=True)
class FedSGDDPC(Algorithm):
    """FedSGD-DPC (see the module docstring)."""

    mechanism: str
    clip: float
    sampler: RecordSampler
    noise: torch.Tensor  # per client: Laplace scale multiplier m / eps_i, or Gaussian noise multiplier z_i
    schedule: ReplySchedule
    cohort_size: int
    total_records: int
    lr: float = 0.05
    lr_schedule: str = "constant"
    mu: float | None = None
    smoothness: float | None = None
    weight_decay: float = 0.0
    aggregation: str = "normalized"
    accountant: str = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "accountant", "pure" if self.mechanism == "laplace" else "tightest")

    @property
    def neighboring(self) -> str:
        return "replace_one"

    @property
    def norm(self) -> str:
        return "l1" if self.mechanism == "laplace" else "l2"

    @property
    def least_noise(self) -> float:
        return float(self.noise.min())

    def step_size(self, t: int) -> float:
        """eta_t: constant, or 2 / (mu (t + gamma)) with gamma = 2 lambda / mu (Zhou et al. Thm 3)."""
        if self.lr_schedule == "constant":
            return self.lr
        return 2.0 / (self.mu * (t + 2.0 * self.smoothness / self.mu))

    def _mechanism(self):
        if self.mechanism == "laplace":
            return LaplaceMechanism(self.least_noise)
        return GaussianMechanism(self.least_noise)

    def sensitivity(self, counts: torch.Tensor) -> torch.Tensor:
        """Delta_i of client i's mean of clipped gradients: 2 xi / |B_i| under replace-one, |B_i| = floor(q d_i)
        (Zhou et al. Lemma 1 for l1 with q = 1; the same argument in l2)."""
        return self.sampler.mean_sensitivity(self.clip, counts)

    # -- the protocol -------------------------------------------------------------------------------------------
    def init_state(self, x0: torch.Tensor, num_clients: int) -> State:
        return State({"x": x0.clone()})

    def release(self, round_index: int, state: State, counts: torch.Tensor) -> Release:
        """One reply, charged in the rounds where the schedule makes a new most-replies count. Laplace: at the least
        private client's noise (in units of its sensitivity); Laplace shares do not sum to a Laplace, so every
        observer is charged the owner's own reply. Gaussian: per owner (``Release.owners``, module docstring), its own
        multiplier z_o at its own ratio floor(q d_o) / d_o, additive, credited in the units of the released sum
        (``weighted_shares``); the least multiplier at the largest ratio of any client as their bound, which is all
        a federation of more than ``owners.PER_OWNER_CLIENTS`` clients is charged (sound, not per owner)."""
        event = self._mechanism().event
        cohort = Cohort.scheduled(len(counts), self.cohort_size, self.cohort_size,
                                  self.schedule.charged[round_index] if round_index < len(self.schedule.charged)
                                  else True)
        if self.mechanism == "laplace":  # pure DP by basic composition, no credit for record sampling
            return Release((event,), (True,), cohort=cohort)
        shares, noise = self.weighted_shares(counts), self.noise.tolist()
        bound = Release((self.sampler.event(event, counts),), (True,), cohort=cohort, shares=shares)
        return declare_owners(
            bound, lambda o: (self.sampler.event(GaussianMechanism(noise[o]).event, counts[o:o + 1]),), shares)

    def weighted_shares(self, counts: torch.Tensor) -> tuple[tuple[float, float], ...]:
        """Every client's (noise std, sensitivity) in the units of the sum the server divides (``Release.shares``):
        the reply d_i (g_i + w_i) has sensitivity d_i Delta_i and noise std z_i d_i Delta_i. Both aggregations divide
        the sum by a constant (sum_j d_j, or d b / N), which changes neither ratio. Per unweighted message (z_i
        Delta_i against Delta_o) the credit would be too large whenever d_o Delta_o exceeds the others' d_j Delta_j:
        an owner of 7 records among nine of 4, one record per batch, has 7/4 of their sensitivity in the sum."""
        sensitivity = counts.to(self.noise.dtype) * self.sensitivity(counts).to(self.noise.dtype)
        return tuple(zip((self.noise * sensitivity).tolist(), sensitivity.tolist()))

    def examples_per_client(self, counts: torch.Tensor) -> int:
        return int(self.sampler.batch_sizes(counts).max())

    def client_round(self, round_index: int, server: dict, clients: dict, data: ClientData,
                     ctx: ClientContext) -> ClientOutput:
        """Each client's reply, weighted by d_i: messages {dx: -d_i eta_t (g_i + reg), weight: d_i}. The server state
        may carry a leading row axis (one server state per row: ``dpfl.engine.protocol``)."""
        x = server["x"]
        n, P = data.counts.shape[0], x.shape[-1]
        keys = ctx.streams("records").uniform([(int(c),) for c in data.counts.tolist()])
        indices, mask = self.sampler.sample(data.counts, keys)
        xb, yb = data.batch(indices)
        point = x.expand(n, P)
        mean = ctx.grads.clipped_sum(point, xb, yb, mask, self.clip, norm=self.norm) / \
            self.sampler.divisor(data.counts).to(x.dtype).unsqueeze(1)
        # client i's scale is (its own noise / the least) x its sensitivity, at the declared (least) event
        scale = self.sensitivity(data.counts) * (self.noise.to(ctx.ids.device)[ctx.ids] / self.least_noise)
        if self.mechanism == "laplace":
            draws = ctx.streams("noise").exponential((2, P))  # [n, 2, P]: Lap(0, 1) = E1 - E2
        else:
            draws = ctx.streams("noise").normal((P,))
        noisy, event = self._mechanism()(mean, scale, draws)
        if self.weight_decay:
            noisy = noisy + self.weight_decay * point
        weight = data.counts.to(x.dtype).unsqueeze(1)
        return ClientOutput({"dx": -self.step_size(round_index) * weight * noisy, "weight": weight}, {}, [event])

    def server_update(self, round_index: int, server: dict, delivered: Delivery, ctx: ServerContext) -> dict:
        """x + sum_i a_i (theta_i - x) from the sums alone (Alg. 1, l. 12); row-wise where the state and the sums
        carry a leading row axis."""
        if delivered.count == 0:
            return server
        if self.aggregation == "normalized":
            step = delivered.sum("dx") / delivered.sum("weight")
        else:
            step = (delivered.population / self.cohort_size) * delivered.sum("dx") / self.total_records
        return {"x": server["x"] + step}

    def regulariser(self, x: torch.Tensor) -> float:
        return 0.5 * self.weight_decay * float(x.double().square().sum())

    def divergence_hint(self, counts: torch.Tensor) -> str:
        return ("lower algorithm.lr (or raise algorithm.mu under lr_schedule 'inverse'), or raise privacy.epsilon or "
                "algorithm.clients_per_round (fewer replies per client need less noise each)")


def cohort_of(config: FedSGDDPCConfig, num_clients: int) -> tuple[float, str]:
    """(client rate b / N, sampling scheme) of algorithm.clients_per_round and algorithm.selection."""
    b = num_clients if config.clients_per_round is None else config.clients_per_round
    check_range("algorithm.clients_per_round", b, 1, num_clients, integer=True)
    if config.selection not in SELECTIONS:
        raise ConfigError("algorithm.selection", config.selection, f"one of {list(SELECTIONS)}")
    return b / num_clients, SELECTIONS[config.selection]


def client_budgets(config: FedSGDDPCConfig, setting: Setting) -> list[float]:
    """eps_i per client: algorithm.client_epsilons, or privacy.epsilon for every client."""
    if config.client_epsilons:
        if setting.epsilon is not None:
            raise ConfigError("privacy.epsilon", setting.epsilon,
                              "None when algorithm.client_epsilons gives every client its own budget")
        if len(config.client_epsilons) != setting.num_clients:
            raise ConfigError("algorithm.client_epsilons", config.client_epsilons,
                              f"a list of {setting.num_clients} positive numbers, one per client")
        return [float(check_range(f"algorithm.client_epsilons[{i}]", e, 0.0, low_open=True))
                for i, e in enumerate(config.client_epsilons)]
    if setting.epsilon is None:
        raise ConfigError("privacy.epsilon", None, "a positive number: FedSGD-DPC calibrates each client's noise to "
                                                   "this budget (or give algorithm.client_epsilons)")
    return [float(check_range("privacy.epsilon", setting.epsilon, 0.0, low_open=True))] * setting.num_clients


def reply_schedule(config: FedSGDDPCConfig, setting: Setting) -> tuple[ClientSampler, ReplySchedule]:
    """The cohort sampler and the reply schedule, drawn from the run's public seed."""
    rate, scheme = cohort_of(config, setting.num_clients)
    clients = ClientSampler(setting.num_clients, rate, scheme, public_seed=setting.seed)
    return clients, ReplySchedule.draw(clients, check_range("algorithm.rounds", setting.rounds, 1, integer=True),
                                       setting.seed)


def build_fedsgd_dpc(name: str, config: FedSGDDPCConfig, setting: Setting) -> FedSGDDPC:
    if config.mechanism not in MECHANISMS:
        raise ConfigError("algorithm.mechanism", config.mechanism, f"one of {list(MECHANISMS)}")
    if setting.analysis != "sound":
        raise ConfigError("privacy.analysis", setting.analysis,
                          "'sound' for fedsgd-dpc (the paper's accounting counts bT/N expected replies, which a "
                          "client picked more often than average exceeds)")
    check_range("algorithm.clip", config.clip, 0.0, low_open=True)
    check_range("algorithm.lr", config.lr, 0.0, low_open=True)
    check_range("algorithm.weight_decay", config.weight_decay, 0.0)
    for key in ("mu", "smoothness"):
        value = getattr(config, key)
        if value is None and config.lr_schedule == "inverse":
            raise ConfigError(f"algorithm.{key}", None, "a positive number with lr_schedule = 'inverse' "
                                                        "(`dpfl plan queries-replies` estimates it)")
        if value is not None:
            check_range(f"algorithm.{key}", value, 0.0, low_open=True)
    clients, schedule = reply_schedule(config, setting)
    budgets = client_budgets(config, setting)
    levels = [setting.level_for(eps) for eps in budgets] if config.client_epsilons else \
        [setting.calibrated_noise()] * setting.num_clients
    counts = torch.tensor(setting.train_counts, dtype=torch.long)
    return FedSGDDPC(
        mechanism=config.mechanism, clip=config.clip, sampler=RecordSampler(config.sample_rate, "fixed"),
        noise=torch.tensor(levels, dtype=torch.float64), schedule=schedule, cohort_size=clients.cohort_size,
        total_records=int(counts.sum()), lr=config.lr, lr_schedule=config.lr_schedule, mu=config.mu,
        smoothness=config.smoothness, weight_decay=config.weight_decay, aggregation=config.aggregation,
    )


def calibration() -> Calibration:
    """How a client's budget sets its noise (``registry.Calibration``): the smallest multiplier (Laplace's scale over
    Delta, or Gaussian's z) whose m replies spend at most eps towards the server, which sees each reply (the
    guarantee is stated against it whatever the run's boundary), by the run's own ledger; per client budget when
    algorithm.client_epsilons gives them (``budgets``). The search starts at Laplace's m / eps (exact: basic
    composition of m replies of eps / m) or the Gaussian's sqrt(m) / eps."""

    def initial(name: str, config: FedSGDDPCConfig, setting: Setting) -> float:
        replies = reply_schedule(config, setting)[1].most
        eps = setting.epsilon
        return replies / eps if config.mechanism == "laplace" else max(1.0, math.sqrt(replies) / eps)

    def budgets(name: str, config: FedSGDDPCConfig, setting: Setting) -> dict:
        if not config.client_epsilons:
            return {}
        uniform = dataclasses.replace(config, client_epsilons=[])
        return {eps: uniform for eps in client_budgets(config, setting)}

    return Calibration(lambda name, config, setting: (SERVER,), initial, lambda name, config, setting: "plain",
                       budgets=budgets)


register(AlgorithmSpec(
    names=("fedsgd-dpc",), config=FedSGDDPCConfig, build=build_fedsgd_dpc, private=lambda name: True,
    help="FedSGD with Laplace or Gaussian noise added by each client, calibrated to privacy.epsilon per client "
         "(Zhou et al. 2021)",
    release_keys=("algorithm.rounds",), cohort=cohort_of, noise_key=None, public_cohorts=True,
    calibration=calibration(),
))
