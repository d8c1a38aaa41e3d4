"""How many queries T (global iterations) and how many clients b per query (so bT/N replies per client): the
closed forms of Zhou, Liu, Fu, Wu, Li, Yu (2021), "Optimizing the numbers of queries and replies in federated
learning with differential privacy", for FedSGD-DPC (their Algorithm 1).

The quantity minimised is the paper's bound U(T, b) on Y_T = E||theta_T - theta*||^2 after T iterations with the
learning rate eta_t = 2 / (mu (t + gamma)), gamma = 2 lambda / mu:

* Laplace mechanism (Theorem 3): U(T, b) = (A1(b) + gamma Y0 + A2(b) T^2) / (T + gamma)
  = (C1 / b + C2 b T^2 + C3) / (T + gamma); T* for a fixed b is Eq. (6), b* for a fixed T is sqrt(B1 / B2), and the
  joint minimum over T >= 0, 1 <= b <= N (strictly biconvex, Prop. 3) is found two ways that must agree: the KKT
  candidates of Sec. V-B (b in {1, N} with T*(b), and T = 0) and alternate convex search.
* Gaussian mechanism (Theorem 4, Sec. VI-B): U(T, b) = E1 / (b (T + gamma)) + E2 / (T + gamma) + E3, monotone in T
  for every b, so T is either as large as practical (with b = N) or 0.

Everything here takes the problem constants as given: ``dpfl.planning.constants`` estimates them from data. Integer
T and b are chosen by evaluating U at the floor and ceiling of the continuous optimum (``rounding="argmin"``, the
default: the integer that minimises the bound the plan minimises), or as the paper's Table I rounds b* (up:
``rounding="up"``; its T* entries are the continuous optima rounded to the nearest integer).

**Replies per client.** The Laplace noise of Theorem 1 is calibrated to m, the replies a client makes; the paper writes
m = bT/N (Sec. IV-B1, "each client i needs to respond bT/N queries"), which is exact only when N divides bT.
``replies="round_robin"`` counts what FedSGD-DPC's ledger charges when the b clients of each query are taken in turn
(Alg. 1, l. 3: "The PS choose b clients with a round robin manner"): m = ceil(bT/N), the most replies any client
makes (``dpfl.algorithms.fedsgd_dpc.ReplySchedule``). U then has the noise term (32 / mu^2) p N m^2 xi_1^2 /
(b d^2) sum_i 1/eps_i^2, which is Theorem 3's C2 b T^2 at m = bT/N; the closed forms stay those of the relaxation
m = bT/N (U is at least the relaxed U, equal at T = mN/b), and the integer plan is the argmin of the counted U over
the T where a cycle of replies ends (U falls in T while m stays) beside the floor and ceiling of T*.
"""

from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

from dpfl.errors import ConfigError, check_range

MECHANISMS = ("laplace", "gaussian")
SOLVES = ("rounds", "clients", "joint")
ROUNDINGS = ("argmin", "up")
REPLIES = ("expected", "round_robin")


