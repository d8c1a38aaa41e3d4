"""The closed forms of Zhou et al. (2021): hand-computed values, KKT against alternate convex search and a brute-force
grid, the Gaussian rule, and Table I of the paper."""

import itertools
import re
import math

import numpy as np
import pytest

from dpfl.algorithms.fedsgd_dpc import ReplySchedule
from dpfl.engine.sampling import ClientSampler
from dpfl.errors import ConfigError
from dpfl.papers.zhou2021.experiment import TABLE_I, TABLE_I_FITS, table_constants
from dpfl.planning.queries_replies import Constants, GaussianBound, LaplaceBound, effective_c2, plan

# mu = lambda = 1 (gamma = 2), G = 3, Gamma = 0.5, Y0 = 2, p = 1, xi = 1, two clients of one sample each (d = 2),
# eps = 1: sum 1/eps^2 = 2. By hand: C1 = (4/1) 2 N G^2 / (N-1) = 144, C2 = 32 p xi^2 2 / (N d^2) = 8,
# C3 = gamma Y0 + 4 (2 lambda Gamma - 2 G^2 / (N-1)) = 4 + 4 (1 - 18) = -64.
HAND = dict(mu=1.0, lam=1.0, G=3.0, Gamma=0.5, Y0=2.0, p=1, xi=1.0, d=(1, 1), epsilon=(1.0,))


def test_laplace_constants_by_hand():
    bound = LaplaceBound(Constants(**HAND))
    assert (bound.C1, bound.C2, bound.C3) == (144.0, 8.0, -64.0)
    assert bound.A1(1) == 76.0 and bound.A2(1) == 8.0  # 4 (2 G^2 + 2 lambda Gamma); C2 b
    assert bound(2, 1) == 28.0  # (A1 + A2 T^2 + gamma Y0) / (T + gamma) = (76 + 32 + 4) / 4
    assert bound.rounds(1) == pytest.approx(math.sqrt(14) - 2, rel=1e-15)  # Eq. 6: sqrt(4 + 80 / 8) - 2
    assert bound.rounds(2) == pytest.approx(math.sqrt(4.5) - 2, rel=1e-15)  # sqrt(4 + 8 / 16) - 2
    assert bound.clients(3) == pytest.approx(math.sqrt(18) / 3, rel=1e-15)  # sqrt(C1 / C2) / T
    assert bound.clients(1) == 2.0 and bound.clients(0) == 2.0  # clipped to N; at T = 0, U falls in b


def test_laplace_joint_by_hand_can_choose_no_training():
    c = Constants(**HAND)
    bound = LaplaceBound(c)
    T, b = bound.joint_kkt()
    assert (T, b) == (pytest.approx(math.sqrt(4.5) - 2), 2.0)  # U = 3.88 at b = N beats 27.9 at b = 1
    # integers: U(0, 2) = 8 / 2 = 4 < U(1, 2) = (72 + 16 - 64) / 3 = 8
    result = plan(c, "laplace", "joint")
    assert (result.rounds, result.clients_per_round, result.bound) == (0, 2, 4.0)
    assert result.replies_per_client == 0.0


def test_per_client_budgets_and_sizes_enter_as_sums():
    uniform = LaplaceBound(Constants(**{**HAND, "epsilon": (1.0, 1.0)}))
    mixed = LaplaceBound(Constants(**{**HAND, "epsilon": (0.5, 2.0), "d": (3, 1)}))
    # sum 1/eps^2 = 4.25 instead of 2; d = 4 instead of 2
    assert mixed.C2 == pytest.approx(uniform.C2 * (4.25 / 2) / (16 / 4), rel=1e-15)


