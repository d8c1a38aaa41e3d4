"""RecordSampler and ClientSampler: sizes, uniformity, sensitivities and the privacy events they declare; record
samples from uniform keys (a client's own stream); client cohorts per round (fixed, Poisson, round robin, disjoint)
and the participation they are charged."""

import math

import pytest
import torch
from dp_accounting import dp_event
from scipy import stats

from dpfl.accounting.observers import Cohort
from dpfl.engine.sampling import ClientSampler, RecordSampler, uniform_keys
from dpfl.errors import ConfigError

GAUSS = dp_event.GaussianDpEvent(1.3)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def selected(indices, mask, row):
    return indices[row][mask[row] > 0].tolist()


def inclusion_counts(sampler, counts, draws, seed=0):
    """How often each record index of each client is in the minibatch over ``draws`` draws."""
    g = gen(seed)
    freq = torch.zeros(counts.shape[0], int(counts.max()))
    for _ in range(draws):
        indices, mask = sampler.sample(counts, g)
        freq.scatter_add_(1, indices, mask)
    return freq


def chi_square(observed, expected):
    return float(((observed - expected) ** 2 / expected).sum())


# -- fixed size ----------------------------------------------------------------------------------------------------
def test_fixed_equal_counts_exact_sizes_distinct_indices():
    counts = torch.tensor([20, 20, 20, 20])
    sampler = RecordSampler(0.3)
    g = gen()
    for _ in range(50):
        indices, mask = sampler.sample(counts, g)
        assert indices.dtype == torch.long and mask.shape == indices.shape == (4, 6)
        for row in range(4):
            chosen = selected(indices, mask, row)
            assert len(chosen) == 6 == len(set(chosen))
            assert all(0 <= i < 20 for i in chosen)


def test_fixed_unequal_counts_exact_sizes_distinct_valid_indices():
    counts = torch.tensor([10, 7, 23, 3])
    sampler = RecordSampler(0.5)
    expected = [5, 3, 11, 1]  # floor(0.5 n_i)
    assert sampler.batch_sizes(counts).tolist() == expected
    g = gen()
    for _ in range(50):
        indices, mask = sampler.sample(counts, g)
        assert mask.sum(1).tolist() == expected
        for row, n in enumerate(counts.tolist()):
            chosen = selected(indices, mask, row)
            assert len(set(chosen)) == len(chosen)
            assert all(0 <= i < n for i in chosen), (row, chosen)


def test_fixed_batch_sizes_floor_and_at_least_one():
    sampler = RecordSampler(0.29)
    assert sampler.batch_sizes(torch.tensor([100, 10, 1, 3])).tolist() == [29, 2, 1, 1]
    assert RecordSampler(1.0).batch_sizes(torch.tensor([5, 9])).tolist() == [5, 9]


def test_fixed_inclusion_is_uniform_equal_counts():
    counts = torch.tensor([12, 12, 12])
    sampler = RecordSampler(0.25)  # 3 of 12
    draws = 2000
    freq = inclusion_counts(sampler, counts, draws)
    assert freq.sum(1).tolist() == [3.0 * draws] * 3
    expected = draws * 3 / 12
    for row in range(3):
        # chi-square with 11 degrees of freedom (inclusions are negatively correlated, so this is conservative);
        # the 99.9% quantile is 31.3
        assert chi_square(freq[row], torch.full((12,), expected)) < 31.3


def test_fixed_inclusion_is_uniform_unequal_counts():
    counts = torch.tensor([40, 20])
    sampler = RecordSampler(0.5)  # 20 of 40, 10 of 20
    draws = 1000
    freq = inclusion_counts(sampler, counts, draws)
    assert chi_square(freq[0], torch.full((40,), draws * 0.5)) < 73.4  # 99.9% quantile, 39 dof
    assert freq[1, 20:].sum() == 0
    assert chi_square(freq[1, :20], torch.full((20,), draws * 0.5)) < 43.8  # 99.9% quantile, 19 dof