@dataclass(frozen=True)
class Constants:
    """The problem constants of Zhou et al.'s Assumptions 3-6 (Table II), the data sizes and the privacy budgets.

    Attributes:
      mu, lam: strong convexity and smoothness of F (mu > 0; gamma = 2 lam / mu).
      G: E||grad F_i(theta)||^2 <= G^2 (Assumption 5).
      Gamma: F* - sum_i (d_i / d) F_i*, the non-iid degree (>= 0).
      Y0: ||theta_0 - theta*||^2.
      p: the number of model parameters.
      xi: the per-sample gradient bound, l1 (xi_1, Laplace) or l2 (xi_2, Gaussian): the algorithm's clip.
      d: d_i, each client's number of samples (N = len(d)).
      epsilon: eps_i, each client's budget (one number: the same for every client).
      delta: delta_i (Gaussian only; one number: the same for every client).
      Lambda: Lambda_i, the within-client gradient standard deviation (Gaussian only, Assumption 6).
      q: the record sampling rate of the Gaussian mechanism (the Laplace mechanism uses every record: q = 1).
      c2: the constant of Theorem 2 (Gaussian only): sigma_i^2 = c2^2 xi_2^2 (bT/N) log(1/delta_i) / (d_i eps_i)^2.
    """

    mu: float
    lam: float
    G: float
    Gamma: float
    Y0: float
    p: int
    xi: float
    d: tuple[float, ...]
    epsilon: tuple[float, ...]
    delta: tuple[float, ...] = ()
    Lambda: tuple[float, ...] = ()
    q: float = 1.0
    c2: float | None = None
    N: int = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "d", _per_client("d", self.d, len(self.d), 0, low_open=True))
        N = len(self.d)
        if N < 2:
            raise ConfigError("d", list(self.d), "one sample count per client, at least 2 clients (N >= 2)")
        object.__setattr__(self, "N", N)
        object.__setattr__(self, "epsilon", _per_client("epsilon", self.epsilon, N, 0, low_open=True))
        if self.delta:
            object.__setattr__(self, "delta", _per_client("delta", self.delta, N, 0, 1, low_open=True, high_open=True))
        if self.Lambda:
            object.__setattr__(self, "Lambda", _per_client("Lambda", self.Lambda, N, 0))
        check_range("mu", self.mu, 0, low_open=True)
        check_range("lambda", self.lam, self.mu)
        for name in ("G", "Gamma", "Y0"):
            check_range(name, getattr(self, name), 0)
        check_range("p", self.p, 1, integer=True)
        check_range("xi", self.xi, 0, low_open=True)
        check_range("q", self.q, 0, 1, low_open=True)
        if self.c2 is not None:
            check_range("c2", self.c2, 0, low_open=True)

    @property
    def gamma(self) -> float:
        """gamma = 2 lambda / mu (Theorem 3)."""
        return 2 * self.lam / self.mu

    @property
    def total(self) -> float:
        """d = sum_i d_i."""
        return sum(self.d)


def _per_client(name: str, values, N: int, low, high=None, **bounds) -> tuple[float, ...]:
    values = tuple(values) if isinstance(values, Sequence) else (values,)
    if len(values) == 1:
        values = values * N
    if len(values) != N:
        raise ConfigError(name, list(values), f"one value, or one per client ({N} clients)")
    return tuple(float(check_range(name, v, low, high, **bounds)) for v in values)


def replies_per_client(T: float, b: float, N: int, replies: str) -> float:
    """m: bT/N ("expected", Theorem 1), or ceil(bT/N) ("round_robin": the most replies of any client when each query
    takes the next b clients in turn; the tolerance keeps 7 * 3 / 7 = 3.0000000000000004 at 3)."""
    expected = b * T / N
    return expected if replies == "expected" else float(math.ceil(expected - 1e-9))


# ---------------------------------------------------------------------------------------------------- Laplace