def test_gaussian_by_hand_and_the_rule():
    # as HAND, plus delta = 1/e (log 1/delta = 1), Lambda_i = 1, q = 1/2, c2 = 1: noise constant
    # c2^2 p xi^2 / d^2 sum log(1/delta)/eps^2 = 2/4; within = sum d_i Lambda_i^2 / (q d^2) = 2 / 2 = 1
    c = Constants(**HAND, delta=(math.exp(-1),), Lambda=(1.0,), q=0.5, c2=1.0)
    bound = GaussianBound(c)
    assert bound.E1 == pytest.approx(144.0) and bound.E3 == pytest.approx(2.0)
    assert bound.E2 == pytest.approx(4 * (-18 + 1 + 1) + 4 - 4 * 2 * 0.5)  # -64
    assert bound(10, 2) == pytest.approx(8 / 12 + 2)
    # at b = N: E1/N + E2 = 8 = (4/mu^2)(within + 2 lambda Gamma) + gamma (Y0 - E3) > 0: train as long as practical
    result = plan(c, "gaussian", "joint", max_rounds=500)
    assert (result.rounds, result.clients_per_round) == (500, 2)
    assert result.bound < bound(0, 2)
    # at b = 1 E1 + E2 = 80 > 0 as well; with a large noise constant, T = 0 wins at every b
    noisy = Constants(**{**HAND, "epsilon": (0.01,)}, delta=(math.exp(-1),), Lambda=(1.0,), q=0.5, c2=1.0)
    assert plan(noisy, "gaussian", "rounds", clients_per_round=1, max_rounds=500).rounds == 0
    assert plan(noisy, "gaussian", "clients", rounds=40).clients_per_round == 2


def _grid_constants():
    for G, Gamma, Y0, eps, gamma, xi in itertools.product(
        (0.1, 3.0, 100.0), (0.0, 0.5, 20.0), (0.01, 1.0, 100.0), (0.05, 1.0, 20.0), (2.0, 10.0), (0.3, 30.0)
    ):
        yield Constants(mu=1.0, lam=gamma / 2, G=G, Gamma=Gamma, Y0=Y0, p=50, xi=xi, d=(40, 60, 100, 300, 500),
                        epsilon=(eps, 2 * eps, eps, eps / 2, eps))


def test_kkt_candidates_and_alternate_convex_search_agree_and_beat_a_brute_force_grid():
    T = np.concatenate([[0.0], np.geomspace(1e-3, 1e5, 400)])[:, None]
    b = np.linspace(1, 5, 81)[None, :]
    checked = set()
    for c in _grid_constants():
        bound = LaplaceBound(c)
        kkt, acs = bound.joint_kkt(), bound.joint_acs()
        assert bound(*acs) == pytest.approx(bound(*kkt), rel=1e-9)
        assert acs[1] == pytest.approx(kkt[1], abs=1e-9)
        brute = ((bound.C1 / b + bound.C2 * b * T**2 + bound.C3) / (T + c.gamma)).min()
        assert bound(*kkt) <= brute * (1 + 1e-12)
        checked.add(kkt[1])
    assert checked == {1.0, 5.0}  # the grid reaches both boundary solutions


def test_integer_plan_is_the_best_integer_neighbour():
    for c in itertools.islice(_grid_constants(), 0, None, 37):
        bound = LaplaceBound(c)
        result = plan(c, "laplace", "rounds", clients_per_round=3)
        T = bound.rounds(3)
        assert result.rounds in (math.floor(T), math.ceil(T))
        assert result.bound == min(bound(math.floor(T), 3), bound(math.ceil(T), 3))


