"""DP-FTRL: follow-the-regularised-leader on the tree aggregation of the clients' clipped updates, private without
sampling or shuffling (Kairouz, McMahan, Song, Thakkar, Thakurta, Xu, ICML 2021, "Practical and Private (Deep)
Learning without Sampling or Shuffling"), in its federated form with a tree restarted every epoch.

**The algorithm.** The clients take part in epochs of E = ceil(M / n) rounds, each client in exactly one round of
every epoch (``algorithm.client_sampling`` = "disjoint": a fresh secret partition per epoch, or "round_robin" with n
dividing M). A client of round t runs K local SGD steps from the broadcast model x_{t-1} (minibatches of
floor(s n_i) of its records, step ``lr``) and sends its update clipped to l2 norm C,

    u_i = clip_C(x_{t-1} - y_i),     clip_C(v) = v min(1, C / ||v||).

The server keeps the prefix sums of the cohorts' sums g_r = sum_{i in C_r} u_i through the tree aggregation
mechanism over the rounds of the current epoch (a binary tree whose leaves are the rounds tau = 1..E of the epoch;
every node adds N(0, (z C)^2 I) to the sum of its leaves) and releases

    x_t = x_a - (eta / n) S^_tau,     S^_tau = sum_{r <= tau} g_r + sum of the noise of the nodes of the dyadic
                                                decomposition of [1, tau] (one node per bit of tau)

with x_a the model at the epoch's start (FTRL with the quadratic regulariser ||x - x_a||^2 / (2 eta), the paper's
Algorithm 1 without momentum; the tree restarts each epoch: the paper's "restart" variant) and n = floor(l M) the
public cohort size. The clients' side and the FTRL step are those of every prefix-sum factorization
(``dpfl.algorithms.noisy_prefix_sums``, shared with BandMF); the tree is the factor. Only one node of the
decomposition of [1, tau] is new in round tau: the node of level v(tau) (the trailing zero bits of tau) that ends at
tau; the decomposition of tau - 1 had, instead, the nodes of levels < v(tau) below it. So the server draws ONE
node per round, nu_tau ~ N(0, (z C)^2 I), and steps

    x_t = x_{t-1} - (eta / n) (g_tau + nu_tau - sum_{l < v(tau)} nu^(l)),

keeping in its state only the released model x and the noise nu^(l) of the decomposition's node at each level l (the
server's own draws, which do not depend on the data): never a raw partial sum of the clients' updates
(``dpfl.accounting.observers``, "The server's own noise"). No other node of the tree is ever read, so none is drawn.

**Sensitivity** (Kairouz et al. 2021, Sec. 3, the tree aggregation mechanism). Neighbouring data sets differ in one
client's data, replaced by the null client's, whose update is 0 (user-level zero-out: dp_accounting's REPLACE_SPECIAL);
a client's update has norm <= C whatever its data, so the owner's change to g_tau in the one round tau of the epoch it
takes part in is at most C, and nothing else depends on its data (every other client's update is a function of the
released x_{t-1} and its own data). The E released prefix sums of an epoch are an invertible linear map of the E
noisy nodes the server draws (the node ending at tau is S^_tau - S^_{tau - 2^v(tau)}), and a round's leaf lies in at
most one node of each level: at most D = ceil(log2(E + 1)) = floor(log2 E) + 1 nodes. Releasing the nodes one by one,
each is a Gaussian mechanism of std z C whose input moves by at most C (if it holds tau) given every earlier output,
so the epoch is the adaptive composition of Gaussian mechanisms with squared sensitivities summing to D C^2: mu-GDP
with mu = sqrt(D) / z (Dong, Roth, Su 2019; adaptive composition of GDP adds mu^2), RDP a D / (2 z^2) at every order
a, which is dp_accounting's ``SingleEpochTreeAggregationDpEvent(z, E)`` (Kairouz et al. 2021, App. D: restarted trees
in which no client occurs twice). The epochs compose: epoch k + 1's tree reads the data of epoch k only through the
released x_a. Where the paper counts ceil(log2 E) + 1 nodes per leaf (the whole tree), D counts the nodes actually
drawn; both agree when E is a power of 2.

**How the ledger charges it, round by round.** Each round declares the server's one draw as the event of the tree it
is a node of, ``SingleEpochTreeAggregationDpEvent(z, E)``, and the owner as taking part in the epoch's FIRST round
only (``Release.cohort``: ``Cohort.scheduled``, p = 1 there and 0 in the epoch's other rounds, which the ledger
composes as no-ops). So the whole epoch's tree is charged once, before the epoch's first noise is drawn (a budget
stops the run before an epoch it cannot pay for, never inside one), and the simulator still checks every round's
draw against its declaration (``engine.cohort_round.check_drawn``: the node's multiplier z and its tree E).

**A partial last epoch.** Where the run's T rounds end inside an epoch that starts at round s, only its T' = T - s
first rounds run: the server draws the T' nodes that end at tau = 1..T', whose releases are an invertible linear map
of them, and a leaf tau <= T' lies in at most one of those nodes per level up to floor(log2 T'), so in at most
D' = tree_depth(T') of them: the argument above with E replaced by T', i.e. the tree of T' leaves,
``SingleEpochTreeAggregationDpEvent(z, T')`` (mu = sqrt(D') / z, where the whole tree's D can be larger: T' = 2 of
E = 4 gives D' = 2 against D = 3). It holds only if no node past T' is ever drawn in that epoch (the node of [1, 4]
holds leaf 1 too), so the horizon T is part of the run's release (``algorithm.rounds`` is a release key: a resume
cannot extend the run into the charged tree) and a round past it in that epoch is refused (``release``).
The observers of the server's output (third party, another silo) are charged the tree; the server itself sees the
clients' unnoised updates (plain) or their unnoised sum (secure aggregation): their draws are declared not private,
and its epsilon is infinite. This family's default boundary is "trusted" (the paper's trusted server: no server
observer). The PLD accountant reads the tree event as the Gaussian mechanism it is, GaussianDpEvent(z / sqrt(D))
(``dpfl.accounting.pld``), so the default accountant is tight; RDP gives dp_accounting's curve.

**The participation assumption.** The accounting needs every client in at most one round of each tree: fixed-size
and Poisson cohorts can put a client in two rounds of an epoch, and round robin with n not dividing M wraps a client
into a second round of one epoch; both are refused with the key to change. More than one participation per tree (the
paper's App. D count of nodes shared by k participations with a minimum separation) and the tree completion trick
are not implemented.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import OTHER_SILO, THIRD_PARTY, Cohort, Release
from dpfl.accounting.pld import tree_depth
from dpfl.algorithms.noisy_prefix_sums import PrefixSumFtrl, PrefixSumFtrlConfig, check_section, shared_fields
from dpfl.algorithms.registry import AlgorithmSpec, Calibration, Setting, register
from dpfl.engine.protocol import State
from dpfl.engine.sampling import ClientSampler
from dpfl.errors import ConfigError, check_range

NAME = "dp-ftrl"
#: the client samplers under which every client takes part in at most one round of each epoch's tree
SAMPLINGS = ("disjoint", "round_robin")
#: z when neither algorithm.noise_multiplier nor privacy.epsilon is given
DEFAULT_NOISE = 1.0


def node_level(position: int) -> int:
    """v(tau), the level of the one node the tree draws in round tau = ``position`` (1-based in the epoch): the
    trailing zero bits of tau (the node of 2^v(tau) leaves that ends at tau)."""
    check_range("position", position, 1, integer=True)
    return (position & -position).bit_length() - 1


@dataclass(frozen=True)
class DpFtrl(PrefixSumFtrl):
    """DP-FTRL with a tree restarted every epoch (see the module docstring): a prefix-sum FTRL
    (``dpfl.algorithms.noisy_prefix_sums``) whose factor is the tree."""

    epoch: int  # E, the rounds of one tree
    horizon: int | None = None  # T, the run's rounds, which may cut the last tree short; None: every tree whole

    assumptions = {"participation": "every client takes part in at most one round of each epoch's tree (disjoint "
                                     "batches, or round robin with the cohort size dividing the clients)"}

    @property
    def depth(self) -> int:
        """D, the levels of the tree of one epoch."""
        return tree_depth(self.epoch)

    def leaves(self, round_index: int) -> int:
        """The rounds the tree of round ``round_index``'s epoch runs: E, or T - s for the epoch starting at s that the
        horizon T cuts (module docstring). ConfigError naming algorithm.rounds for a round at or past T in that epoch,
        whose tree was charged with fewer leaves than it would then draw."""
        start = round_index - round_index % self.epoch
        if self.horizon is None or start + self.epoch <= self.horizon or start >= self.horizon:
            return self.epoch
        if round_index >= self.horizon:
            raise ConfigError("algorithm.rounds", self.horizon,
                              f"more than round {round_index + 1}'s: the epoch of rounds {start + 1}.."
                              f"{start + self.epoch} is cut after {self.horizon - start} rounds and its tree charged "
                              "for those alone (run, or audit, at most algorithm.rounds rounds)")
        return self.horizon - start

    def draw_event(self, round_index: int) -> dp_event.DpEvent:
        """Each node is declared as the event of its tree, the release of round ``round_index``'s epoch:
        dp_accounting's restarted-tree event of its ``leaves`` (module docstring)."""
        return dp_event.SingleEpochTreeAggregationDpEvent(self.noise_multiplier, self.leaves(round_index))

    @property
    def draw_sensitivity(self) -> float:
        """A node's sum moves by at most C."""
        return self.clip

    def noise_state(self, x0: torch.Tensor) -> dict[str, torch.Tensor]:
        """``nodes`` [D, P]: the noise of the current decomposition's node at each level (0 where none)."""
        return {"nodes": torch.zeros(self.depth, x0.shape[0], dtype=x0.dtype)}

    def release(self, round_index: int, state: State | None, counts: torch.Tensor) -> Release:
        """The clients' updates unnoised (what a server behind a plain or secure-aggregation boundary sees); the
        server's one node, as the event of its tree, with the owner charged at the epoch's first round only."""
        first = round_index % self.epoch == 0
        return Release((dp_event.NonPrivateDpEvent(),), (True,),
                       cohort=Cohort.scheduled(self.population, self.cohort_size, 1, first),
                       server_events=(self.draw_event(round_index),))

    def round_noise(self, round_index: int, draw: torch.Tensor, server: dict) -> tuple[torch.Tensor, dict]:
        """Round tau = t mod E + 1 of the epoch's tree: the drawn node nu of level v(tau) replaces the nodes of levels
        < v(tau), so e_tau = nu - their sum; nu is kept at its level and those below are cleared (module docstring).
        The tree restarts at each epoch's first round."""
        nodes = server["nodes"]
        position = round_index % self.epoch + 1
        if position == 1:  # a new epoch: the tree restarts at the released x
            nodes = torch.zeros_like(nodes)
        level = node_level(position)
        kept = nodes.clone()
        kept[..., :level, :] = 0
        kept[..., level, :] = draw
        return draw - nodes[..., :level, :].sum(-2), {"nodes": kept}

    def noise_encoder(self, rounds: int) -> torch.Tensor:
        """The tree's nodes as rows: row t holds 1 at the rounds of the node drawn in round t (tau = t mod E + 1, the
        2^v(tau) rounds ending at t; the tree restarts each epoch): summing a node's moves gives its sum plus its own
        draw, since the prefix noise of its last round is that of the round before its first plus its draw."""
        encoder = torch.zeros(rounds, rounds, dtype=torch.float64)
        for t in range(rounds):
            span = 1 << node_level(t % self.epoch + 1)
            encoder[t, t - span + 1: t + 1] = 1.0
        return encoder

    def divergence_hint(self, counts: torch.Tensor) -> str:
        return ("lower algorithm.global_lr or algorithm.lr (each round moves x by eta / n times the round's node "
                f"noise of std z C = {self.noise_multiplier * self.clip:.3g} and the nodes it replaces)")