class LaplaceBound:
    """U(T, b) of Theorem 3 (the Laplace mechanism, pure eps_i-DP by basic composition over m replies: bT/N, or
    ceil(bT/N) under ``replies="round_robin"``, module docstring)."""

    def __init__(self, c: Constants, replies: str = "expected"):
        if replies not in REPLIES:
            raise ConfigError("replies", replies, f"one of {list(REPLIES)}")
        self.c = c
        self.replies = replies
        mu2, N = c.mu**2, c.N
        inverse_eps2 = sum(1 / e**2 for e in c.epsilon)
        #: C1, C2, C3 of the joint problem (Sec. V-B): U = (C1 / b + C2 b T^2 + C3) / (T + gamma)
        self.C1 = 4 / mu2 * 2 * N * c.G**2 / (N - 1)
        self.C2 = 32 / mu2 * c.p * c.xi**2 * inverse_eps2 / (N * c.total**2)
        self.C3 = c.gamma * c.Y0 + 4 / mu2 * (2 * c.lam * c.Gamma - 2 * c.G**2 / (N - 1))

    def A1(self, b: float) -> float:
        """A1 = (4 / mu^2) (2 (N - b) / (N - 1) G^2 / b + 2 lambda Gamma) (Sec. V-B) = C1 / b + C3 - gamma Y0."""
        c = self.c
        return 4 / c.mu**2 * (2 * (c.N - b) / (c.N - 1) * c.G**2 / b + 2 * c.lam * c.Gamma)

    def A2(self, b: float) -> float:
        """A2 = (32 / mu^2) p b xi_1^2 / (N d^2) sum_i 1 / eps_i^2 (Sec. V-B) = C2 b."""
        return self.C2 * b

    def replies_per_client(self, T: float, b: float) -> float:
        """m, the replies each client's noise is calibrated to: bT/N (Theorem 1), or ceil(bT/N) under round robin."""
        return replies_per_client(T, b, self.c.N, self.replies)

    def __call__(self, T: float, b: float) -> float:
        """U(T, b) = (A1(b) + A2(b) T^2 + gamma Y0) / (T + gamma), the bound of Theorem 3 at t = T; under round robin
        the noise term A2(b) T^2 = C2 b T^2 = C2 N^2 (bT/N)^2 / b is taken at m = ceil(bT/N) replies."""
        gamma, N = self.c.gamma, self.c.N
        noise = self.C2 * b * T**2 if self.replies == "expected" else \
            self.C2 * N**2 * self.replies_per_client(T, b) ** 2 / b
        return (self.C1 / b + noise + self.C3) / (T + gamma)

    def cycle_ends(self, T: float, b: float) -> set[int]:
        """Under round robin, the last T = floor(m N / b) of each reply count m near the continuous bT/N (U falls in
        T while m stays the same); none for the expected count."""
        if self.replies == "expected":
            return set()
        m = b * T / self.c.N
        return {math.floor(k * self.c.N / b + 1e-9) for k in range(max(0, math.floor(m) - 1), math.ceil(m) + 2)}

    def rounds(self, b: float) -> float:
        """T* = sqrt(gamma^2 + (A1 + gamma Y0) / A2) - gamma for a fixed b (Eq. 6)."""
        gamma = self.c.gamma
        return math.sqrt(gamma**2 + (self.C1 / b + self.C3) / (self.C2 * b)) - gamma

    def clients(self, T: float) -> float:
        """b* = sqrt(B1 / B2) = G N d / (2 T xi_1 sqrt(p (N - 1) sum_i 1/eps_i^2)) for a fixed T (Sec. V-B), clipped to
        [1, N]. U(b) = B1 / b + B2 b + B3 with B1 = C1 / (T + gamma), B2 = C2 T^2 / (T + gamma); at T = 0 U falls in
        b, so b* = N."""
        if T == 0:
            return float(self.c.N)
        return min(max(math.sqrt(self.C1 / self.C2) / T, 1.0), float(self.c.N))

    def joint_kkt(self) -> tuple[float, float]:
        """(T*, b*) over T >= 0, 1 <= b <= N from the KKT conditions (Sec. V-B, App. F): the best of Solutions 1 and 2
        (b = 1 or N with T*(b) of Eq. 6) and Solution 3 (T = 0, where U = (C1 / b + C3) / gamma is least at b = N).

        No interior point solves both stationarity conditions unless sqrt(C1 C2) = C3 / (2 gamma) exactly (the two
        give C1 / b = C2 b T^2 and C2 b T^2 = C3 T / (2 gamma)), so h(b) = min_T U(T, b), whose derivative is
        dU/db at T*(b), is strictly monotone on [1, N]: the optimum is at b = 1 or b = N.
        """
        N = float(self.c.N)
        candidates = [(self.rounds(1.0), 1.0), (self.rounds(N), N), (0.0, N)]
        return min(candidates, key=lambda tb: self(*tb))

    def joint_acs(self, tol: float = 1e-12, max_iterations: int = 100_000) -> tuple[float, float]:
        """(T*, b*) by alternate convex search (Gorski, Pfeuffer, Klamroth 2007), which Prop. 3 (U strictly biconvex)
        points to: T <- T*(b) (Eq. 6), b <- b*(T), from b = 1 and from b = N, the better partial optimum.

        A partial optimum (T*(b), b) with b interior would be a stationary point, which ``joint_kkt`` rules out, so
        both starts end at the global optimum's b (or the degenerate tie); the two starts guard the tie."""
        best = None
        for b in (1.0, float(self.c.N)):
            for _ in range(max_iterations):
                T = self.rounds(b)
                b_next = self.clients(T)
                if abs(b_next - b) <= tol * self.c.N:
                    b = b_next
                    break
                b = b_next
            else:
                raise ConfigError("max_iterations", max_iterations, "more iterations: alternate convex search did not "
                                                                    "converge")
            T = self.rounds(b)
            if best is None or self(T, b) < self(*best):
                best = (T, b)
        return best


