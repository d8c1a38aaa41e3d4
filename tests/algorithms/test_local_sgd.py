"""LocalSGD (FedAvg, FedSGD, SCAFFOLD, SCAFFOLD-warm and their DP versions) against hand-written loops."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from dp_accounting import dp_event

from dpfl.algorithms.local_sgd import ALGORITHMS, CohortData, LocalSGD, build_local_sgd
from dpfl.data.federated import ClientArrays
from dpfl.engine.grads import CohortGradients
from dpfl.engine.noise import GaussianMechanism
from dpfl.engine.sampling import ClientSampler, RecordSampler
from dpfl.errors import ConfigError
from dpfl.models import build_model

FEATURES, CLASSES = 3, 3
COUNTS = [8, 8, 8, 8]


def make_data(counts=COUNTS, seed=0) -> ClientArrays:
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(n, FEATURES)).astype(np.float32) + i for i, n in enumerate(counts)]  # heterogeneous
    ys = [rng.integers(0, CLASSES, size=n) for n in counts]
    return ClientArrays.from_lists(xs, ys)


def make_grads(seed=0):
    torch.manual_seed(seed)
    return CohortGradients(build_model("logreg", FEATURES, CLASSES))


def cohort_data(arrays, ids):
    return CohortData(arrays.x[ids], arrays.y[ids], arrays.counts[ids])


def full_gradient(grads, theta, x, y, weight_decay=0.0):
    """Gradient of the mean cross-entropy of one client's records at theta [P] (plus the L2 term)."""
    theta = theta.detach().clone().requires_grad_()
    params = grads.unflatten(theta)
    logits = x @ params["0.weight"].T + params["0.bias"]
    loss = F.cross_entropy(logits, y) + 0.5 * weight_decay * theta.square().sum()
    return torch.autograd.grad(loss, theta)[0]


def client_records(arrays, i):
    n = int(arrays.counts[i])
    return arrays.x[i, :n], arrays.y[i, :n]


def algorithm(**kwargs):
    defaults = dict(local_steps=3, lr=0.3, sampler=RecordSampler(1.0), mechanism=GaussianMechanism(0.0))
    defaults.update(kwargs)
    return LocalSGD(**defaults)


def random_state(alg, grads, num_clients, seed=3):
    g = torch.Generator().manual_seed(seed)
    state = alg.init_state(0.5 * torch.randn(grads.num_params, generator=g), num_clients)
    if alg.control_variates:
        state.client_c = 0.2 * torch.randn(num_clients, grads.num_params, generator=g)
        state.c = state.client_c.mean(0)
    return state


# -- FedAvg --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_fedavg_full_batch_round_equals_hand_loop(weight_decay):
    arrays, grads = make_data(), make_grads()
    alg = algorithm(global_lr=0.7, weight_decay=weight_decay)
    state = random_state(alg, grads, 4)
    x0 = state.x.clone()
    ids = torch.tensor([0, 2, 3])
    dy, dc, events = alg.client_round(state, ids, cohort_data(arrays, ids), grads, torch.Generator().manual_seed(0),
                                      warm=False)
    assert dc is None and events == [dp_event.NonPrivateDpEvent()] * 3
    eta_l = 0.3 / (1.0 * 3)
    assert alg.local_lr == pytest.approx(eta_l)
    expected = []
    for i in ids.tolist():
        y = x0.clone()
        for _ in range(3):
            y = y - eta_l * full_gradient(grads, y, *client_records(arrays, i), weight_decay)
        expected.append(y - x0)
    torch.testing.assert_close(dy, torch.stack(expected), atol=1e-5, rtol=1e-5)
    alg.server_update(state, ids, dy, dc)
    torch.testing.assert_close(state.x, x0 + 0.7 * torch.stack(expected).mean(0), atol=1e-5, rtol=1e-5)


