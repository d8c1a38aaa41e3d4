"""LocalSGD (FedAvg, FedSGD, SCAFFOLD, SCAFFOLD-warm and their DP versions) against hand-written loops.

The hand loops reproduce a client's draws exactly from its own streams (``dpfl.engine.randomness``): client i's
minibatch keys in round t are ``ClientStreams(seed, t, [i], "records").uniform([(K, n_i)])`` (a fixed-size batch is
the floor(s n_i) records with the smallest keys, a Poisson batch the records with key < q) and its noise
``ClientStreams(seed, t, [i], "noise").normal((K, P))``.
"""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from dp_accounting import dp_event

from dpfl.algorithms.local_sgd import NAMES, LocalSGD, LocalSGDConfig, build_local_sgd
from dpfl.data.federated import ClientArrays
from dpfl.engine.boundary import Boundary, Delivery
from dpfl.engine.grads import CohortGradients
from dpfl.noise import GaussianMechanism
from dpfl.engine.protocol import ClientContext, ClientData, ServerContext, State
from states import dense
from dpfl.engine.randomness import ClientStreams
from dpfl.engine.sampling import ClientSampler, RecordSampler
from dpfl.errors import ConfigError
from dpfl.models import build_model

FEATURES, CLASSES = 3, 3
COUNTS = [8, 8, 8, 8]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_data(counts=COUNTS, seed=0) -> ClientArrays:
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(n, FEATURES)).astype(np.float32) + i for i, n in enumerate(counts)]  # heterogeneous
    ys = [rng.integers(0, CLASSES, size=n) for n in counts]
    return ClientArrays.from_lists(xs, ys)


def make_grads(seed=0):
    torch.manual_seed(seed)
    return CohortGradients(build_model("logreg", FEATURES, CLASSES))


def client_data(arrays, ids):
    return ClientData(arrays.x[ids], arrays.y[ids], arrays.counts[ids])


def config(**kwargs) -> LocalSGDConfig:
    """A config section with the old builder's defaults (no weight decay) unless given."""
    return LocalSGDConfig(**{"weight_decay": 0.0, **kwargs})


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


def random_state(alg, grads, num_clients, seed=3) -> State:
    g = torch.Generator().manual_seed(seed)
    state = alg.init_state(0.5 * torch.randn(grads.num_params, generator=g), num_clients)
    if alg.control_variates:
        state.clients["c"] = 0.2 * torch.randn(num_clients, grads.num_params, generator=g)
        state.server["c"] = state.clients["c"].mean(0)
    return state


def client_round(alg, state, ids, arrays, grads, t=0, seed=0):
    """One chunk's client work, as the simulator calls it."""
    return alg.client_round(t, state.server, state.rows(ids), client_data(arrays, ids),
                            ClientContext(grads, seed, t, ids))


def deliver(out, population, boundary="plain") -> Delivery:
    return Boundary(boundary).collect([out.messages], population, 0, 0)


def apply_round(alg, state, ids, out, t=0, population=4):
    """What the simulator does with a chunk's output: client state back into the rows, then the server step."""
    for name, rows in out.state.items():
        state.clients[name][ids] = rows
    state.server = alg.server_update(t, state.server, deliver(out, population), ServerContext(0, t))


def records_keys(seed, t, i, steps, n):
    """Client i's minibatch keys of round t: [K, n_i]."""
    return ClientStreams(seed, t, [i], "records").uniform([(steps, n)])[0]


def noise_draws(seed, t, i, steps, num_params):
    """Client i's standard normal noise of round t: [K, P]."""
    return ClientStreams(seed, t, [i], "noise").normal((steps, num_params))[0]


# -- FedAvg --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_fedavg_full_batch_round_equals_hand_loop(weight_decay):
    arrays, grads = make_data(), make_grads()
    alg = algorithm(global_lr=0.7, weight_decay=weight_decay)
    state = random_state(alg, grads, 4)
    x0 = state.server["x"].clone()
    ids = torch.tensor([0, 2, 3])
    out = client_round(alg, state, ids, arrays, grads)
    assert set(out.messages) == {"dy"} and out.state == {} and out.events == [dp_event.NonPrivateDpEvent()] * 3
    dy = out.messages["dy"]
    eta_l = 0.3 / (1.0 * 3)
    assert alg.local_lr == pytest.approx(eta_l)
    expected = []
    for i in ids.tolist():
        y = x0.clone()
        for _ in range(3):
            y = y - eta_l * full_gradient(grads, y, *client_records(arrays, i), weight_decay)
        expected.append(y - x0)
    torch.testing.assert_close(dy, torch.stack(expected), atol=1e-5, rtol=1e-5)
    server = alg.server_update(0, state.server, deliver(out, 4), ServerContext(0, 0))
    torch.testing.assert_close(server["x"], x0 + 0.7 * torch.stack(expected).mean(0), atol=1e-5, rtol=1e-5)
    assert torch.equal(state.server["x"], x0)  # the server step returns a new state, the old one is untouched