# ---------------------------------------------------------------------------------------------------- Gaussian


class GaussianBound:
    """U(T, b) of Theorem 4 (the Gaussian mechanism on q-subsampled records), in the form of Sec. VI-B."""

    def __init__(self, c: Constants):
        for name in ("delta", "Lambda", "c2"):
            if getattr(c, name) in ((), None):
                raise ConfigError(name, None, "a value (or one per client) for the Gaussian mechanism")
        self.c = c
        mu2, N, d = c.mu**2, c.N, c.total
        within = sum(d_i * L**2 for d_i, L in zip(c.d, c.Lambda)) / (c.q * d**2)
        #: the noise term's constant: c2^2 p xi_2^2 / d^2 sum_i log(1 / delta_i) / eps_i^2 (Prop. 2)
        noise = c.c2**2 * c.p * c.xi**2 / d**2 * sum(math.log(1 / dl) / e**2 for dl, e in zip(c.delta, c.epsilon))
        self.E1 = 8 * c.G**2 / mu2 * N / (N - 1)
        self.E2 = 4 / mu2 * (-2 * c.G**2 / (N - 1) + within + 2 * c.lam * c.Gamma) + c.gamma * c.Y0 \
            - 4 / mu2 * c.gamma * noise
        self.E3 = 4 / mu2 * noise

    def __call__(self, T: float, b: float) -> float:
        """U(T, b) = E1 / (b (T + gamma)) + E2 / (T + gamma) + E3 (Sec. VI-B; E1's "mu_2" is mu^2)."""
        return (self.E1 / b + self.E2) / (T + self.c.gamma) + self.E3

    def rounds(self, b: float, max_rounds: float) -> float:
        """T for a fixed b: U(., b) is monotone, falling iff E1 / b + E2 > 0, so T = max_rounds (Solution 1: "as large
        as possible") or T = 0 (Solution 2). At b = N the condition reads (4 / mu^2) (sum_i d_i Lambda_i^2 / (q d^2)
        + 2 lambda Gamma) + gamma (Y0 - E3) > 0."""
        return float(max_rounds) if self.E1 / b + self.E2 > 0 else 0.0

    def clients(self, T: float) -> float:
        """b for a fixed T: U falls in b (E1 > 0), so b = N."""
        return float(self.c.N)


def effective_c2(q: float, steps: int, epsilon: Sequence[float], delta: Sequence[float], accountant: str = "rdp",
                 ) -> float:
    """Theorem 2's c2 for dpfl's numerical accountant instead of the moments accountant's unstated constant.

    Client i's noise on its batch-mean gradient has std sigma_i = z_i xi_2 / (q d_i) (Poisson sampling at rate q, add
    or remove one record; ``theory.zhou_gaussian_sigma``), z_i the noise multiplier that makes ``steps`` = bT/N
    sampled Gaussian steps (eps_i, delta_i)-DP (``calibrate_noise``). Theorem 4 only sees
    c2^2 sum_i log(1/delta_i) / eps_i^2 = sum_i z_i^2 / (q^2 steps), which fixes c2. Exact for the T (and b) it is
    computed at; the Gaussian rule compares T = 0 with the T it is computed at."""
    from dpfl.accounting.accountant import gaussian_event
    from dpfl.accounting.calibrate import calibrate_noise

    steps = check_range("steps", steps, 1, integer=True)
    z = {}
    for e, dl in zip(epsilon, delta):
        if (e, dl) not in z:
            z[(e, dl)] = calibrate_noise(lambda s: gaussian_event(s, steps, "poisson", q), e, dl, accountant)
    squares = sum(z[(e, dl)] ** 2 for e, dl in zip(epsilon, delta))
    return math.sqrt(squares / (q**2 * steps) / sum(math.log(1 / dl) / e**2 for e, dl in zip(epsilon, delta)))


# ---------------------------------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class Plan:
    """An integer plan (T, b), its bound U(T, b), and the continuous optimum it rounds."""

    rounds: int
    clients_per_round: int
    num_clients: int
    bound: float
    continuous_rounds: float
    continuous_clients_per_round: float
    mechanism: str
    solve: str
    rounding: str
    replies: str = "expected"

    @property
    def replies_per_client(self) -> float:
        """m, each client's replies as the plan counts them: bT/N (Alg. 1), or ceil(bT/N) under round robin."""
        return replies_per_client(self.rounds, self.clients_per_round, self.num_clients, self.replies)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "replies_per_client": self.replies_per_client}