@dataclass(frozen=True)
class DpFtrlConfig(PrefixSumFtrlConfig):
    """The ``[algorithm]`` keys of dp-ftrl (beyond name, rounds, client_rate and client_sampling)."""

    noise_multiplier: float | None = field(default=None, metadata={
        "help": f"z, each tree node's noise std is z C (default: calibrated to privacy.epsilon, else {DEFAULT_NOISE})"})


def _epoch(config: DpFtrlConfig, setting: Setting) -> ClientSampler:
    """The run's client sampler, checked to put every client in at most one round of each epoch. A config
    validated before its data is built (``Setting.num_clients`` None: the data brings its clients) gets a stand-in
    of one client per round; the run builds the real one on the data."""
    if setting.client_sampling not in SAMPLINGS:
        raise ConfigError("algorithm.client_sampling", setting.client_sampling,
                          f"one of {list(SAMPLINGS)} for {NAME!r}: its tree accounting needs every client in at most "
                          "one round of each epoch, which fixed-size and Poisson cohorts do not ensure (DP-FTRL "
                          "takes no credit for sampling)")
    if setting.num_clients is None:
        return ClientSampler(1, 1.0, setting.client_sampling)
    clients = ClientSampler(setting.num_clients, setting.client_rate, setting.client_sampling)
    if setting.client_sampling == "round_robin" and setting.num_clients % clients.cohort_size:
        raise ConfigError("algorithm.client_rate", setting.client_rate,
                          f"a rate whose cohort floor(rate M) divides the M = {setting.num_clients} clients under "
                          f"round robin (a cohort of {clients.cohort_size} wraps a client into a second round of an "
                          "epoch's tree), or algorithm.client_sampling = 'disjoint'")
    return clients