def test_round_robin_counts_ceil_replies_by_hand():
    """N = 2, b = 1: T = 3 makes client 0 reply twice, so the noise term is C2 N^2 m^2 / b = 8 * 4 * 4 at m = 2 where
    the paper's bT/N = 1.5 gives C2 b T^2 = 72; at T = 4 (a cycle's end) both count 2 replies."""
    expected, counted = LaplaceBound(Constants(**HAND)), LaplaceBound(Constants(**HAND), "round_robin")
    assert (expected.replies_per_client(3, 1), counted.replies_per_client(3, 1)) == (1.5, 2.0)
    assert expected(3, 1) == (144 + 72 - 64) / 5 and counted(3, 1) == (144 + 128 - 64) / 5
    assert counted(4, 1) == expected(4, 1) == (144 + 128 - 64) / 6
    assert counted.cycle_ends(3.0, 1) == {0, 2, 4, 6}  # m from floor(1.5) - 1 = 0 to ceil(1.5) + 1 = 3
    # T*(1) = sqrt(14) - 2 = 1.74: U(0) = 80 / 2, U(1) = U(2) x 4 / 3 at m = 1, U(2) = (144 + 32 - 64) / 4 = 28,
    # U(4) = 208 / 6 at m = 2: the cycle's end T = 2
    counted_plan = plan(Constants(**HAND), "laplace", "rounds", clients_per_round=1, replies="round_robin")
    assert (counted_plan.rounds, counted_plan.bound, counted_plan.replies_per_client) == (2, 28.0, 1.0)


@pytest.mark.parametrize("N, b, T", [(10, 1, 22), (10, 3, 7), (7, 3, 10), (2, 1, 3), (10, 10, 5), (7, 7, 1)])
def test_the_round_robin_count_is_what_fedsgd_dpc_calibrates_every_client_to(N, b, T):
    """The planner's m = ceil(bT/N) is the ledger's: the most replies any client makes under round robin."""
    schedule = ReplySchedule.draw(ClientSampler(N, b / N, "round_robin"), T, seed=0)
    c = Constants(**{**HAND, "d": (1,) * N})
    assert LaplaceBound(c, "round_robin").replies_per_client(T, b) == schedule.most
    chosen = plan(c, "laplace", "clients", rounds=T, replies="round_robin")  # the plan's own b, at this T
    drawn = ReplySchedule.draw(ClientSampler(N, chosen.clients_per_round / N, "round_robin"), T, seed=0)
    assert chosen.replies_per_client == drawn.most


def test_the_round_robin_plan_is_the_least_counted_bound_over_every_T():
    """For a fixed b the counted U falls in T while m stays, so its least value over T = 0..10 T* is at a cycle's
    end next to the relaxed T*: the integer plan finds it (brute force over every integer T)."""
    for c in itertools.islice(_grid_constants(), 0, None, 23):
        bound = LaplaceBound(c, "round_robin")
        for b in (1, 2, 5):
            result = plan(c, "laplace", "rounds", clients_per_round=b, replies="round_robin")
            brute = min(bound(T, b) for T in range(0, 10 * math.ceil(bound.rounds(b)) + 2 * c.N))
            assert result.bound == pytest.approx(brute, rel=1e-12) and result.bound == bound(result.rounds, b)
            assert result.bound >= LaplaceBound(c)(bound.rounds(b), b) * (1 - 1e-12)  # never below the relaxation


@pytest.mark.parametrize("field, value, allowed", [
    ("epsilon", (1.0, 2.0, 3.0), "one value, or one per client (2 clients)"),
    ("mu", 0.0, "(0, inf)"),
    ("d", (5,), "at least 2 clients"),
])
def test_bad_constants_name_the_field(field, value, allowed):
    with pytest.raises(ConfigError, match=rf"^{field} = .*{re.escape(allowed)}"):
        Constants(**{**HAND, field: value})


def test_an_unknown_reply_count_is_refused():
    with pytest.raises(ConfigError, match=r"^replies = 'mean' .*\['expected', 'round_robin'\]"):
        plan(Constants(**HAND), "laplace", "joint", replies="mean")


def test_plan_needs_the_fixed_coordinate():
    with pytest.raises(ConfigError, match="clients_per_round = None"):
        plan(Constants(**HAND), "laplace", "rounds")
    with pytest.raises(ConfigError, match="max_rounds = None"):
        plan(Constants(**HAND, delta=(1e-5,), Lambda=(1.0,), q=0.1, c2=1.0), "gaussian", "joint")
    with pytest.raises(ConfigError, match="Lambda = None"):
        GaussianBound(Constants(**HAND, delta=(1e-5,), c2=1.0))


