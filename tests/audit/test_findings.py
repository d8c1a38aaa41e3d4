"""What the audit found: Poisson record sampling cannot be accounted under add/remove neighbouring.

Poisson record sampling divides each client's clipped sum by its expected batch size q n_i and scales its noise to
z C / (q n_i). Adding or removing a record changes n_i, hence the divisor and the noise's scale: the add/remove claim
does not hold (the audit measures epsilon 3.47 where 0.36 is claimed). dpfl accounts it under zero-out neighbouring
instead (a record replaced by a null one; n_i unchanged), where the claim holds."""

import pytest
import torch

from dpfl.accounting.accountant import account
from dpfl.algorithms.local_sgd import LocalSGD
from worst_case import LinearQuadraticOracle
from dpfl.audit.bounds import many_run_lower_bound
from dpfl.noise import GaussianMechanism
from dpfl.engine.protocol import ClientContext, ClientData
from dpfl.engine.sampling import RecordSampler


def _dy(algorithm, records, trials, first_id):
    n = len(records)
    x = torch.tensor(records, dtype=torch.float32).reshape(1, n, 1).repeat(trials, 1, 1)
    data = ClientData(x, torch.zeros(trials, n, dtype=torch.long), torch.full((trials,), n))
    oracle = LinearQuadraticOracle(1, 1.0)  # label 0: linear loss, gradient = the record's x
    state = algorithm.init_state(oracle.initial_params(), trials)
    ids = torch.arange(trials) + first_id
    out = algorithm.client_round(0, state.server, state.rows(torch.arange(trials)), data,
                                 ClientContext(oracle, 0, 0, ids))
    return out.messages["dy"][:, 0].double().numpy()


def test_poisson_record_sampling_breaks_an_add_remove_claim_and_keeps_its_zero_out_claim():
    """Poisson record sampling (add/remove): a client of 2 records {+C, -C} against the same client with the +C
    record removed. The mean moves by C/q (the accounting's sensitivity is C/(q n_i) = C/(2q)) and the noise std
    doubles (z C/(q n_i) with n_i = 1): at z = 4, q = 1, the claim is 0.36 at delta 1e-2; measured lower bound
    3.47 (4000 runs per dataset; 4.31 with 20000), 95% confidence. In general, adding a record to a client of n
    moves sum/(q n) by up to 2C/(q (n + 1)) (every other term is rescaled), twice the C/(q n) the accounting assumes,
    and changes the noise std by a factor (n + 1)/n."""
    z, delta, trials = 4.0, 1e-2, 4000
    algorithm = LocalSGD(local_steps=1, lr=1.0, sampler=RecordSampler(1.0, "poisson"),
                         mechanism=GaussianMechanism(z), clip=1.0, move_locally=False)
    assert algorithm.neighboring == "zero_out"
    event = algorithm.release(0, None, torch.tensor([2])).step_events[0]
    claim = account(event, delta, neighboring="zero_out").epsilon
    assert claim == pytest.approx(account(event, delta, neighboring="add_remove").epsilon)  # the same number
    present = _dy(algorithm, [+1.0, -1.0], trials, 0)
    removed = _dy(algorithm, [-1.0], trials, trials)  # add/remove: the count changes
    zeroed = _dy(algorithm, [0.0, -1.0], trials, 2 * trials)  # zero-out: a null record, the count kept
    assert many_run_lower_bound(removed, present, delta).epsilon > 2 * claim  # the add/remove reading fails
    assert many_run_lower_bound(zeroed, present, delta).epsilon <= claim  # the zero-out claim holds