def test_fedavg_minibatches_equal_hand_loop_with_each_clients_streams():
    """s < 1: the hand loop draws the same minibatches from each client's own record stream (the floor(s n_i)
    records with the smallest keys at each step)."""
    arrays, grads = make_data(), make_grads()
    sampler = RecordSampler(0.25)  # 2 of 8 records
    alg = algorithm(sampler=sampler, local_steps=4, lr=0.2)
    state = random_state(alg, grads, 4)
    x0 = state.server["x"].clone()
    ids = torch.tensor([0, 1, 2, 3])
    seed, t = 11, 5
    dy = client_round(alg, state, ids, arrays, grads, t=t, seed=seed).messages["dy"]
    eta_l = 0.2 / (0.25 * 4)
    expected = []
    for i in ids.tolist():
        x, y_true = client_records(arrays, i)
        keys = records_keys(seed, t, i, 4, 8)
        y = x0.clone()
        for k in range(4):
            batch = keys[k].argsort()[:2]
            y = y - eta_l * full_gradient(grads, y, x[batch], y_true[batch])
        expected.append(y - x0)
    torch.testing.assert_close(dy, torch.stack(expected), atol=1e-5, rtol=1e-5)
    # and the minibatches matter: full batches give another update
    full = client_round(algorithm(local_steps=4, lr=0.2 * 0.25), state, ids, arrays, grads, t=t, seed=seed)
    assert not torch.allclose(full.messages["dy"], dy, atol=1e-4)
    # another round (or another run seed) draws other minibatches
    assert not torch.allclose(client_round(alg, state, ids, arrays, grads, t=t + 1, seed=seed).messages["dy"], dy,
                              atol=1e-4)
    assert not torch.allclose(client_round(alg, state, ids, arrays, grads, t=t, seed=seed + 1).messages["dy"], dy,
                              atol=1e-4)


# Equal counts: bit-identical. Unequal counts: the same draws, but the chunk's minibatches are padded to its largest
# and ordered by key, so a client's sums round differently: equal to float rounding.
@pytest.mark.parametrize("counts", [[8, 8, 8, 8], [8, 6, 10, 8]])
def test_a_clients_update_does_not_depend_on_who_shares_its_chunk(counts):
    """Per-client streams: client i's minibatches and noise are the same alone, in any chunk, in any position, so its
    messages are bit-identical."""
    arrays, grads = make_data(counts), make_grads()
    alg = algorithm(sampler=RecordSampler(0.5), mechanism=GaussianMechanism(1.0), clip=0.5,
                    local_steps=3, control_variates=True)
    state = random_state(alg, grads, 4)
    whole = client_round(alg, state, torch.tensor([0, 1, 2, 3]), arrays, grads, t=2, seed=7)
    for ids in ([2], [1, 2], [2, 3], [0, 2, 3]):
        part = client_round(alg, state, torch.tensor(ids), arrays, grads, t=2, seed=7)
        row = ids.index(2)
        for name in ("dy", "dc"):
            if len(set(counts)) == 1:
                assert torch.equal(part.messages[name][row], whole.messages[name][2]), (ids, name)
            else:
                torch.testing.assert_close(part.messages[name][row], whole.messages[name][2], rtol=1e-5, atol=1e-7)


def test_clipping_is_applied_without_noise():
    arrays, grads = make_data(), make_grads()
    ids = torch.tensor([1])
    x0 = torch.zeros(grads.num_params)
    alg = algorithm(local_steps=1, lr=1.0, clip=1e-3)
    state = alg.init_state(x0, 4)
    dy = client_round(alg, state, ids, arrays, grads).messages["dy"]
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
    x0, c0, ci0 = state.server["x"].clone(), state.server["c"].clone(), state.clients["c"].clone()
    ids = torch.tensor([1, 3])
    out = client_round(alg, state, ids, arrays, grads)
    assert set(out.messages) == {"dy", "dc"} and set(out.state) == {"c"}
    dy, dc = out.messages["dy"], out.messages["dc"]
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
        torch.testing.assert_close(out.state["c"][row], torch.stack(hs).mean(0), atol=1e-5, rtol=1e-5)
    assert torch.equal(state.clients["c"], ci0)  # client_round returns the new rows; the caller stores them