def test_effective_c2_reproduces_the_calibrated_noise():
    # one client budget: c2^2 log(1/delta) / eps^2 * steps = z^2 / q^2
    q, steps, eps, delta = 0.05, 20, 1.0, 1e-5
    c2 = effective_c2(q, steps, (eps, eps), (delta, delta))
    from dpfl.accounting.accountant import gaussian_event
    from dpfl.accounting.calibrate import calibrate_noise

    z = calibrate_noise(lambda s: gaussian_event(s, steps, "poisson", q), eps, delta, "rdp")
    assert c2**2 * steps * math.log(1 / delta) / eps**2 == pytest.approx(z**2 / q**2, rel=1e-12)


# ---------------------------------------------------------------------------------------------------- Table I

EPSILONS = (1.0, 5.0, 10.0)
#: (gamma, U, V) fitted to Table I (papers/zhou2021.py says why MNIST's V is 197, not 198)
FITS = TABLE_I_FITS


@pytest.mark.parametrize("gamma_share", [0.0, 0.7])
@pytest.mark.parametrize("dataset", ["MNIST", "FEMNIST"])
def test_table_one(dataset, gamma_share):
    gamma, U, V = FITS[dataset]
    fixed_b5, fixed_b10, fixed_T50, at_b1 = TABLE_I[dataset]
    for k, eps in enumerate(EPSILONS):
        c = table_constants(dataset, gamma, U, V, eps, gamma_share)
        bound = LaplaceBound(c)
        assert c.gamma == pytest.approx(gamma)
        assert abs(bound.rounds(5) - fixed_b5[k]) <= 0.5
        assert abs(bound.rounds(10) - fixed_b10[k]) <= 0.5
        assert abs(bound.rounds(1) - at_b1[k]) <= 0.5
        # the paper's joint optimum: b* = 1 (Solution 1), with T*(1)
        T, b = bound.joint_kkt()
        assert b == 1.0 and abs(T - at_b1[k]) <= 0.5
        # b* for T = 50, rounded up as the table does
        up = plan(c, "laplace", "clients", rounds=50, rounding="up")
        assert up.clients_per_round == fixed_T50[k]
        assert up.continuous_clients_per_round == pytest.approx(max(1.0, math.sqrt(10 / 9 * U) * eps / 50))


def test_table_one_with_the_notes_fit_is_off_by_at_most_0_005():
    worst = 0.0
    for dataset, (gamma, U, V) in {"MNIST": (2.70, 411.0, 198.0), "FEMNIST": FITS["FEMNIST"]}.items():
        for k, eps in enumerate(EPSILONS):
            bound = LaplaceBound(table_constants(dataset, gamma, U, V, eps, 0.0))
            for b, column in ((5, 0), (10, 1), (1, 3)):
                worst = max(worst, abs(bound.rounds(b) - TABLE_I[dataset][column][k]))
    assert 0.5 < worst < 0.505


def test_integer_rounds_by_argmin_match_table_one_but_one_entry():
    """U at floor/ceil of T*: 17 of the 18 T* entries; MNIST's T*(b = 10, eps = 1) = 2.47 has U(3) < U(2)."""
    misses = []
    for dataset, (gamma, U, V) in FITS.items():
        for k, eps in enumerate(EPSILONS):
            c = table_constants(dataset, gamma, U, V, eps, 0.0)
            for b, column in ((5, 0), (10, 1), (1, 3)):
                if plan(c, "laplace", "rounds", clients_per_round=b).rounds != TABLE_I[dataset][column][k]:
                    misses.append((dataset, b, eps))
    assert misses == [("MNIST", 10, 1.0)]


def test_b_star_by_argmin_is_smaller_than_the_table():
    """Rounding b* = 2.14 and 4.27 (MNIST, eps = 5, 10) to the better integer gives 2 and 4; the table has 3 and 5."""
    gamma, U, V = FITS["MNIST"]
    got = [plan(table_constants("MNIST", gamma, U, V, eps, 0.0), "laplace", "clients", rounds=50).clients_per_round
           for eps in EPSILONS]
    assert got == [1, 2, 4]
