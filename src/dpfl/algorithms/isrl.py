"""ISRL-DP federated learning without a trusted server (Lowy, Ghafelebashi, Razaviyayn 2023): every silo's messages
are private against the server AND the other silos.

Inter-silo record-level DP (ISRL-DP, Lowy et al. Definition 2): for every silo i and every pair of its datasets that
differ in one record, the whole transcript of messages silo i sends is (eps, delta)-DP, conditional on everything
else. That is the guarantee privacy.epsilon calibrates: against a server that sees each message (``calibration``:
the server of a plain boundary, the silo's own messages, whatever the run's boundary). An observer that sees only
the round's sum of messages (the third party, which sees the models; another silo, which also knows its own
message; a server behind secure aggregation) is charged less where the draws are additive (``Release.additive``:
Prox-SGD's one step per round; the baselines' steps as ``LocalSGD`` declares them, the last local step of
isrl-local-sgd and every step of isrl-mb-sgd): the other silos' independent draws hide the owner's there, as for
DP-FedSGD. A silo that reveals its own draw is another silo's observer (it is credited the others' but its own);
a coalition of silos that pools its draws is not modelled. The SPIDER and SVRG recursions declare no additive draw.

The composite loss is f(w, x) = f0(w, x) + f1(w), f0 handled by clipped noisy gradients and f1 by a proximal step on
the server after aggregation (``dpfl.algorithms.prox``, ``algorithm.regularizer``).

Three algorithms, one round: every silo in the cohort S_r computes noisy gradient steps from w_r with per-example
clipping of the whole gradient at C (l2), and the server averages and takes the prox:

* ``isrl-prox-sgd``, Noisy ISRL-DP Prox-SGD (Lowy et al. Sec. 2, Thm 2.1): one step per round on a batch of
  K_i = floor(n_i / R) records DISJOINT from every other round's,

      g_i = (1/K_i) sum_{x in B_i^r} clip_C(grad f0(w_r, x)) + u_i,   u_i ~ N(0, (z 2C/K_i)^2 I)
      w_{r+1} = prox_{eta f1}(w_r - eta mean_{i in S_r} g_i)

  The batches B_i^0, ..., B_i^{R-1} are consecutive blocks of one uniform permutation of silo i's records, drawn from
  the run's seed before any data is read. Parallel composition: a record lies in exactly one batch, so the rounds
  that do not use it release nothing about it beyond what earlier outputs already did (their mechanism, conditioned
  on the past transcript, does not depend on the record). A record's privacy is therefore ONE Gaussian release of a
  mean of K_i clipped gradients, l2 sensitivity 2C/K_i under replace-one. The ledger cannot express "the round in
  which this record is used", so the release declares that one Gaussian in round 0 (``Cohort.scheduled``, taking
  part with probability 1) and nothing in later rounds: the same total, charged early, and no credit for the secret
  permutation (which would amplify) nor for silo sampling. z is the smallest noise multiplier whose single Gaussian
  has epsilon <= privacy.epsilon at privacy.delta (the ledger's tightest accountant: the exact Gaussian curve).
  Lowy et al.'s closed form (derived: the round made eps^2/(8 ln(1/delta))-zCDP, Bun-Steinke Prop. 1.3 then gives
  (eps, delta)-DP for eps <= 2 ln(1/delta), and the Gaussian of sensitivity 2L/K is Delta^2/(2 sigma^2)-zCDP):

      sigma^2 = 16 L^2 ln(1/delta) / (eps^2 K^2),  i.e.  z = sigma / (2L/K) = 2 sqrt(ln(1/delta)) / eps,

  which ``zcdp_noise_multiplier(eps, delta, 1)`` returns; the calibrated z is never larger (``theory.
  isrl_prox_sgd_sigma`` holds the paper's sigma).
* ``isrl-mb-sgd``, the ISRL-DP minibatch SGD baseline (Lowy et al. Sec. 4; Alg. 3 with q = 1): one step per round on
  a fresh minibatch (``record_sampling`` fixed: floor(s n_i) records without replacement, replace-one sensitivity
  2C/floor(s n_i); Poisson: rate s, zero-out sensitivity C/(s n_i)); the R rounds are composed, with record-sampling
  amplification, and z is calibrated so that the R-fold composition has epsilon <= privacy.epsilon.
* ``isrl-local-sgd``, the ISRL-DP Local SGD baseline (FedAvg): K local steps of size eta per round, each on a fresh
  minibatch and noised; the server averages the models and takes prox_{K eta f1}; R K draws composed.

The two baselines are ``LocalSGD`` (``dpfl.algorithms.local_sgd``, one step at w_r, or K moving steps) with the
ISRL release and the prox on the server; Prox-SGD reuses its noisy gradient with the disjoint batches. The closed
form for R K composed draws without amplification is z = 2 sqrt(R K ln(1/delta)) / eps (zCDP composition), an upper
bound on the calibrated z of every name.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from dpfl.accounting.observers import SERVER, Cohort, Release
from dpfl.accounting.theory import isrl_zcdp_budget
from dpfl.algorithms.local_sgd import LocalSGD
from dpfl.algorithms.noisy_mean import GaussianMean, NoisyMean, silo_vectors
from dpfl.algorithms.prox import REGULARIZERS, Regularizer
from dpfl.algorithms.registry import AlgorithmSpec, Calibration, Setting, register
from dpfl.engine.boundary import Delivery
from dpfl.noise import GaussianMechanism
from dpfl.engine.protocol import Algorithm, ClientContext, ClientData, ClientOutput, ServerContext, State
from dpfl.engine.sampling import ClientSampler, RecordSampler
from dpfl.errors import ConfigError, check_range

NAMES = ("isrl-prox-sgd", "isrl-mb-sgd", "isrl-local-sgd")


def zcdp_noise_multiplier(epsilon: float, delta: float, releases: int) -> float:
    """Lowy et al.'s closed form: ``releases`` Gaussian draws, each z in units of its sensitivity, composed to
    eps^2/(8 ln(1/delta))-zCDP (each 1/(2 z^2)-zCDP): z = sqrt(releases / (2 rho)) = 2 sqrt(releases ln(1/delta)) /
    eps. Valid for eps <= 2 ln(1/delta) (``theory.isrl_zcdp_budget``)."""
    rho = isrl_zcdp_budget(epsilon, delta)
    return math.sqrt(check_range("releases", releases, 1, integer=True) / (2.0 * rho))


def disjoint_keys(keys: torch.Tensor, counts: torch.Tensor, round_index: int, batch: torch.Tensor) -> torch.Tensor:
    """Keys [clients, width] whose batch_i smallest are the records at ranks [r batch_i, (r + 1) batch_i) of ``keys``
    (one uniform permutation per client, +inf on padding): round r's block. The rest keep their order after it."""
    rank = torch.argsort(torch.argsort(keys, dim=1), dim=1).double()
    n = counts.double().unsqueeze(1)
    shifted = torch.remainder(rank - round_index * batch.double().unsqueeze(1), n) / n
    return torch.where(torch.isfinite(keys), shifted, keys)