def test_fixed_full_rate_takes_every_record():
    counts = torch.tensor([6, 6])
    indices, mask = RecordSampler(1.0).sample(counts, gen())
    assert mask.sum().item() == 12
    for row in range(2):
        assert sorted(selected(indices, mask, row)) == list(range(6))


def test_same_generator_state_same_sample():
    counts = torch.tensor([30, 30, 30])
    a = RecordSampler(0.2).sample(counts, gen(5))
    b = RecordSampler(0.2).sample(counts, gen(5))
    c = RecordSampler(0.2).sample(counts, gen(6))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


# -- Poisson -------------------------------------------------------------------------------------------------------
def test_poisson_sizes_binomial_mean_and_variance():
    n, q, clients = 50, 0.2, 4000
    counts = torch.full((clients,), n)
    indices, mask = RecordSampler(q, "poisson").sample(counts, gen(3))
    sizes = mask.sum(1).double()
    mean, var = float(sizes.mean()), float(sizes.var())
    assert mean == pytest.approx(q * n, abs=4 * math.sqrt(n * q * (1 - q) / clients))  # 10 +- 0.18
    assert var == pytest.approx(n * q * (1 - q), rel=0.1)  # 8 (a fixed-size sampler would give 0)
    assert indices.shape[1] == int(sizes.max())
    for row in range(20):
        chosen = selected(indices, mask, row)
        assert len(set(chosen)) == len(chosen) and all(0 <= i < n for i in chosen)


def test_poisson_expected_batch_size_is_q_n():
    sampler = RecordSampler(0.1, "poisson")
    torch.testing.assert_close(sampler.batch_sizes(torch.tensor([10, 35])), torch.tensor([1.0, 3.5], dtype=torch.float64))
    torch.testing.assert_close(sampler.divisor(torch.tensor([10, 35])), torch.tensor([1.0, 3.5], dtype=torch.float64))


def test_poisson_inclusion_is_uniform():
    counts = torch.full((8,), 40)
    q, draws = 0.3, 1500
    freq = inclusion_counts(RecordSampler(q, "poisson"), counts, draws).sum(0)  # pooled over the 8 clients
    total = 8 * draws
    # each record is in the batch with probability q, independently: binomial(total, q) per index
    z = (freq - total * q) / math.sqrt(total * q * (1 - q))
    assert z.abs().max() < 4.0, z


# -- sensitivity and events ----------------------------------------------------------------------------------------
def test_mean_sensitivity():
    counts = torch.tensor([10, 7, 23])
    fixed = RecordSampler(0.3).mean_sensitivity(1.5, counts)
    torch.testing.assert_close(fixed, torch.tensor([2 * 1.5 / 3, 2 * 1.5 / 2, 2 * 1.5 / 6], dtype=torch.float64))
    poisson = RecordSampler(0.3, "poisson").mean_sensitivity(1.5, counts)
    torch.testing.assert_close(poisson, 1.5 / (0.3 * counts.double()))


def test_fixed_event_uses_worst_case_client():
    counts = torch.tensor([23, 10, 7])  # ratios 6/23 = .26, 3/10 = .3 (worst), 2/7 = .29
    event = RecordSampler(0.3).event(GAUSS, counts)
    assert event == dp_event.SampledWithoutReplacementDpEvent(10, 3, GAUSS)
    counts = torch.tensor([4, 100])  # floor(0.3 * 4) = 1: ratio .25 < 30/100
    assert RecordSampler(0.3).event(GAUSS, counts) == dp_event.SampledWithoutReplacementDpEvent(100, 30, GAUSS)
    # a client of 2 records still samples 1 of them (ratio 0.5): it is the worst case
    counts = torch.tensor([100, 2])
    assert RecordSampler(0.3).event(GAUSS, counts) == dp_event.SampledWithoutReplacementDpEvent(2, 1, GAUSS)


def test_full_batch_event_is_the_noise_event():
    assert RecordSampler(1.0).event(GAUSS, torch.tensor([5, 8])) == GAUSS