def test_dp_scaffold_control_variate_identity_with_noise():
    arrays, grads = make_data([8, 6, 10, 8]), make_grads()
    alg = algorithm(control_variates=True, sampler=RecordSampler(0.5), mechanism=GaussianMechanism(2.0), clip=0.5,
                    local_steps=5, lr=0.1, global_lr=1.3)
    state = random_state(alg, grads, 4)
    x0, c0, ci0 = state.server["x"].clone(), state.server["c"].clone(), state.clients["c"].clone()
    ids = torch.tensor([0, 1, 2])
    out = client_round(alg, state, ids, arrays, grads, seed=5)
    assert out.events == [dp_event.GaussianDpEvent(2.0)] * 5
    dy = out.messages["dy"]
    y = x0 + dy
    c_plus = ci0[ids] - c0 + (x0 - y) / (5 * alg.local_lr)  # Alg. 1 line 12
    apply_round(alg, state, ids, out)
    torch.testing.assert_close(state.clients["c"][ids], c_plus, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state.clients["c"][3], ci0[3])  # not sampled: unchanged
    torch.testing.assert_close(state.server["c"], dense(state.clients["c"]).mean(0), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(state.server["x"], x0 + 1.3 * dy.mean(0))


def test_server_control_variate_stays_the_mean_over_rounds():
    arrays, grads = make_data([8, 6, 10, 8]), make_grads()
    alg = build_local_sgd("dp-scaffold", config(local_steps=2, lr=0.2, sample_rate=0.5, clip=1.0,
                                                noise_multiplier=1.0), client_rate=0.5)
    state = alg.init_state(grads.initial_params(), 4)
    clients, seed = ClientSampler(4, 0.5), 0
    seen = set()
    for t in range(6):
        ids = clients.sample(t, seed)
        seen |= set(ids.tolist())
        out = client_round(alg, state, ids, arrays, grads, t=t, seed=seed)
        apply_round(alg, state, ids, out, t)
        torch.testing.assert_close(state.server["c"], dense(state.clients["c"]).mean(0), atol=1e-6, rtol=1e-5)
    assert seen == {0, 1, 2, 3} and state.server["c"].abs().max() > 0


def test_server_update_reads_only_the_sums():
    """Behind secure aggregation (sums only) the server step gives what it gives behind a plain boundary."""
    arrays, grads = make_data([8, 6, 10, 8]), make_grads()
    alg = algorithm(control_variates=True, sampler=RecordSampler(0.5), mechanism=GaussianMechanism(1.0), clip=0.5,
                    global_lr=0.8)
    state = random_state(alg, grads, 4)
    ids = torch.tensor([0, 2, 3])
    out = client_round(alg, state, ids, arrays, grads, seed=1)
    plain, secagg = deliver(out, 4, "plain"), deliver(out, 4, "secagg")
    assert secagg.messages is None and plain.count == secagg.count == 3
    a, b = (alg.server_update(0, state.server, plain, ServerContext(0, 0)),
            alg.server_update(0, state.server, secagg, ServerContext(0, 0)))
    assert all(torch.equal(a[k], b[k]) for k in ("x", "c"))
    torch.testing.assert_close(a["x"], state.server["x"] + 0.8 * out.messages["dy"].mean(0))
    torch.testing.assert_close(a["c"], state.server["c"] + out.messages["dc"].sum(0) / 4)  # 1/M, not 1/|C_t|


# -- FedSGD --------------------------------------------------------------------------------------------------------
def test_fedsgd_moves_x_by_minus_eta_l_k_mean_gradient():
    arrays, grads = make_data(), make_grads()
    alg = build_local_sgd("fedsgd", config(local_steps=4, lr=0.5, sample_rate=1.0), client_rate=0.5)
    assert not alg.move_locally and not alg.control_variates
    state = random_state(alg, grads, 4)
    x0 = state.server["x"].clone()
    ids = torch.tensor([0, 2])
    out = client_round(alg, state, ids, arrays, grads)
    assert len(out.events) == 4
    h = torch.stack([full_gradient(grads, x0, *client_records(arrays, i)) for i in ids.tolist()])
    eta_l = 0.5 / (1.0 * 4)
    torch.testing.assert_close(out.messages["dy"], -eta_l * 4 * h, atol=1e-5, rtol=1e-5)
    server = alg.server_update(0, state.server, deliver(out, 4), ServerContext(0, 0))
    torch.testing.assert_close(server["x"], x0 - eta_l * 4 * h.mean(0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("record_sampling", ["fixed", "poisson"])
def test_dp_fedsgd_gradients_all_at_x(record_sampling):
    """With noise and minibatches, FedSGD's K noisy gradients are all evaluated at x: replay them from each client's
    streams (fixed: the 4 smallest of 8 keys, divided by b = 4, sensitivity 2C/b; Poisson: the keys below q = 0.5,
    divided by the expected size q n = 4, sensitivity C/(q n))."""
    arrays, grads = make_data(), make_grads()
    alg = build_local_sgd("dp-fedsgd", config(local_steps=3, lr=0.4, sample_rate=0.5, record_sampling=record_sampling,
                                              clip=0.7, noise_multiplier=1.5), client_rate=0.5)
    state = random_state(alg, grads, 4)
    ids = torch.tensor([1, 2])
    seed, t = 9, 3
    dy = client_round(alg, state, ids, arrays, grads, t=t, seed=seed).messages["dy"]
    theta = state.server["x"].unsqueeze(0)
    std = 1.5 * (2 * 0.7 / 4 if record_sampling == "fixed" else 0.7 / 4)
    expected = []
    for i in ids.tolist():
        x, y = client_records(arrays, i)
        keys, noise = records_keys(seed, t, i, 3, 8), noise_draws(seed, t, i, 3, grads.num_params)
        total = torch.zeros(grads.num_params)
        for k in range(3):
            batch = keys[k].argsort()[:4] if record_sampling == "fixed" else (keys[k] < 0.5).nonzero().squeeze(1)
            xb, yb = x[batch].unsqueeze(0), y[batch].unsqueeze(0)
            mean = grads.clipped_sum(theta, xb, yb, torch.ones(1, len(batch)), 0.7)[0] / 4
            total += mean + std * noise[k]
        expected.append(-alg.local_lr * total)
    torch.testing.assert_close(dy, torch.stack(expected), atol=1e-5, rtol=1e-5)


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
    data = client_data(arrays, ids)
    point = torch.zeros(2, grads.num_params)
    keys = ClientStreams(4, 0, ids, "records").uniform([(n,) for n in counts])
    normal = ClientStreams(4, 0, ids, "noise").normal((grads.num_params,))
    noisy, event = alg.noisy_gradient(grads, point, data, keys, normal)
    assert event == dp_event.GaussianDpEvent(z)
    indices, mask = sampler.sample(data.counts, keys)
    xb, yb = data.batch(indices)
    clean = grads.clipped_sum(point, xb, yb, mask, clip) / torch.tensor([[20.0], [5.0]])
    std = (noisy - clean).std(dim=1)
    torch.testing.assert_close(std, torch.tensor([z * 2 * clip / 20, z * 2 * clip / 5]), rtol=0.08, atol=0)
    # the noise is exactly the client's standard normal draws scaled by z * 2C / b_i
    torch.testing.assert_close(noisy - clean, normal * torch.tensor([[z * 2 * clip / 20], [z * 2 * clip / 5]]),
                               atol=1e-6, rtol=1e-5)


# -- warm start ----------------------------------------------------------------------------------------------------
def test_warm_round_leaves_x_and_sets_client_control_variates():
    arrays, grads = make_data(), make_grads()
    alg = build_local_sgd("scaffold-warm", config(local_steps=3, lr=0.3, sample_rate=1.0), client_rate=0.5)
    assert alg.warm_rounds == 8
    state = alg.init_state(0.1 * torch.ones(grads.num_params), 4)
    x0 = state.server["x"].clone()
    ids = torch.tensor([0, 3])
    out = client_round(alg, state, ids, arrays, grads, t=0)  # round 0 < warm_rounds: a warm round
    assert torch.equal(out.messages["dy"], torch.zeros_like(out.messages["dy"]))
    apply_round(alg, state, ids, out, 0)
    assert torch.equal(state.server["x"], x0)
    for i in (0, 3):
        torch.testing.assert_close(state.clients["c"][i], full_gradient(grads, x0, *client_records(arrays, i)),
                                   atol=1e-5, rtol=1e-5)
    assert torch.equal(state.clients["c"][1], torch.zeros(grads.num_params))
    assert torch.equal(state.clients["c"][2], torch.zeros(grads.num_params))
    torch.testing.assert_close(state.server["c"], dense(state.clients["c"]).sum(0) / 4)
    # a second warm round on a client already seen overwrites its c_i (it is the mean of fresh H~ at x0)
    ids = torch.tensor([0])
    out = client_round(alg, state, ids, arrays, grads, t=7, seed=1)  # the last warm round
    apply_round(alg, state, ids, out, 7)
    torch.testing.assert_close(state.clients["c"][0], full_gradient(grads, x0, *client_records(arrays, 0)),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state.server["c"], dense(state.clients["c"]).mean(0), atol=1e-6, rtol=1e-6)
    assert torch.equal(state.server["x"], x0)
    # round 8 is the first real round: x moves
    out = client_round(alg, state, ids, arrays, grads, t=8)
    assert out.messages["dy"].abs().max() > 0


def test_empty_cohort_update_is_a_no_op():
    grads = make_grads()
    alg = algorithm(control_variates=True)
    state = random_state(alg, grads, 4)
    x0, c0 = state.server["x"].clone(), state.server["c"].clone()
    delivered = Boundary("plain").collect([], 4, 0, 0)  # what the boundary delivers for an empty cohort
    assert delivered.count == 0
    server = alg.server_update(0, state.server, delivered, ServerContext(0, 0))
    assert torch.equal(server["x"], x0) and torch.equal(server["c"], c0)
    server = alg.server_update(0, state.server, Delivery({"dy": torch.zeros(grads.num_params),
                                                          "dc": torch.zeros(grads.num_params)}, 0, 4),
                                ServerContext(0, 0))
    assert torch.equal(server["x"], x0) and torch.equal(server["c"], c0)


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
    alg = build_local_sgd(name, config(local_steps=5, lr=0.4, sample_rate=0.2, clip=2.0, noise_multiplier=1.5,
                                       global_lr=0.9, weight_decay=5e-3), client_rate=0.3)
    assert alg.control_variates is control_variates
    assert alg.move_locally is move_locally
    assert alg.warm_rounds == (13 if warm else 0)  # round(4 / 0.3) = round(13.33)
    assert alg.mechanism == GaussianMechanism(1.5 if private else 0.0)
    assert alg.clip == (2.0 if private else None)
    assert alg.step_noise_event == (dp_event.GaussianDpEvent(1.5) if private else dp_event.NonPrivateDpEvent())
    assert (alg.local_steps, alg.lr, alg.global_lr, alg.weight_decay, alg.sampler) == \
        (5, 0.4, 0.9, 5e-3, RecordSampler(0.2))
    assert alg.local_lr == pytest.approx(0.4 / (0.2 * 5))
    assert alg.neighboring == "replace_one"
    state = alg.init_state(torch.zeros(7), 4)
    assert set(state.server) == {"x", "c"}
    assert set(state.clients) == ({"c"} if control_variates else set())
    assert set(NAMES) == {"fedavg", "fedsgd", "scaffold", "scaffold-warm", "dp-fedavg", "dp-fedsgd",
                          "dp-scaffold", "dp-scaffold-warm"}


def test_poisson_record_sampling_is_add_remove():
    alg = build_local_sgd("dp-fedavg", config(record_sampling="poisson"), client_rate=0.5)
    assert alg.sampler == RecordSampler(0.2, "poisson") and alg.neighboring == "zero_out"


@pytest.mark.parametrize("rate, warm", [(0.2, 20), (0.05, 80), (1.0, 4), (0.125, 32)])
def test_warm_rounds_is_round_4_over_l(rate, warm):
    alg = build_local_sgd("dp-scaffold-warm", config(local_steps=1, lr=0.1, sample_rate=0.5, clip=1.0,
                                                     noise_multiplier=1.0), client_rate=rate)
    assert alg.warm_rounds == warm


@pytest.mark.parametrize("name", [n for n in NAMES if n.startswith("dp-")])
def test_dp_names_need_clip_and_noise(name):
    kwargs = dict(local_steps=1, lr=0.1, sample_rate=0.5)
    with pytest.raises(ConfigError) as err:
        build_local_sgd(name, config(clip=None, noise_multiplier=1.0, **kwargs), client_rate=0.5)
    assert err.value.field == "algorithm.clip"
    with pytest.raises(ConfigError) as err:
        build_local_sgd(name, config(clip=1.0, noise_multiplier=0.0, **kwargs), client_rate=0.5)
    assert err.value.field == "algorithm.noise_multiplier"


def test_bad_name_and_bad_switches():
    with pytest.raises(ConfigError) as err:
        build_local_sgd("fedprox", config(local_steps=1, lr=0.1, sample_rate=0.5), client_rate=0.5)
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
    with pytest.raises(ConfigError) as err:
        build_local_sgd("fedavg", config(sample_rate=0.0), client_rate=0.5)
    assert err.value.field == "algorithm.sample_rate"


def test_client_data_batch_gathers_each_clients_records():
    arrays = make_data([3, 5])
    data = client_data(arrays, torch.tensor([1, 0]))
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
    data = client_data(arrays, ids)
    point = 0.3 * torch.ones(3, grads.num_params)
    keys = ClientStreams(2, 0, ids, "records").uniform([(int(n),) for n in data.counts])
    mean, event = alg.noisy_gradient(grads, point, data, keys, None)
    assert event == dp_event.NonPrivateDpEvent()
    indices, mask = sampler.sample(data.counts, keys)
    xb, yb = data.batch(indices)
    for c, b in enumerate([4, 3, 5]):
        norms = grads.example_norms(point, xb, yb, mask)[c, :b]
        median = norms.sort().values[(b - 1) // 2]  # torch's (lower) median
        clipped = grads.clipped_sum(point[c : c + 1], xb[c : c + 1, :b], yb[c : c + 1, :b], mask[c : c + 1, :b],
                                    float(median))
        torch.testing.assert_close(mean[c], clipped[0] / b, atol=1e-6, rtol=1e-5)
    # the fixed clip gives something else
    fixed, _ = algorithm(sampler=sampler, clip=1.0, local_steps=1).noisy_gradient(grads, point, data, keys, None)
    assert not torch.allclose(fixed, mean, atol=1e-5)


def test_clip_heuristic_names():
    with pytest.raises(ConfigError) as err:
        algorithm(clip_heuristic="mean")
    assert err.value.field == "algorithm.clip_heuristic"
    section = config(local_steps=1, lr=0.1, sample_rate=0.5, clip=1.0, noise_multiplier=1.0,
                     clip_heuristic="median-nonprivate")
    assert build_local_sgd("fedavg", section, client_rate=0.5).clip_heuristic == "fixed"  # non-DP names ignore it
    with pytest.warns(UserWarning):
        alg = build_local_sgd("dp-fedavg", section, client_rate=0.5)
    assert alg.clip_heuristic == "median-nonprivate" and alg.step_noise_event == dp_event.NonPrivateDpEvent()


def test_unequal_clients_declare_each_owners_release_and_the_paper_charges_the_bound():
    """Batches of floor(0.3 n_i): 1 of 5 records (sensitivity 2C) and 3 of 10 (2C/3). Each owner's release is its own
    ratio with the others' shares in units of its own variance: the owner of 5 is credited 9 (1/3)^2 = 1, an owner of
    10 gets 1 share of 9 (the 5-record client's) and 8 of 1: 17; equal clients declare one release; the paper's
    accountant charges the bound."""
    from dpfl.accounting.events import WorstOwnerDpEvent
    from dpfl.accounting.observers import Cohort, observer_events

    alg = build_local_sgd("dp-fedsgd", LocalSGDConfig(local_steps=1, sample_rate=0.3, noise_multiplier=2.0), 1.0)
    assert alg.release(0, None, torch.tensor([10] * 10)).owners == ()
    release = alg.release(0, None, torch.tensor([5] + [10] * 9))
    assert [(e.source_dataset_size, e.sample_size) for e in (r.step_events[0] for r in release.owners[:2])] == \
        [(5, 1), (10, 3)]
    assert release.step_events[0].sample_size / release.step_events[0].source_dataset_size == 0.3  # the bound
    assert release.owners[0].credited_variance(9) == pytest.approx(1.0)
    assert release.owners[1].credited_variance(9) == pytest.approx(17.0)
    cohort = Cohort.fixed(10, 10)
    assert isinstance(observer_events(release, cohort)["third_party"], WorstOwnerDpEvent)
    assert observer_events(release, cohort, analysis="paper") == observer_events(
        dataclasses.replace(release, owners=()), cohort, analysis="paper")