class ServerProx(Algorithm):
    """The server's step w <- prox_{eta f1}(w - eta v) of a composite loss f0 + f1: what the runs report of it, for a
    round with fields ``regularizer`` (f1) and ``lr`` (eta)."""

    regularizer: Regularizer
    lr: float

    def regulariser(self, x: torch.Tensor) -> float:
        """f1(x), the non-smooth part of the train objective the runs report."""
        return self.regularizer.value(x)

    @property
    def composite(self) -> tuple[Regularizer, float]:
        """(f1, eta) of the prox step, for the gradient mapping G_eta the runs report."""
        return self.regularizer, self.lr


@dataclass(frozen=True)
class ProxSGD(ServerProx):
    """The one-pass round of Prox-SGD (see the module docstring): each silo's block of round r of its secret
    permutation, one message per silo from the block's vectors clip_C(grad f0(w_r, x)) (the ``aggregator``, with
    ``noise``), and w_{r+1} = prox_{eta f1}(w_r - eta mean). ``isrl-prox-sgd`` is it with the Gaussian (``ISRL``
    builds it from its steps), ``sdp-prox-sgd`` with P_vec (``dpfl.algorithms.sdp``)."""

    lr: float
    clip: float
    sampler: RecordSampler
    #: the amount of noise, as the aggregator takes it (the Gaussian: a ``GaussianMechanism``; P_vec: its bits)
    noise: Any
    regularizer: Regularizer
    population: int
    cohort_size: int
    aggregator: NoisyMean
    accountant: str = "tightest"
    #: the fewest silos a round holds (the client sampler's: n for fixed-size cohorts, 1 for Poisson), whose other
    #: draws an additive aggregator's observers of the sum are credited with
    min_cohort: int = 1

    @property
    def neighboring(self) -> str:
        return self.sampler.neighboring

    def release(self, round_index: int, state: State, counts: torch.Tensor) -> Release:
        """A record's one release, charged in round 0 (parallel composition, module docstring) with the client
        sampler's participation where the aggregator credits it, else as taking part; nothing later."""
        if round_index > 0:
            cohort = Cohort.scheduled(self.population, self.cohort_size, 1, False)
        else:
            cohort = None if self.aggregator.credits_silo_sampling else \
                Cohort.scheduled(self.population, self.cohort_size, self.min_cohort, True)
        return self.aggregator.declared(self.noise, self.sampler, counts, state, sampled=False, cohort=cohort)

    def init_state(self, x0: torch.Tensor, num_clients: int) -> State:
        return State({"x": x0.clone()})

    def examples_per_client(self, counts: torch.Tensor) -> int:
        return int(self.sampler.batch_sizes(counts).max())

    def client_round(self, round_index: int, server: dict, clients: dict, data: ClientData,
                     ctx: ClientContext) -> ClientOutput:
        """The silo's message on round r's block of its permutation (drawn from the records stream of round 0, so the
        same permutation in every round), estimating -eta times its mean clipped gradient."""
        permutation = dataclasses.replace(ctx, round=0).streams("records").uniform(
            [(int(c),) for c in data.counts.tolist()])
        keys = disjoint_keys(permutation, data.counts, round_index, self.sampler.batch_sizes(data.counts))
        vectors = silo_vectors(ctx, self.sampler, keys, data, server["x"], None, self.clip, self.clip)
        messages, event = self.aggregator.send(self.noise, vectors, ctx, scale=-self.lr)
        return ClientOutput(messages, {}, [event])

    def server_update(self, round_index: int, server: dict, delivered: Delivery, ctx: ServerContext) -> dict:
        """w_{r+1} = prox_{eta f1}(w_r + the estimate of -eta mean)."""
        if delivered.count == 0:
            return server
        x = server["x"]
        step = self.aggregator.mean(self.noise, delivered, self.clip, self.clip, x, scale=-self.lr)
        return {"x": self.regularizer.prox(x + step, self.lr)}

    def divergence_hint(self, counts: torch.Tensor) -> str:
        return f"lower algorithm.lr, or raise privacy.epsilon ({self.aggregator.less_noise})"