def test_poisson_event():
    assert RecordSampler(0.2, "poisson").event(GAUSS, torch.tensor([5, 8])) == dp_event.PoissonSampledDpEvent(0.2, GAUSS)


@pytest.mark.parametrize("scheme", ["fixed", "poisson"])
def test_non_private_noise_passes_through(scheme):
    for event in (dp_event.NonPrivateDpEvent(), dp_event.NoOpDpEvent()):
        assert RecordSampler(0.2, scheme).event(event, torch.tensor([10])) == event


def test_record_sampler_bad_arguments():
    for rate in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ConfigError) as err:
            RecordSampler(rate)
        assert err.value.field == "algorithm.sample_rate"
    with pytest.raises(ConfigError) as err:
        RecordSampler(0.2, "shuffle")
    assert err.value.field == "algorithm.record_sampling"


# -- uniform keys: what a client's own record stream feeds the sampler ----------------------------------------------
def test_uniform_keys_cover_real_records_only():
    counts = torch.tensor([3, 5, 1])
    keys = uniform_keys(counts, gen())
    assert keys.shape == (3, 5)
    for row, n in enumerate(counts.tolist()):
        assert bool(((keys[row, :n] >= 0) & (keys[row, :n] < 1)).all()) and bool(keys[row, n:].isinf().all())


def test_fixed_sample_from_keys_is_the_smallest_keys():
    counts = torch.tensor([10, 7, 4])
    keys = uniform_keys(counts, gen(3))
    sampler = RecordSampler(0.5)  # 5, 3, 2 records
    indices, mask = sampler.sample(counts, keys)
    for row, b in enumerate([5, 3, 2]):
        assert sorted(selected(indices, mask, row)) == sorted(keys[row].argsort()[:b].tolist())
    # a generator draws the same keys itself
    by_generator = sampler.sample(counts, gen(3))
    assert torch.equal(by_generator[0], indices) and torch.equal(by_generator[1], mask)


def test_the_batch_shape_read_once_a_round_follows_the_rate_and_the_counts():
    """The fixed scheme reads its batch width from the device once for a counts tensor (a round's K steps), yet two
    samplers of other rates on the same counts, other counts, and counts changed in place each get their own."""
    counts = torch.tensor([10, 7, 4])
    keys = uniform_keys(counts, gen(5))
    half, most = RecordSampler(0.5), RecordSampler(0.9)
    for _ in range(2):
        assert half.sample(counts, keys)[1].sum(1).tolist() == [5, 3, 2]
        assert most.sample(counts, keys)[1].sum(1).tolist() == [9, 6, 3]
    assert half.sample(torch.tensor([10, 7, 4]), keys)[1].sum(1).tolist() == [5, 3, 2]
    counts[0] = 4  # in place: the cached shape is stale
    indices, mask = half.sample(counts, keys)
    assert mask.shape == (3, 3) and mask.sum(1).tolist() == [2, 3, 2]


def test_poisson_sample_from_keys_is_the_keys_below_q():
    counts = torch.tensor([30, 12, 25])
    keys = uniform_keys(counts, gen(4))
    indices, mask = RecordSampler(0.3, "poisson").sample(counts, keys)
    for row in range(3):
        assert sorted(selected(indices, mask, row)) == (keys[row] < 0.3).nonzero().squeeze(1).tolist()


def test_a_clients_sample_depends_only_on_its_own_keys():
    """Row i of the sample is a function of row i of the keys (and n_i): the same alone as among other rows."""
    counts = torch.tensor([9, 14, 6, 14])
    keys = uniform_keys(counts, gen(8))
    for scheme in ("fixed", "poisson"):
        sampler = RecordSampler(0.4, scheme)
        indices, mask = sampler.sample(counts, keys)
        for row in range(4):
            alone = sampler.sample(counts[row : row + 1], keys[row : row + 1, : int(counts[row])])
            assert sorted(selected(*alone, 0)) == sorted(selected(indices, mask, row)), (scheme, row)