def test_fedavg_minibatches_equal_hand_loop_with_reseeded_generator():
    """s < 1: the hand loop draws the same minibatches by replaying the sampler on an identically seeded generator."""
    arrays, grads = make_data(), make_grads()
    sampler = RecordSampler(0.25)  # 2 of 8 records
    alg = algorithm(sampler=sampler, local_steps=4, lr=0.2)
    state = random_state(alg, grads, 4)
    x0 = state.x.clone()
    ids = torch.tensor([0, 1, 2, 3])
    data = cohort_data(arrays, ids)
    dy, _, _ = alg.client_round(state, ids, data, grads, torch.Generator().manual_seed(11), warm=False)
    eta_l = 0.2 / (0.25 * 4)
    g = torch.Generator().manual_seed(11)
    ys = [x0.clone() for _ in ids]
    for _ in range(4):
        indices, mask = sampler.sample(data.counts, g)
        assert mask.sum(1).tolist() == [2, 2, 2, 2]
        for c in range(4):
            batch = indices[c][mask[c] > 0]
            ys[c] = ys[c] - eta_l * full_gradient(grads, ys[c], data.x[c, batch], data.y[c, batch])
    torch.testing.assert_close(dy, torch.stack(ys) - x0, atol=1e-5, rtol=1e-5)
    # and the minibatches matter: full batches give another update
    full, _, _ = algorithm(local_steps=4, lr=0.2 * 0.25).client_round(state, ids, data, grads,
                                                                      torch.Generator().manual_seed(11), False)
    assert not torch.allclose(full, dy, atol=1e-4)


def test_clipping_is_applied_without_noise():
    arrays, grads = make_data(), make_grads()
    ids = torch.tensor([1])
    x0 = torch.zeros(grads.num_params)
    alg = algorithm(local_steps=1, lr=1.0, clip=1e-3)
    state = alg.init_state(x0, 4)
    dy, _, _ = alg.client_round(state, ids, cohort_data(arrays, ids), grads, torch.Generator().manual_seed(0), False)
    # one step of eta_l = 1 along the mean of the 8 clipped per-example gradients
    x, y = client_records(arrays, 1)
    clipped = torch.zeros(grads.num_params)
    for j in range(8):
        g = full_gradient(grads, x0, x[j : j + 1], y[j : j + 1])
        clipped += g / max(1.0, float(g.norm()) / 1e-3)
    torch.testing.assert_close(dy[0], -clipped / 8, atol=1e-8, rtol=1e-5)
    assert float(dy.norm()) <= 1e-3 * (1 + 1e-5)
    assert float(full_gradient(grads, x0, x, y).norm()) > 0.1  # unclipped, the step would be much longer


# -- SCAFFOLD ------------------------------------------------------------------------------------------------------
def test_scaffold_full_batch_round_equals_hand_loop_and_control_variate_identity():
    arrays, grads = make_data(), make_grads()
    alg = algorithm(control_variates=True, local_steps=3, lr=0.3)
    state = random_state(alg, grads, 4)
    x0, c0, ci0 = state.x.clone(), state.c.clone(), state.client_c.clone()
    ids = torch.tensor([1, 3])
    dy, dc, _ = alg.client_round(state, ids, cohort_data(arrays, ids), grads, torch.Generator().manual_seed(0), False)
    eta_l = alg.local_lr
    for row, i in enumerate(ids.tolist()):
        y, hs = x0.clone(), []
        for _ in range(3):
            h = full_gradient(grads, y, *client_records(arrays, i))
            hs.append(h)
            y = y - eta_l * (h - ci0[i] + c0)  # Alg. 1 line 10
        torch.testing.assert_close(dy[row], y - x0, atol=1e-5, rtol=1e-5)
        c_plus = ci0[i] - c0 + (x0 - y) / (3 * eta_l)  # Alg. 1 line 12
        torch.testing.assert_close(c_plus, torch.stack(hs).mean(0), atol=1e-4, rtol=1e-4)  # == mean of the K H~
        torch.testing.assert_close(ci0[i] + dc[row], torch.stack(hs).mean(0), atol=1e-5, rtol=1e-5)


