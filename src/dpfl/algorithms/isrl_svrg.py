"""ISRL-DP Prox-SVRG and Prox-PL-SVRG (Lowy, Ghafelebashi, Razaviyayn 2023, Algorithms 1 and 2; after the proximal
SVRG of Reddi, Sra, Poczos, Smola 2016) for federated ERM with a composite loss f0 + f1.

Alg. 1 runs epochs of Q inner steps. At an epoch start the snapshot w~ = w is taken, every silo sends its FULL local
gradient of clipped per-example gradients, and each inner step sends a noisy gradient difference against w~ on a
minibatch B of K records:

    snapshot:  g_i = (1/n_i) sum_{x in X_i} clip_C(grad f0(w~, x)) + u2,      u2 ~ N(0, (z 2C/n_i)^2 I)
               g   = mean_i g_i
    inner:     v_i = (1/K) sum_{x in B} [clip_C(grad f0(w, x)) - clip_C(grad f0(w~, x))] + u1,
                                                                               u1 ~ N(0, (z 4C/K)^2 I)
               w   = prox_{eta f1}(w - eta (g + mean_i v_i))

Alg. 2 (Prox-PL-SVRG) restarts Alg. 1 S times, each run from the previous run's output.

**Rounds.** One server update per inner step: round r is a snapshot round when its position in its run is a multiple
of Q (``ISRLSpider``'s checkpoint rounds, with the snapshot w~ as the reference point instead of w_{r-1}). The R rounds
are split into S runs of floor(R/S) or ceil(R/S) rounds. The first inner step of an epoch is taken at w = w~, where
the gradient difference is identically 0: the paper still adds u1 to it, a draw that carries no information about
any record; dpfl omits it, so a snapshot round sends g_i alone and steps w = prox_{eta f1}(w~ - eta g) (the same
recursion without that data-independent noise; its privacy charge would be wasted budget).

**Output rule.** Alg. 1 outputs an iterate chosen uniformly at random among the iterates of its run (Reddi et al.'s
rule, on which the Proximal-PL analysis of Alg. 2 rests). dpfl implements it: the position of each run's output is
drawn at build time from run.seed (a public choice, independent of the data), the server keeps that iterate when it
passes it, and at the run's last round the model becomes it. The next run (Alg. 2) restarts from it with a snapshot;
the run's final model is the last run's output. The iterates are post-processing of the released messages, so the
choice costs no privacy.

**Sensitivities and sampling** (``dpfl.engine.sampling.RecordSampler``, as ``isrl-mb-sgd``): inner minibatches of
K = floor(s n_i) records without replacement (replace-one: two clipped terms of one record change, 4C/K; amplified by
sampling without replacement, Wang, Balle, Kasiviswanathan 2019) or Poisson at rate s (zero-out: 2C/(s n_i),
Poisson-amplified). The paper samples with replacement; dpfl samples, and accounts, one of these instead. The
snapshot uses every record (not subsampled): 2C/n_i (replace-one) or C/n_i (zero-out). With a verified smoothness
beta (``algorithm.feature_clip``, logistic regression) the difference term is bounded by min(2C, beta ||w - w~||) as
in ``isrl-spider``.

**Accounting.** ISRL-DP: every draw is declared non-additive (no silo is credited with another's noise), so the
server and the other silos are each charged the silo's own messages. Each round declares the draw it makes (a snapshot
Gaussian, or a sampled inner Gaussian); the ledger composes both streams. One noise multiplier z, in units of each
stream's sensitivity, is the smallest for which the composition of all R rounds has epsilon <= privacy.epsilon (the
tightest accountant). The snapshot's sensitivity is already about K/(2 n_i) of the inner one's, so a split of z
between the streams would move little budget. Lowy et al.'s closed form (advanced composition, eps/2 per stream,
``theory.isrl_svrg_sigmas``) is never below the calibrated noise.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch

from dpfl.algorithms.isrl import ISRLKeys, calibration, checked_target, register_cross_silo
from dpfl.algorithms.isrl_spider import ISRLSpider
from dpfl.algorithms.projected_noisy_sgd import verified_smoothness
from dpfl.algorithms.registry import Setting
from dpfl.engine import randomness
from dpfl.engine.boundary import Delivery
from dpfl.noise import GaussianMechanism
from dpfl.engine.protocol import ServerContext, State
from dpfl.engine.sampling import RecordSampler
from dpfl.errors import ConfigError, check_range

NAMES = ("isrl-prox-svrg", "isrl-prox-pl-svrg")
#: S, Prox-PL-SVRG's runs of Alg. 1 when algorithm.restarts is not given (at most one per round)
DEFAULT_RESTARTS = 4


@dataclass(frozen=True)
class SVRGConfig(ISRLKeys):
    """The ``[algorithm]`` keys of isrl-prox-svrg and isrl-prox-pl-svrg: the ISRL-DP family's (s sets the inner
    minibatch K = floor(s n_i)), the epoch length Q, the restarts S and the feature bound."""

    period: int = field(default=5, metadata={"help": "Q, inner steps per epoch: a snapshot (full local gradient) "
                                                     "every Q rounds", "min": 1})
    restarts: int | None = field(default=None, metadata={
        "help": f"S, runs of Alg. 1, each from the last one's output (isrl-prox-pl-svrg only; default "
                f"min({DEFAULT_RESTARTS}, rounds))", "min": 1})
    feature_clip: float | None = field(default=None, metadata={"help": "R: features scaled to norm <= R, so that "
                                                                       "dpfl verifies the logistic loss's smoothness "
                                                                       "and scales the difference noise to "
                                                                       "||w - w~||"})


def run_starts(rounds: int, restarts: int) -> tuple[int, ...]:
    """The first round of each of the S runs: floor(s R / S), s = 0..S-1 (runs of floor or ceil of R/S rounds)."""
    return tuple(s * rounds // restarts for s in range(restarts))


@dataclass(frozen=True)
class ISRLSVRG(ISRLSpider):
    """ISRL-DP Prox-SVRG / Prox-PL-SVRG (see the module docstring): ``ISRLSpider``'s round with the snapshot as the
    reference point, a full-batch snapshot stream, and the epochs, runs and output rule of Alg. 1 and 2.
    ``checkpoint`` is the snapshot stream's mechanism and ``difference`` the inner stream's (the same z)."""

    rounds: int = 1
    starts: tuple[int, ...] = (0,)
    #: each run's output: the position (from 0) of the run's step whose iterate the run outputs
    outputs: tuple[int, ...] = (0,)

    def run_of(self, round_index: int) -> tuple[int, int, int]:
        """(run s, position of the round in its run, the run's number of rounds)."""
        s = max(i for i, start in enumerate(self.starts) if start <= round_index)
        end = self.starts[s + 1] if s + 1 < len(self.starts) else self.rounds
        return s, round_index - self.starts[s], end - self.starts[s]

    def is_checkpoint(self, round_index: int) -> bool:
        """A snapshot round: the round's position in its run is a multiple of Q."""
        return self.run_of(round_index)[1] % self.period == 0

    def records(self, round_index: int) -> RecordSampler:
        """Every record in a snapshot round, the minibatch sampler in an inner round."""
        return RecordSampler(1.0, self.sampler.scheme) if self.is_checkpoint(round_index) else self.sampler

    def reference(self, server: dict) -> torch.Tensor:
        """The snapshot w~."""
        return server["snapshot"]

    def init_state(self, x0: torch.Tensor, num_clients: int) -> State:
        return State({"x": x0.clone(), "snapshot": x0.clone(), "g": torch.zeros_like(x0), "output": x0.clone()})

    def examples_per_client(self, counts: torch.Tensor) -> int:
        return int(counts.max())

    def server_update(self, round_index: int, server: dict, delivered: Delivery, ctx: ServerContext) -> dict:
        """Snapshot round: w~ = w, g = mean g_i, w = prox_{eta f1}(w~ - eta g); inner round: w = prox_{eta f1}(w -
        eta (g + mean v_i)). The run's output iterate is kept when passed and becomes the model at the run's end."""
        state = dict(server)
        if delivered.count:
            mean = self.mean(round_index, server, delivered)
            if self.is_checkpoint(round_index):
                state.update(snapshot=server["x"], g=mean)
                step = mean
            else:
                step = server["g"] + mean
            state["x"] = self.regularizer.prox(server["x"] - self.lr * step, self.lr)
        run, position, length = self.run_of(round_index)
        if position == self.outputs[run]:
            state["output"] = state["x"]
        if position == length - 1:
            state["x"] = state["output"]
        return state

    def divergence_hint(self, counts: torch.Tensor) -> str:
        return "lower algorithm.lr, lower algorithm.period, or raise privacy.epsilon (less noise per step)"


def stream_counts(starts: tuple[int, ...], rounds: int, period: int) -> tuple[int, int]:
    """(snapshot rounds, inner rounds): ceil(length / Q) snapshots in each run."""
    ends = (*starts[1:], rounds)
    snapshots = sum(-(-(end - start) // period) for start, end in zip(starts, ends))
    return snapshots, rounds - snapshots


def output_positions(starts: tuple[int, ...], rounds: int, seed: int) -> tuple[int, ...]:
    """Each run's output position, uniform over its rounds, from run.seed's server stream for outputs."""
    ends = (*starts[1:], rounds)
    return tuple(int(torch.randint(end - start, (1,), generator=randomness.generator(seed, s, randomness.SERVER,
                                                                                      "output")))
                 for s, (start, end) in enumerate(zip(starts, ends)))


def restarts_of(name: str, config: SVRGConfig, rounds: int) -> int:
    """S: 1 for isrl-prox-svrg; algorithm.restarts (default min(4, R)) for isrl-prox-pl-svrg."""
    if name == "isrl-prox-svrg":
        if config.restarts not in (None, 1):
            raise ConfigError("algorithm.restarts", config.restarts,
                              "1 or unset for 'isrl-prox-svrg' (one run of Alg. 1; 'isrl-prox-pl-svrg' restarts it)")
        return 1
    if config.restarts is None:
        return min(DEFAULT_RESTARTS, rounds)
    return check_range("algorithm.restarts", config.restarts, 1, rounds, integer=True)


def build_svrg(name: str, config: SVRGConfig, setting: Setting) -> ISRLSVRG:
    if name not in NAMES:
        raise ConfigError("algorithm.name", name, f"one of {list(NAMES)}")
    _, rounds = checked_target(name, config, setting)
    period = check_range("algorithm.period", config.period, 1, integer=True)
    if config.feature_clip is not None:
        check_range("algorithm.feature_clip", config.feature_clip, 0.0, low_open=True)
    restarts = restarts_of(name, config, rounds)
    regularizer = config.regularizer_of()
    sampler = RecordSampler(config.sample_rate, config.record_sampling)
    starts = run_starts(rounds, restarts)
    mechanism = GaussianMechanism(setting.calibrated_noise())
    smoothness = None
    if config.feature_clip is not None:  # verified for logistic regression only (None elsewhere: the 2C bound)
        smoothness, _ = verified_smoothness(types.SimpleNamespace(feature_clip=config.feature_clip, clip=config.clip,
                                                                  weight_decay=0.0), setting)
    return ISRLSVRG(lr=config.lr, clip=config.clip, period=period, sampler=sampler, checkpoint=mechanism,
                    difference=mechanism, regularizer=regularizer, smoothness=smoothness,
                    feature_clip=config.feature_clip, rounds=rounds, starts=starts,
                    outputs=output_positions(starts, rounds, setting.seed))


register_cross_silo(
    NAMES, SVRGConfig, build_svrg,
    "ISRL-DP Prox-SVRG (full-gradient snapshots, variance-reduced inner steps) and Prox-PL-SVRG (its restarts), "
    "both streams composed, calibrated to privacy.epsilon, with a prox step for f1 (Lowy et al. 2023, Alg. 1, 2)",
    calibration(lambda *_: 1))

__all__ = ["NAMES", "SVRGConfig", "ISRLSVRG", "build_svrg", "run_starts", "stream_counts", "output_positions"]