#: isrl-prox-sgd's aggregator: messages dy = -eta (g_i + u_i), the model change, whose draw u_i enters the round's sum
#: additively (the server's prox reads the sum alone; the silo keeps nothing of u_i)
MODEL_CHANGE = GaussianMean("dy", additive=True)


@dataclass(frozen=True)
class ISRL(Algorithm):
    """An ISRL-DP algorithm (see the module docstring): the silos' noisy steps, the prox on the server."""

    name: str
    steps: LocalSGD
    regularizer: Regularizer
    population: int
    cohort_size: int
    accountant: str = "tightest"
    min_cohort: int = 1  # the fewest silos a round holds (``ProxSGD``)

    @property
    def neighboring(self) -> str:
        return self.steps.neighboring

    @property
    def disjoint(self) -> bool:
        return self.name == "isrl-prox-sgd"

    @property
    def one_pass(self) -> ProxSGD:
        """isrl-prox-sgd's round: ``ProxSGD`` with the steps' Gaussian mechanism and step eta."""
        return ProxSGD(self.steps.local_lr, self.steps.clip, self.steps.sampler, self.steps.mechanism,
                       self.regularizer, self.population, self.cohort_size, MODEL_CHANGE, min_cohort=self.min_cohort)

    @property
    def server_lr(self) -> float:
        """The prox step: eta per local step, K eta for K local steps."""
        return self.steps.local_lr * self.steps.local_steps

    def release(self, round_index: int, state: State, counts: torch.Tensor) -> Release:
        """Prox-SGD: one Gaussian, charged in round 0 for every record (``ProxSGD``); the baselines: the K sampled
        Gaussians of their local steps, declared as ``LocalSGD`` declares them (the steps are its, and the server's
        prox reads the mean alone), the additive ones credited towards the observers of the sum (module
        docstring)."""
        if self.disjoint:
            return self.one_pass.release(round_index, state, counts)
        return self.steps.release(round_index, state, counts)

    def init_state(self, x0: torch.Tensor, num_clients: int) -> State:
        return State({"x": x0.clone()})

    def examples_per_client(self, counts: torch.Tensor) -> int:
        return self.steps.examples_per_client(counts)

    def client_round(self, round_index: int, server: dict, clients: dict, data: ClientData,
                     ctx: ClientContext) -> ClientOutput:
        """Messages {dy}: the silo's model change (Prox-SGD: ``ProxSGD``'s, -eta g_i)."""
        if self.disjoint:
            return self.one_pass.client_round(round_index, server, clients, data, ctx)
        out = self.steps.client_round(round_index, {"x": server["x"]}, {}, data, ctx)  # no control variates
        return ClientOutput({"dy": out.messages["dy"]}, {}, out.events)

    def server_update(self, round_index: int, server: dict, delivered: Delivery, ctx: ServerContext) -> dict:
        """w_{r+1} = prox_{eta f1}(w_r + mean dy) (row-wise where the state carries a leading row axis)."""
        if delivered.count == 0:
            return server
        return {"x": self.regularizer.prox(server["x"] + delivered.sum("dy") / delivered.count, self.server_lr)}

    def regulariser(self, x: torch.Tensor) -> float:
        """f1(x), the non-smooth part of the train objective the runs report."""
        return self.regularizer.value(x)

    @property
    def composite(self) -> tuple[Regularizer, float]:
        """(f1, eta) of the server's prox step (K eta for K local steps), for the gradient mapping G_eta the runs
        report."""
        return self.regularizer, self.server_lr

    def divergence_hint(self, counts: torch.Tensor) -> str:
        return "lower algorithm.lr, or raise privacy.epsilon (less noise per step)"