def test_dp_scaffold_control_variate_identity_with_noise():
    arrays, grads = make_data([8, 6, 10, 8]), make_grads()
    alg = algorithm(control_variates=True, sampler=RecordSampler(0.5), mechanism=GaussianMechanism(2.0), clip=0.5,
                    local_steps=5, lr=0.1, global_lr=1.3)
    state = random_state(alg, grads, 4)
    x0, c0, ci0 = state.x.clone(), state.c.clone(), state.client_c.clone()
    ids = torch.tensor([0, 1, 2])
    dy, dc, events = alg.client_round(state, ids, cohort_data(arrays, ids), grads, torch.Generator().manual_seed(5),
                                      False)
    assert events == [dp_event.GaussianDpEvent(2.0)] * 5
    y = x0 + dy
    c_plus = ci0[ids] - c0 + (x0 - y) / (5 * alg.local_lr)  # Alg. 1 line 12
    alg.server_update(state, ids, dy, dc)
    torch.testing.assert_close(state.client_c[ids], c_plus, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state.client_c[3], ci0[3])  # not sampled: unchanged
    torch.testing.assert_close(state.c, state.client_c.mean(0), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(state.x, x0 + 1.3 * dy.mean(0))


def test_server_control_variate_stays_the_mean_over_rounds():
    arrays, grads = make_data([8, 6, 10, 8]), make_grads()
    alg = build_local_sgd("dp-scaffold", local_steps=2, lr=0.2, sampler=RecordSampler(0.5), client_rate=0.5,
                          clip=1.0, noise_multiplier=1.0)
    state = alg.init_state(grads.initial_params(), 4)
    clients, g = ClientSampler(4, 0.5), torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(6):
        ids = clients.sample(g)
        seen |= set(ids.tolist())
        dy, dc, _ = alg.client_round(state, ids, cohort_data(arrays, ids), grads, g, False)
        alg.server_update(state, ids, dy, dc)
        torch.testing.assert_close(state.c, state.client_c.mean(0), atol=1e-6, rtol=1e-5)
    assert seen == {0, 1, 2, 3} and state.c.abs().max() > 0


# -- FedSGD --------------------------------------------------------------------------------------------------------
def test_fedsgd_moves_x_by_minus_eta_l_k_mean_gradient():
    arrays, grads = make_data(), make_grads()
    alg = build_local_sgd("fedsgd", local_steps=4, lr=0.5, sampler=RecordSampler(1.0), client_rate=0.5, clip=None,
                          noise_multiplier=0.0)
    assert not alg.move_locally and not alg.control_variates
    state = random_state(alg, grads, 4)
    x0 = state.x.clone()
    ids = torch.tensor([0, 2])
    dy, _, events = alg.client_round(state, ids, cohort_data(arrays, ids), grads, torch.Generator().manual_seed(0),
                                     False)
    assert len(events) == 4
    h = torch.stack([full_gradient(grads, x0, *client_records(arrays, i)) for i in ids.tolist()])
    eta_l = 0.5 / (1.0 * 4)
    torch.testing.assert_close(dy, -eta_l * 4 * h, atol=1e-5, rtol=1e-5)
    alg.server_update(state, ids, dy, None)
    torch.testing.assert_close(state.x, x0 - eta_l * 4 * h.mean(0), atol=1e-5, rtol=1e-5)


def test_dp_fedsgd_gradients_all_at_x():
    """With noise and minibatches, FedSGD's K noisy gradients are all evaluated at x: replay them."""
    arrays, grads = make_data(), make_grads()
    sampler = RecordSampler(0.5)
    alg = build_local_sgd("dp-fedsgd", local_steps=3, lr=0.4, sampler=sampler, client_rate=0.5, clip=0.7,
                          noise_multiplier=1.5)
    state = random_state(alg, grads, 4)
    ids = torch.tensor([1, 2])
    data = cohort_data(arrays, ids)
    dy, _, _ = alg.client_round(state, ids, data, grads, torch.Generator().manual_seed(9), False)
    g = torch.Generator().manual_seed(9)
    theta = state.x.unsqueeze(0).expand(2, -1)
    total = torch.zeros(2, grads.num_params)
    for _ in range(3):
        indices, mask = sampler.sample(data.counts, g)
        xb, yb = data.batch(indices)
        mean = grads.clipped_sum(theta, xb, yb, mask, 0.7) / 4
        noise = torch.randn(mean.shape, generator=g)
        total += mean + 1.5 * (2 * 0.7 / 4) * noise  # sensitivity 2C/b, b = 4
    torch.testing.assert_close(dy, -alg.local_lr * total, atol=1e-5, rtol=1e-5)


# -- noise inside a local step -------------------------------------------------------------------------------------
def test_noisy_gradient_noise_std_is_z_times_2c_over_b():
    rng = np.random.default_rng(0)
    counts = [40, 10]
    features = 300  # P = 903 coordinates per client
    xs = [rng.normal(size=(n, features)).astype(np.float32) for n in counts]
    ys = [rng.integers(0, 3, size=n) for n in counts]
    arrays = ClientArrays.from_lists(xs, ys)
    torch.manual_seed(0)
    grads = CohortGradients(build_model("logreg", features, 3))
    sampler = RecordSampler(0.5)  # b = 20 and 5
    z, clip = 3.0, 0.2
    alg = LocalSGD(local_steps=1, lr=0.1, sampler=sampler, mechanism=GaussianMechanism(z), clip=clip)
    ids = torch.tensor([0, 1])
    data = cohort_data(arrays, ids)
    point = torch.zeros(2, grads.num_params)
    noisy, event = alg.noisy_gradient(grads, point, data, torch.Generator().manual_seed(4))
    assert event == dp_event.GaussianDpEvent(z)
    g = torch.Generator().manual_seed(4)
    indices, mask = sampler.sample(data.counts, g)
    xb, yb = data.batch(indices)
    clean = grads.clipped_sum(point, xb, yb, mask, clip) / torch.tensor([[20.0], [5.0]])
    std = (noisy - clean).std(dim=1)
    torch.testing.assert_close(std, torch.tensor([z * 2 * clip / 20, z * 2 * clip / 5]), rtol=0.08, atol=0)


# -- warm start ----------------------------------------------------------------------------------------------------
def test_warm_round_leaves_x_and_sets_client_control_variates():
    arrays, grads = make_data(), make_grads()
    alg = build_local_sgd("scaffold-warm", local_steps=3, lr=0.3, sampler=RecordSampler(1.0), client_rate=0.5,
                          clip=None, noise_multiplier=0.0)
    assert alg.warm_rounds == 8
    state = alg.init_state(0.1 * torch.ones(grads.num_params), 4)
    x0 = state.x.clone()
    ids = torch.tensor([0, 3])
    dy, dc, _ = alg.client_round(state, ids, cohort_data(arrays, ids), grads, torch.Generator().manual_seed(0),
                                 warm=True)
    assert torch.equal(dy, torch.zeros_like(dy))
    alg.server_update(state, ids, dy, dc)
    assert torch.equal(state.x, x0)
    for i in (0, 3):
        torch.testing.assert_close(state.client_c[i], full_gradient(grads, x0, *client_records(arrays, i)),
                                   atol=1e-5, rtol=1e-5)
    assert torch.equal(state.client_c[1], torch.zeros(grads.num_params))
    assert torch.equal(state.client_c[2], torch.zeros(grads.num_params))
    torch.testing.assert_close(state.c, state.client_c.sum(0) / 4)
    # a second warm round on a client already seen overwrites its c_i (it is the mean of fresh H~ at x0)
    ids = torch.tensor([0])
    dy, dc, _ = alg.client_round(state, ids, cohort_data(arrays, ids), grads, torch.Generator().manual_seed(1), True)
    alg.server_update(state, ids, dy, dc)
    torch.testing.assert_close(state.client_c[0], full_gradient(grads, x0, *client_records(arrays, 0)),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state.c, state.client_c.mean(0), atol=1e-6, rtol=1e-6)
    assert torch.equal(state.x, x0)


def test_empty_cohort_update_is_a_no_op():
    grads = make_grads()
    alg = algorithm(control_variates=True)
    state = random_state(alg, grads, 4)
    x0, c0 = state.x.clone(), state.c.clone()
    alg.server_update(state, torch.tensor([], dtype=torch.long), torch.zeros(0, grads.num_params),
                      torch.zeros(0, grads.num_params))
    assert torch.equal(state.x, x0) and torch.equal(state.c, c0)


# -- names and validation ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, control_variates, move_locally, warm, private",
    [
        ("fedavg", False, True, False, False),
        ("fedsgd", False, False, False, False),
        ("scaffold", True, True, False, False),
        ("scaffold-warm", True, True, True, False),
        ("dp-fedavg", False, True, False, True),
        ("dp-fedsgd", False, False, False, True),
        ("dp-scaffold", True, True, False, True),
        ("dp-scaffold-warm", True, True, True, True),
    ],
)
def test_build_local_sgd_switches(name, control_variates, move_locally, warm, private):
    sampler = RecordSampler(0.2)
    alg = build_local_sgd(name, local_steps=5, lr=0.4, sampler=sampler, client_rate=0.3, clip=2.0,
                          noise_multiplier=1.5, global_lr=0.9, weight_decay=5e-3)
    assert alg.control_variates is control_variates
    assert alg.move_locally is move_locally
    assert alg.warm_rounds == (13 if warm else 0)  # round(4 / 0.3) = round(13.33)
    assert alg.mechanism == GaussianMechanism(1.5 if private else 0.0)
    assert alg.clip == (2.0 if private else None)
    assert alg.step_noise_event == (dp_event.GaussianDpEvent(1.5) if private else dp_event.NonPrivateDpEvent())
    assert (alg.local_steps, alg.lr, alg.global_lr, alg.weight_decay, alg.sampler) == (5, 0.4, 0.9, 5e-3, sampler)
    assert alg.local_lr == pytest.approx(0.4 / (0.2 * 5))
    assert set(ALGORITHMS) == {"fedavg", "fedsgd", "scaffold", "scaffold-warm", "dp-fedavg", "dp-fedsgd",
                               "dp-scaffold", "dp-scaffold-warm"}


