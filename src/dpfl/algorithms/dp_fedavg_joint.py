"""dp-fedavg-joint, the registered algorithm: its ``[algorithm]`` keys, the builder that sizes the noise shares
(``joint_noise.NoiseShares``) for real Gaussian shares (``joint_noise.JointNoise``) or integer Skellam shares
(``joint_skellam.JointSkellam``), and sigma calibrated to ``privacy.epsilon`` (Heikkilä, Koskela, Shimizu, Kaski,
Honkela, "Differentially private cross-silo federated learning").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from dpfl.accounting.calibrate import solve_noise
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import observer_events
from dpfl.algorithms.joint_noise import TRUST, JointNoise, NoiseShares
from dpfl.algorithms.joint_relaxations import CLIENT_LR_RULES, ClientRelaxations, step_lr_factors
from dpfl.algorithms.joint_skellam import skellam_variant
from dpfl.algorithms.registry import AlgorithmSpec, Setting, register
from dpfl.engine.sampling import ClientSampler, RecordSampler
from dpfl.errors import ConfigError, check_range
from dpfl.noise import GaussianMechanism

#: the appendix relaxations' keys (``joint_relaxations``)
RELAXATION_KEYS = ("local_lr_schedule", "client_lr", "client_clip", "client_noise", "client_local_steps")
#: algorithm.noise: real Gaussian shares, or integer Skellam shares (``dpfl.algorithms.joint_skellam``)
NOISES = ("gaussian", "skellam")
#: sigma when neither algorithm.noise_multiplier nor privacy.epsilon is given
DEFAULT_NOISE = 1.0


@dataclass(frozen=True)
class JointNoiseConfig:
    """The ``[algorithm]`` keys of dp-fedavg-joint (beyond name and rounds; its cohort: ``clients_per_round``)."""

    local_steps: int = field(default=10, metadata={"help": "S, noisy local steps per round (1 / q: one epoch)",
                                                   "min": 1})
    sample_rate: float = field(default=0.1, metadata={"help": "q, each step's Poisson sampling rate of records"})
    lr: float = field(default=0.5, metadata={"help": "gamma, the local step size"})
    weight_decay: float = field(default=0.0, metadata={"help": "L2 regularisation lambda (added after the noise)"})
    clip: float = field(default=1.0, metadata={"help": "C, the per-example l2 clip norm"})
    noise_multiplier: float | None = field(default=None, metadata={
        "help": f"sigma, the noise the sum of shares keeps (default: calibrated to privacy.epsilon, else "
                f"{DEFAULT_NOISE})"})
    trust: str = field(default="clients", metadata={
        "choices": TRUST, "help": "who must not remove noise: sigma_i = sigma / sqrt(t - m), m = 0 (aggregator), 1 "
                                  "(clients), colluders (coalition); local: sigma_i = sigma"})
    colluders: int = field(default=1, metadata={"help": "m, colluding clients (trust = 'coalition')", "min": 1})
    clients_per_round: int | None = field(default=None, metadata={
        "help": "N, the clients invited per round, drawn uniformly (default: all, as Heikkilä et al.)", "min": 1})
    min_clients: int | None = field(default=None, metadata={
        "help": "t, the fewest clients whose update reaches the sum (secure aggregation's dropout threshold, > half "
                "the cohort; default: the whole cohort)", "min": 1})
    local_lr_schedule: list | None = field(default=None, metadata={
        "help": "l_s, one factor per local step: gamma_s = lr l_s (Heikkilä et al. Eq. 20; privacy unchanged)"})
    client_lr: list | str | None = field(default=None, metadata={
        "help": f"g_i = gamma_i / gamma, one factor per client id, or {list(CLIENT_LR_RULES)} (g_i = n_i / max n): "
                "the sum is credited as Heikkilä et al.'s Eq. 24"})
    client_clip: list | None = field(default=None, metadata={
        "help": "C_i, one clip norm per client id (replaces clip; Heikkilä et al. Eq. 25)"})
    client_noise: list | None = field(default=None, metadata={
        "help": "f_i, one factor per client id: client i's share is f_i sigma / sqrt(t - m) (Heikkilä et al. Eq. 25)"})
    client_local_steps: list | None = field(default=None, metadata={
        "help": "k_i, one per client id: client i fuses k_i local steps (clip C_i / k_i, its share on the last) into "
                "each of the S steps (Heikkilä et al. Eq. 26-27; privacy.analysis = 'paper' only: unproven)"})
    noise: str = field(default="gaussian", metadata={
        "choices": NOISES, "help": "the shares: real Gaussian, or integer Skellam after randomised rounding at "
                                   "skellam_scale (the rounding accounted; dpfl.algorithms.joint_skellam)"})
    skellam_scale: float = field(default=2.0**16, metadata={
        "help": "s, integer units per unit of a client's mean clipped gradient (noise = 'skellam'): larger is closer "
                "to Gaussian, smaller fits privacy.secagg_bits"})


def cohort_of(config: JointNoiseConfig, num_clients: int) -> tuple[float, str]:
    """(client rate N / M, 'fixed') of algorithm.clients_per_round (None: every client in every round)."""
    n = num_clients if config.clients_per_round is None else config.clients_per_round
    check_range("algorithm.clients_per_round", n, 1, num_clients, integer=True)
    return n / num_clients, "fixed"


def build_joint_noise(name: str, config: JointNoiseConfig, setting: Setting) -> JointNoise:
    """The algorithm of a config: sigma from algorithm.noise_multiplier or calibrated to privacy.epsilon."""
    if config.noise not in NOISES:
        raise ConfigError("algorithm.noise", config.noise, f"one of {list(NOISES)}")
    check_range("algorithm.skellam_scale", config.skellam_scale, 0.0, low_open=True)
    check_range("algorithm.clip", config.clip, 0.0, low_open=True)
    cohort = ClientSampler(setting.num_clients, setting.client_rate, setting.client_sampling).cohort_size
    sampler = RecordSampler(config.sample_rate, "poisson")
    step_lr = step_lr_factors(config.local_lr_schedule, config.local_steps)
    relaxations = ClientRelaxations.of_config(config, tuple(setting.train_counts), setting.analysis)
    relaxed = [key for key in RELAXATION_KEYS if getattr(config, key) is not None]
    if config.noise == "skellam" and relaxed:
        raise ConfigError(f"algorithm.{relaxed[0]}", getattr(config, relaxed[0]),
                          "unset with algorithm.noise = 'skellam' (the Skellam shares are sized and accounted for one "
                          "learning rate, clip and share size per step: the appendix relaxations are Gaussian only)")

    def algorithm(sigma: float) -> JointNoise:
        shares = NoiseShares(sigma, cohort, config.trust, config.colluders, config.min_clients)
        gaussian = JointNoise(local_steps=config.local_steps, lr=config.lr, sampler=sampler,
                              mechanism=GaussianMechanism(relaxations.own_multiplier(shares.share)), clip=config.clip,
                              weight_decay=config.weight_decay, shares=shares, step_lr=step_lr,
                              relaxations=relaxations,
                              accountant="rdp-integer" if setting.analysis == "paper" else "rdp")
        if config.noise == "gaussian":
            return gaussian
        return skellam_variant(gaussian, config.skellam_scale, setting.dimension, setting.train_counts)

    if setting.epsilon is None:
        return algorithm(DEFAULT_NOISE if config.noise_multiplier is None else config.noise_multiplier)
    if config.noise_multiplier is not None:
        raise ConfigError("algorithm.noise_multiplier", config.noise_multiplier,
                          "None when privacy.epsilon is given (sigma is then calibrated to it)")
    check_range("privacy.epsilon", setting.epsilon, 0.0, low_open=True)
    rounds = check_range("algorithm.rounds", setting.rounds, 1, integer=True)
    return algorithm(calibrated_noise(algorithm, setting, rounds))


def calibrated_noise(algorithm, setting: Setting, rounds: int) -> float:
    """The smallest sigma whose ``rounds`` rounds cost at most privacy.epsilon towards the trust setting's observer,
    by the ledger the run will keep (same analysis, accountant, conversion, delta)."""
    clients = ClientSampler(setting.num_clients, setting.client_rate, setting.client_sampling)
    counts = torch.tensor(setting.train_counts, dtype=torch.long)
    probe = algorithm(DEFAULT_NOISE)
    observer, boundary = probe.shares.protected_observer
    ledger = PrivacyLedger((observer,), setting.delta, None, setting.conversion, setting.analysis, probe.neighboring,
                           probe.accountant)

    def epsilon_of(sigma: float) -> float:
        release = algorithm(sigma).release(0, None, counts)
        return ledger.epsilon_after([{observer: observer_events(release, clients.cohort(t), boundary,
                                                                setting.analysis)[observer]} for t in range(rounds)],
                                    [observer])[observer]

    return solve_noise(epsilon_of, setting.epsilon, initial_noise=max(1.0, math.sqrt(rounds) / setting.epsilon))


register(AlgorithmSpec(
    names=("dp-fedavg-joint",), config=JointNoiseConfig, build=build_joint_noise, private=lambda name: True,
    help="DP-FedAvg with S local steps whose noise is shared among the clients, for secure aggregation "
         "(Heikkilä et al.)",
    release_keys=("algorithm.rounds",), cohort=cohort_of,
))

__all__ = ["RELAXATION_KEYS", "NOISES", "DEFAULT_NOISE", "JointNoiseConfig", "cohort_of", "build_joint_noise",
           "calibrated_noise"]