@dataclass(frozen=True)
class ISRLKeys:
    """The ``[algorithm]`` keys every ISRL-DP algorithm has (beyond name, rounds, client_rate, client_sampling)."""

    lr: float = field(default=0.1, metadata={"help": "eta, the step size of every (local) step"})
    clip: float = field(default=1.0, metadata={"help": "C, the per-example l2 clip norm of the whole gradient"})
    sample_rate: float = field(default=0.2, metadata={"help": "s, each minibatch is floor(s n_i) records (fixed) or "
                                                               "each record with probability s (poisson); "
                                                               "isrl-prox-sgd: floor(n_i / R) disjoint records"})
    record_sampling: str = field(default="fixed", metadata={"choices": ("fixed", "poisson"),
                                                             "help": "minibatches: fixed size without replacement "
                                                                     "or Poisson"})
    regularizer: str = field(default="none", metadata={"choices": REGULARIZERS,
                                                        "help": "f1, applied by a prox step on the server"})
    reg_strength: float = field(default=0.0, metadata={"help": "lambda of the l1 / l2 / elastic_net f1"})
    l1_ratio: float = field(default=0.5, metadata={"help": "alpha: elastic_net f1 = lambda (alpha |w|_1 + "
                                                           "(1 - alpha) |w|^2 / 2)"})
    radius: float = field(default=1.0, metadata={"help": "rho of the l2_ball / box [-rho, rho]^d constraint"})

    def regularizer_of(self) -> Regularizer:
        return Regularizer(self.regularizer, self.reg_strength, self.l1_ratio, self.radius)


@dataclass(frozen=True)
class ISRLConfig(ISRLKeys):
    """The keys of isrl-prox-sgd, isrl-mb-sgd and isrl-local-sgd."""

    local_steps: int = field(default=5, metadata={"help": "K, local steps per round (isrl-local-sgd only)",
                                                   "min": 1})