@pytest.mark.parametrize("rate, warm", [(0.2, 20), (0.05, 80), (1.0, 4), (0.125, 32)])
def test_warm_rounds_is_round_4_over_l(rate, warm):
    alg = build_local_sgd("dp-scaffold-warm", local_steps=1, lr=0.1, sampler=RecordSampler(0.5), client_rate=rate,
                          clip=1.0, noise_multiplier=1.0)
    assert alg.warm_rounds == warm


@pytest.mark.parametrize("name", [n for n in ALGORITHMS if n.startswith("dp-")])
def test_dp_names_need_clip_and_noise(name):
    kwargs = dict(local_steps=1, lr=0.1, sampler=RecordSampler(0.5), client_rate=0.5)
    with pytest.raises(ConfigError) as err:
        build_local_sgd(name, clip=None, noise_multiplier=1.0, **kwargs)
    assert err.value.field == "algorithm.clip"
    with pytest.raises(ConfigError) as err:
        build_local_sgd(name, clip=1.0, noise_multiplier=0.0, **kwargs)
    assert err.value.field == "algorithm.noise_multiplier"


def test_bad_name_and_bad_switches():
    with pytest.raises(ConfigError) as err:
        build_local_sgd("fedprox", local_steps=1, lr=0.1, sampler=RecordSampler(0.5), client_rate=0.5, clip=None,
                        noise_multiplier=0.0)
    assert err.value.field == "algorithm.name"
    with pytest.raises(ConfigError) as err:
        algorithm(mechanism=GaussianMechanism(1.0))  # noise without a clip norm
    assert err.value.field == "algorithm.clip"
    for field, kwargs in [("algorithm.local_steps", {"local_steps": 0}), ("algorithm.lr", {"lr": 0.0}),
                          ("algorithm.global_lr", {"global_lr": -1.0}), ("algorithm.clip", {"clip": 0.0}),
                          ("algorithm.weight_decay", {"weight_decay": -0.1}),
                          ("algorithm.local_steps", {"local_steps": 2.5})]:
        with pytest.raises(ConfigError) as err:
            algorithm(**kwargs)
        assert err.value.field == field