# -- clients: fixed size and Poisson ---------------------------------------------------------------------------------
@pytest.mark.parametrize("m, rate, size", [(10, 0.3, 3), (100, 0.29, 29), (10, 0.7, 7), (7, 0.5, 3), (5, 1.0, 5)])
def test_cohort_size_is_floor(m, rate, size):
    sampler = ClientSampler(m, rate)
    assert sampler.cohort_size == size
    for t in range(3):
        cohort = sampler.sample(t, 0)
        assert cohort.numel() == size
        assert cohort.tolist() == sorted(set(cohort.tolist()))
        assert all(0 <= i < m for i in cohort.tolist())


def test_client_inclusion_is_uniform():
    m, rate, rounds = 10, 0.3, 3000
    sampler = ClientSampler(m, rate)
    freq = torch.zeros(m)
    for t in range(rounds):
        freq[sampler.sample(t, 1)] += 1
    assert freq.sum() == 3 * rounds
    assert chi_square(freq, torch.full((m,), rounds * 0.3)) < 27.9  # 99.9% quantile, 9 dof


def test_poisson_client_sampling():
    m, rate, rounds = 20, 0.25, 2000
    sampler = ClientSampler(m, rate, "poisson")
    sizes, freq = [], torch.zeros(m)
    for t in range(rounds):
        cohort = sampler.sample(t, 2)
        assert cohort.tolist() == sorted(set(cohort.tolist()))
        sizes.append(cohort.numel())
        freq[cohort] += 1
    sizes = torch.tensor(sizes, dtype=torch.float64)
    assert float(sizes.mean()) == pytest.approx(m * rate, abs=0.15)
    assert float(sizes.var()) == pytest.approx(m * rate * (1 - rate), rel=0.15)
    z = (freq - rounds * rate) / math.sqrt(rounds * rate * (1 - rate))
    assert z.abs().max() < 4.0


@pytest.mark.parametrize("scheme", ["fixed", "poisson"])
def test_random_cohorts_are_reproducible_from_round_and_seed_and_differ_across_rounds(scheme):
    """The cohort of round t is a function of (t, seed): the same from a fresh sampler, in any order of rounds (as a
    resumed run asks for it), and another one in other rounds and under other seeds."""
    sampler = ClientSampler(20, 0.3, scheme)
    forward = [sampler.sample(t, 5).tolist() for t in range(12)]
    backward = [ClientSampler(20, 0.3, scheme).sample(t, 5).tolist() for t in reversed(range(12))][::-1]
    assert forward == backward
    assert len({tuple(c) for c in forward}) >= 10  # rounds draw different cohorts
    assert [sampler.sample(t, 6).tolist() for t in range(12)] != forward  # so do seeds
    assert sampler.sample(3, 5).tolist() != sampler.sample(4, 5).tolist()


def test_random_cohorts_are_charged_their_sampling_probability():
    fixed, poisson = ClientSampler(10, 0.3), ClientSampler(10, 0.3, "poisson")
    for t in (0, 1, 7):
        assert fixed.participation(t) == pytest.approx(0.3) and poisson.participation(t) == 0.3
        assert fixed.cohort(t) == Cohort.fixed(10, 3)
        assert poisson.cohort(t) == Cohort.poisson(10, 0.3)


# -- clients: round robin ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("m, rate", [(10, 0.3), (7, 0.5), (6, 0.5), (5, 1.0), (9, 0.4), (12, 0.25)])
def test_round_robin_cohorts_cycle_in_id_order(m, rate):
    sampler = ClientSampler(m, rate, "round_robin")
    n = sampler.cohort_size
    position = 0  # the next client in the cycle 0, 1, ..., m - 1, 0, 1, ...
    for t in range(3 * m):
        expected = sorted({(position + j) % m for j in range(n)})
        assert sampler.sample(t, 0).tolist() == expected, t
        assert sampler.sample(t, 123).tolist() == expected  # a schedule: no randomness
        position = (position + n) % m