def plan(c: Constants, mechanism: str = "laplace", solve: str = "joint", *, rounds: float | None = None,
         clients_per_round: float | None = None, max_rounds: int | None = None, rounding: str = "argmin",
         replies: str = "expected") -> Plan:
    """The (T, b) that minimises U (Theorem 3 or 4) with ``solve`` = "rounds" (b fixed to ``clients_per_round``),
    "clients" (T fixed to ``rounds``) or "joint"; ``replies``: the Laplace noise's reply count m, bT/N ("expected")
    or ceil(bT/N) ("round_robin", module docstring; the Gaussian bound's noise term does not depend on b).

    The Gaussian bound is monotone in T, so its T is 0 or ``max_rounds`` ("as large as practical"). Integers: U at
    floor and ceil of each continuous coordinate, the least (``rounding="argmin"``); ``rounding="up"`` rounds b up and
    T to the nearest integer, as the paper's Table I does.
    """
    if mechanism not in MECHANISMS:
        raise ConfigError("mechanism", mechanism, f"one of {list(MECHANISMS)}")
    if solve not in SOLVES:
        raise ConfigError("solve", solve, f"one of {list(SOLVES)}")
    if rounding not in ROUNDINGS:
        raise ConfigError("rounding", rounding, f"one of {list(ROUNDINGS)}")
    if replies not in REPLIES:
        raise ConfigError("replies", replies, f"one of {list(REPLIES)}")
    N = c.N
    if solve == "rounds":
        if clients_per_round is None:
            raise ConfigError("clients_per_round", None, "the fixed b (1 <= b <= N) when solving for the rounds")
        check_range("clients_per_round", clients_per_round, 1, N, integer=True)
    if solve == "clients":
        if rounds is None:
            raise ConfigError("rounds", None, "the fixed T (>= 0) when solving for the clients per round")
        check_range("rounds", rounds, 0, integer=True)
    if mechanism == "gaussian":
        bound = GaussianBound(c)
        if solve != "clients":
            if max_rounds is None:
                raise ConfigError("max_rounds", None, "the largest practical T: the Gaussian bound falls or rises in "
                                                      "T for ever, so T is 0 or this")
            check_range("max_rounds", max_rounds, 1, integer=True)
        b = float(clients_per_round) if solve == "rounds" else float(N)
        T = float(rounds) if solve == "clients" else bound.rounds(b, max_rounds)
        return _integer_plan(bound, T, b, N, mechanism, solve, rounding, replies)
    bound = LaplaceBound(c, replies)
    if solve == "rounds":
        b = float(clients_per_round)
        T = bound.rounds(b)
    elif solve == "clients":
        T = float(rounds)
        b = bound.clients(T)
    else:
        T, b = bound.joint_kkt()
    return _integer_plan(bound, T, b, N, mechanism, solve, rounding, replies)


def _integer_plan(bound, T: float, b: float, N: int, mechanism: str, solve: str, rounding: str,
                  replies: str) -> Plan:
    if rounding == "up":
        Ts, bs = [max(0, math.floor(T + 0.5))], [min(N, math.ceil(b))]
        candidates = [(Ti, bi) for Ti in Ts for bi in bs]
    else:
        bs = sorted({max(1, math.floor(b)), min(N, math.ceil(b))})
        fixed = solve == "clients"  # T is given: only b moves
        ends = {bi: bound.cycle_ends(T, bi) if isinstance(bound, LaplaceBound) and not fixed else set() for bi in bs}
        candidates = [(Ti, bi) for bi in bs for Ti in sorted({math.floor(T), math.ceil(T)} | ends[bi])]
    Ti, bi = min(candidates, key=lambda tb: bound(*tb))
    return Plan(Ti, bi, N, bound(Ti, bi), T, b, mechanism, solve, rounding, replies)


__all__ = ["Constants", "LaplaceBound", "GaussianBound", "Plan", "plan", "effective_c2", "MECHANISMS", "SOLVES",
           "ROUNDINGS", "REPLIES"]