def test_cohort_data_batch_gathers_each_clients_records():
    arrays = make_data([3, 5])
    data = cohort_data(arrays, torch.tensor([1, 0]))
    indices = torch.tensor([[4, 0], [2, 1]])
    xb, yb = data.batch(indices)
    assert torch.equal(xb[0, 0], arrays.x[1, 4]) and torch.equal(xb[0, 1], arrays.x[1, 0])
    assert torch.equal(xb[1, 0], arrays.x[0, 2]) and torch.equal(xb[1, 1], arrays.x[0, 1])
    assert yb.tolist() == [[int(arrays.y[1, 4]), int(arrays.y[1, 0])], [int(arrays.y[0, 2]), int(arrays.y[0, 1])]]


# -- the non-private median clipping heuristic ---------------------------------------------------------------------
def test_median_heuristic_clips_at_each_clients_median_and_is_non_private():
    arrays, grads = make_data([8, 6, 10, 8]), make_grads()
    sampler = RecordSampler(0.5)
    with pytest.warns(UserWarning, match="NOT differentially private"):
        alg = algorithm(sampler=sampler, clip=1.0, clip_heuristic="median-nonprivate", local_steps=1)
    assert alg.step_noise_event == dp_event.NonPrivateDpEvent()
    ids = torch.tensor([0, 1, 2])
    data = cohort_data(arrays, ids)
    point = 0.3 * torch.ones(3, grads.num_params)
    mean, event = alg.noisy_gradient(grads, point, data, torch.Generator().manual_seed(2))
    assert event == dp_event.NonPrivateDpEvent()
    indices, mask = sampler.sample(data.counts, torch.Generator().manual_seed(2))
    xb, yb = data.batch(indices)
    for c, b in enumerate([4, 3, 5]):
        norms = grads.example_norms(point, xb, yb, mask)[c, :b]
        median = norms.sort().values[(b - 1) // 2]  # torch's (lower) median
        clipped = grads.clipped_sum(point[c : c + 1], xb[c : c + 1, :b], yb[c : c + 1, :b], mask[c : c + 1, :b],
                                    float(median))
        torch.testing.assert_close(mean[c], clipped[0] / b, atol=1e-6, rtol=1e-5)
    # the fixed clip gives something else
    fixed, _ = algorithm(sampler=sampler, clip=1.0, local_steps=1).noisy_gradient(
        grads, point, data, torch.Generator().manual_seed(2))
    assert not torch.allclose(fixed, mean, atol=1e-5)


def test_clip_heuristic_names():
    with pytest.raises(ConfigError) as err:
        algorithm(clip_heuristic="mean")
    assert err.value.field == "algorithm.clip_heuristic"
    kwargs = dict(local_steps=1, lr=0.1, sampler=RecordSampler(0.5), client_rate=0.5, clip=1.0, noise_multiplier=1.0,
                  clip_heuristic="median-nonprivate")
    assert build_local_sgd("fedavg", **kwargs).clip_heuristic == "fixed"  # non-DP names ignore it
    with pytest.warns(UserWarning):
        alg = build_local_sgd("dp-fedavg", **kwargs)
    assert alg.clip_heuristic == "median-nonprivate" and alg.step_noise_event == dp_event.NonPrivateDpEvent()