@pytest.mark.parametrize("m, rate", [(10, 0.3), (7, 0.5), (6, 0.5), (5, 1.0), (9, 0.4), (11, 0.2)])
def test_round_robin_client_0_takes_part_at_least_as_often_as_any_client(m, rate):
    """The accounting charges client 0's rounds (participation 1 exactly when client 0 is in the cohort): sound only
    if no client takes part more often than client 0 over any prefix of rounds."""
    sampler = ClientSampler(m, rate, "round_robin")
    taken = torch.zeros(m)
    charged = 0
    for t in range(4 * m + 3):
        cohort = sampler.sample(t, 0)
        taken[cohort] += 1
        assert sampler.participation(t) == (1.0 if 0 in cohort.tolist() else 0.0)
        charged += sampler.participation(t)
        assert taken[0] == taken.max() == charged, (t, taken)
        assert sampler.cohort(t) == Cohort.scheduled(m, sampler.cohort_size, sampler.cohort_size,
                                                    sampler.participation(t) > 0)


# -- clients: disjoint batches -------------------------------------------------------------------------------------
@pytest.mark.parametrize("m, rate", [(10, 0.3), (7, 0.5), (6, 0.5), (5, 1.0), (9, 0.4), (12, 0.25)])
def test_disjoint_every_client_takes_part_exactly_once_per_epoch(m, rate):
    sampler = ClientSampler(m, rate, "disjoint")
    n = sampler.cohort_size
    epoch = math.ceil(m / n)
    assert sampler.epoch == epoch
    partitions = []
    for start in range(0, 4 * epoch, epoch):
        cohorts = [sampler.sample(t, 3).tolist() for t in range(start, start + epoch)]
        members = [i for cohort in cohorts for i in cohort]
        assert sorted(members) == list(range(m)), cohorts  # every client exactly once
        assert all(len(c) == n for c in cohorts[:-1]) and 1 <= len(cohorts[-1]) <= n
        assert all(c == sorted(c) for c in cohorts)
        assert cohorts == [ClientSampler(m, rate, "disjoint").sample(t, 3).tolist()
                           for t in range(start, start + epoch)]  # reproducible from (round, seed)
        partitions.append(cohorts)
    if epoch > 1 and m > 3:
        assert len({str(p) for p in partitions}) > 1  # a fresh random partition each epoch


@pytest.mark.parametrize("m, rate", [(10, 0.3), (7, 0.5), (5, 1.0), (12, 0.25)])
def test_disjoint_participation_is_one_exactly_at_epoch_starts(m, rate):
    sampler = ClientSampler(m, rate, "disjoint")
    epoch = sampler.epoch
    for t in range(5 * epoch):
        assert sampler.participation(t) == (1.0 if t % epoch == 0 else 0.0), t
        cohort = sampler.cohort(t)
        assert cohort.probability == sampler.participation(t)
        assert cohort.min_size == min(m - (epoch - 1) * sampler.cohort_size, sampler.cohort_size)  # the last batch


def test_disjoint_partitions_are_uniform():
    """Over many epochs each client is equally likely to be in each round's batch."""
    m, rate, epochs = 6, 0.34, 600  # batches of 2, epochs of 3 rounds
    sampler = ClientSampler(m, rate, "disjoint")
    freq = torch.zeros(sampler.epoch, m)
    for e in range(epochs):
        for position in range(sampler.epoch):
            freq[position, sampler.sample(e * sampler.epoch + position, 0)] += 1
    expected = epochs * sampler.cohort_size / m
    for position in range(sampler.epoch):
        assert chi_square(freq[position], torch.full((m,), expected)) < 20.5  # 99.9% quantile, 5 dof