def build(name: str, config: DpFtrlConfig, setting: Setting) -> DpFtrl:
    if name != NAME:
        raise ConfigError("algorithm.name", name, f"{NAME!r}")
    check_section(NAME, config, setting)
    clients = _epoch(config, setting)
    return DpFtrl(**shared_fields(config, setting, DEFAULT_NOISE), population=clients.num_clients,
                  cohort_size=clients.cohort_size, epoch=clients.epoch, horizon=setting.rounds)


def initial_noise(name: str, config: DpFtrlConfig, setting: Setting) -> float:
    """z ~ sqrt(D k) / epsilon over k = ceil(T / E) trees, where the search for privacy.epsilon starts."""
    clients = _epoch(config, setting)
    trees = -(-setting.rounds // clients.epoch)
    return max(0.1, math.sqrt(tree_depth(clients.epoch) * trees) / setting.epsilon)


register(AlgorithmSpec(
    names=(NAME,), config=DpFtrlConfig, build=build, private=lambda name: True,
    help="DP-FTRL: FTRL on the tree aggregation of clipped client updates, a tree per epoch, each client once per "
         "epoch (user-level, no sampling credit; Kairouz et al. 2021)",
    privacy_defaults={"boundary": "trusted"}, common_defaults={"client_sampling": "disjoint"},
    release_keys=("algorithm.rounds",),  # a partial last epoch's tree is charged for its rounds alone
    calibration=Calibration(lambda name, config, setting: (THIRD_PARTY, OTHER_SILO), initial_noise),
))

__all__ = ["NAME", "SAMPLINGS", "DEFAULT_NOISE", "tree_depth", "node_level", "DpFtrl", "DpFtrlConfig",
           "build", "initial_noise"]