def calibration(draws) -> Calibration:
    """How privacy.epsilon sets an ISRL-DP family's noise multiplier: against the server of a plain boundary, which
    sees each silo's messages (ISRL-DP's transcript, whatever the run's boundary; the observers of the sum alone are
    charged at most that), with no credit for silo sampling (ISRL-DP holds given who takes part), the search starting
    at the zCDP closed form for ``draws(name, config, setting)`` draws."""
    return Calibration(lambda name, config, setting: (SERVER,),
                       lambda name, config, setting: max(1.0, 2.0 * math.sqrt(draws(name, config, setting)) /
                                                         setting.epsilon), lambda name, config, setting: "plain",
                       credits_client_sampling=False)


def checked_target(name: str, config, setting: Setting) -> tuple[float, int]:
    """(privacy.epsilon, algorithm.rounds) of an ISRL-DP family, with its lr and clip checked: every silo's noise is
    calibrated to that epsilon over those rounds."""
    if setting.epsilon is None:
        raise ConfigError("privacy.epsilon", None, f"a positive number: {name} calibrates every silo's noise to it")
    epsilon = check_range("privacy.epsilon", setting.epsilon, 0.0, low_open=True)
    rounds = check_range("algorithm.rounds", setting.rounds, 1, integer=True)
    check_range("algorithm.lr", config.lr, 0.0, low_open=True)
    check_range("algorithm.clip", config.clip, 0.0, low_open=True)
    return epsilon, rounds


def build_isrl(name: str, config: ISRLConfig, setting: Setting) -> ISRL:
    if name not in NAMES:
        raise ConfigError("algorithm.name", name, f"one of {list(NAMES)}")
    _, rounds = checked_target(name, config, setting)
    regularizer = config.regularizer_of()
    check_range("algorithm.local_steps", config.local_steps, 1, integer=True)
    minibatches = RecordSampler(config.sample_rate, config.record_sampling)  # validated for every name
    counts = torch.tensor(setting.train_counts, dtype=torch.long)
    local_steps = config.local_steps if name == "isrl-local-sgd" else 1
    if name == "isrl-prox-sgd":
        if rounds > int(counts.min()):
            raise ConfigError("algorithm.rounds", rounds, f"at most {int(counts.min())} for 'isrl-prox-sgd' (the "
                                                          "smallest silo's records: each round uses floor(n_i / R) "
                                                          ">= 1 records no other round uses)")
        sampler = RecordSampler(1.0 / rounds, "fixed")
    else:
        sampler = minibatches
    steps = LocalSGD(local_steps=local_steps, lr=config.lr * sampler.rate * local_steps, sampler=sampler,
                     mechanism=GaussianMechanism(setting.calibrated_noise()), clip=config.clip, weight_decay=0.0,
                     move_locally=name == "isrl-local-sgd")
    clients = ClientSampler(setting.num_clients, setting.client_rate, setting.client_sampling)
    return ISRL(name, steps, regularizer, setting.num_clients, clients.cohort_size,
                min_cohort=clients.cohort(0).min_size)


def draws(name: str, config: ISRLConfig, setting: Setting) -> int:
    """The Gaussian draws a record's privacy composes: one (Prox-SGD's disjoint batches), else R K."""
    return 1 if name == "isrl-prox-sgd" else setting.rounds * (config.local_steps if name == "isrl-local-sgd" else 1)


def register_cross_silo(names: tuple[str, ...], config: type, build, help: str, calibration: Calibration | None = None,
                        **privacy_defaults) -> AlgorithmSpec:
    """Registers an ISRL-DP or shuffle-DP family (``dpfl.algorithms.registry``): every name private, its noise
    calibrated to privacy.epsilon over algorithm.rounds (no noise key), every silo in every round unless
    algorithm.client_rate says otherwise (cross-silo: a few silos); ``privacy_defaults``: the [privacy] defaults it is
    calibrated for."""
    return register(AlgorithmSpec(names=names, config=config, build=build, private=lambda name: True, help=help,
                                  common_defaults={"client_rate": 1.0}, release_keys=("algorithm.rounds",),
                                  noise_key=None, privacy_defaults=privacy_defaults, calibration=calibration))


register_cross_silo(
    NAMES, ISRLConfig, build_isrl,
    "ISRL-DP Prox-SGD (disjoint batches), minibatch SGD and Local SGD, private against the server and the other "
    "silos, calibrated to privacy.epsilon, with a prox step for f1 (Lowy et al. 2023)", calibration(draws))