# -- clients: partitioned Poisson (amplified BandMF) -----------------------------------------------------------------
@pytest.mark.parametrize("m, rate, b", [(10, 0.1, 4), (8, 0.125, 4), (9, 0.2, 5), (7, 0.5, 1)])
def test_partitioned_poisson_draws_only_the_rounds_partition_each_member_with_probability_l_b(m, rate, b):
    """Round t's cohort lies in partition t mod b (clients t mod b, t mod b + b, ...), so a client's rounds are a
    multiple of b apart; each member is in with frequency q = l b (chi-square over the members' counts and the
    complement, 600 draws per partition, fixed seeds); the charge is partition 0's: q at rounds 0, b, 2b, ..."""
    sampler = ClientSampler(m, rate, "partitioned_poisson", partitions=b)
    q = rate * b
    assert sampler.partition_rate == pytest.approx(q) and sampler.cohort_size == round(rate * m)
    taken = torch.zeros(m)
    draws = 600
    for t in range(b * draws):
        cohort = sampler.sample(t, 7)
        assert all(i % b == t % b for i in cohort.tolist()), (t, cohort)
        taken[cohort] += 1
    expected = draws * q
    if q < 1:
        observed = torch.cat([taken, draws - taken])
        statistic = chi_square(observed, torch.cat([torch.full((m,), expected), torch.full((m,), draws - expected)]))
        assert statistic < stats.chi2.ppf(0.999, m)  # m independent Binomial(600, q) counts
    else:
        assert bool((taken == draws).all())
    for t in range(3 * b):
        assert sampler.participation(t) == (pytest.approx(q) if t % b == 0 else 0.0)
        charged = Cohort.poisson(-(-m // b), sampler.partition_rate) if t % b == 0 else \
            Cohort.scheduled(m, sampler.cohort_size, 1, False)
        assert sampler.cohort(t) == charged
    assert sampler.sample(3, 7).tolist() == ClientSampler(m, rate, "partitioned_poisson", partitions=b).sample(3, 7) \
        .tolist()  # from (key, round) alone


def test_partitioned_poisson_refuses_a_rate_above_one_over_b_and_partitions_elsewhere():
    with pytest.raises(ConfigError) as err:
        ClientSampler(8, 0.3, "partitioned_poisson", partitions=4)  # q = 1.2
    assert err.value.field == "algorithm.client_rate" and "1 / 4" in str(err.value)
    with pytest.raises(ConfigError) as err:
        ClientSampler(8, 0.1, "partitioned_poisson", partitions=9)  # more partitions than clients
    assert err.value.field == "algorithm.bands"
    with pytest.raises(ValueError, match="partitions"):
        ClientSampler(8, 0.25, "poisson", partitions=2)


def test_client_sampler_bad_arguments():
    for rate in (0.0, 1.01, -1):
        with pytest.raises(ConfigError) as err:
            ClientSampler(10, rate)
        assert err.value.field == "algorithm.client_rate"
    with pytest.raises(ConfigError, match="algorithm.client_rate") as err:
        ClientSampler(10, 0.05)  # floor(0.5) = 0 clients per round
    assert err.value.field == "algorithm.client_rate"
    ClientSampler(10, 0.05, "poisson")  # Poisson may draw an empty cohort: allowed
    for scheme in ("round_robin", "disjoint"):
        with pytest.raises(ConfigError) as err:
            ClientSampler(10, 0.05, scheme)  # a schedule needs at least one client per round
        assert err.value.field == "algorithm.client_rate"
    with pytest.raises(ConfigError) as err:
        ClientSampler(10, 0.5, "random")
    assert err.value.field == "algorithm.client_sampling"


def test_one_counting_rule_for_samplers_and_accountants():
    """floor(rate n) with a float tolerance: 0.29 * 100 = 28.999... samples 29 clients, and the accountant charges 29."""
    from dpfl.accounting.dp_scaffold import dp_scaffold_round_events
    from dpfl.counts import sampled_count

    assert sampled_count(0.29, 100) == 29 and sampled_count(0.2, 7) == 1 and sampled_count(0.999, 1) == 0
    assert ClientSampler(100, 0.29).cohort_size == 29
    assert int(RecordSampler(0.29).batch_sizes(torch.tensor([100]))[0]) == 29
    events = dp_scaffold_round_events(100, 100, 0.29, 0.29, 1, 5.0)
    assert events["server"].probability == 0.29  # 29 of 100 clients
    assert events["server"].event.event.sample_size == 29


# -- clients: the audit's independent trials -------------------------------------------------------------------------
@pytest.mark.parametrize("scheme, m, rate, partitions", [("fixed", 10, 0.3, 1), ("poisson", 10, 0.3, 1),
                                                         ("disjoint", 6, 0.34, 1),
                                                         ("partitioned_poisson", 10, 0.1, 4)])
def test_independent_cohorts_have_the_samplers_law_in_every_trial(scheme, m, rate, partitions):
    """``independent_cohorts`` (every trial's cohort in one draw) against ``sample``'s law over 3000 trials (fixed
    seeds): fixed-size rows hold exactly n distinct clients, each client in n / M of them (chi-square, 99.9%), and
    every n-subset equally likely (pairs: chi-square over the 45 pairs of n = 3 of 10); Poisson rows have the
    Binomial(M, l) size and each client l of them; a disjoint trial's rounds of one epoch partition the clients and
    each round's batch is uniform; partitioned Poisson rows lie in partition t mod b, each member at q = l b. A
    round robin (and a full cohort) is ``sample``'s schedule in every trial; other keys and rounds draw others."""
    sampler = ClientSampler(m, rate, scheme, partitions=partitions)
    trials, n = 3000, sampler.cohort_size
    rows = sampler.independent_cohorts(5, trials, 11)
    assert rows.shape == (trials, m) and rows.dtype == torch.bool
    assert not torch.equal(rows, sampler.independent_cohorts(5, trials, 12))
    freq = rows.sum(0).double()
    if scheme == "fixed":
        assert bool((rows.sum(1) == n).all())
        assert chi_square(freq, torch.full((m,), trials * n / m)) < stats.chi2.ppf(0.999, m - 1)
        pairs = (rows.double().T @ rows.double())[torch.triu_indices(m, m, 1).unbind()]
        expected = trials * n * (n - 1) / (m * (m - 1))
        assert chi_square(pairs, torch.full_like(pairs, expected)) < stats.chi2.ppf(0.999, pairs.numel() - 1)
    elif scheme == "poisson":
        sizes = rows.sum(1).double()
        assert float(sizes.mean()) == pytest.approx(m * rate, abs=0.1)
        assert float(sizes.var()) == pytest.approx(m * rate * (1 - rate), rel=0.1)
        assert float(((freq - trials * rate) / math.sqrt(trials * rate * (1 - rate))).abs().max()) < 4.0
    elif scheme == "disjoint":
        start = 5 - 5 % sampler.epoch
        epoch = [sampler.independent_cohorts(t, trials, 11) for t in range(start, start + sampler.epoch)]
        assert torch.equal(epoch[5 - start], rows)  # the epoch's permutation: drawn at its first round
        assert bool((torch.stack(epoch).sum(0) == 1).all())  # each trial's epoch covers every client once
        assert chi_square(freq, torch.full((m,), trials * n / m)) < stats.chi2.ppf(0.999, m - 1)
    else:
        q = sampler.partition_rate
        assert bool((freq[torch.arange(m) % partitions != 5 % partitions] == 0).all())
        members = freq[torch.arange(m) % partitions == 5 % partitions]
        assert float(((members - trials * q) / math.sqrt(trials * q * (1 - q))).abs().max()) < 4.0
    for scheduled in (ClientSampler(10, 0.3, "round_robin"), ClientSampler(10, 1.0)):
        expected = torch.zeros(10, dtype=torch.bool)
        expected[scheduled.sample(4, 11)] = True
        assert torch.equal(scheduled.independent_cohorts(4, 7, 11), expected.expand(7, 10))
