"""A notebook's whole DP federated run to a target epsilon: your torch model, your arrays split into clients in Python,
no file and no shell (`# %%` starts a cell; or run it: `python examples/notebook.py`).

`dpfl.calibrate(config, target_epsilon=..., model=..., data=...)` solves the noise against the run's own ledger on these
arrays (nothing is trained) and hands back the config with the noise pinned and the epsilon per observer its run will
spend; `dpfl.run` takes that answer as its config. Record-level DP (dp-fedavg: one record of a client) and user-level
DP (dp-fedavg-user: all of a client's records) go the same way. DPFL_NOTEBOOK_ROUNDS sets the rounds (default 30).
"""

# %% The data: sklearn's digits, split into 20 clients here (each record's client id), pixels scaled to [0, 1].
import os

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

import dpfl

digits = load_digits()
x = (digits.data / 16.0).astype(np.float32)
y = digits.target
client = np.random.default_rng(0).integers(0, 20, size=len(y))  # each record's client


# %% Your model: any torch module mapping records [N, 64] to logits [N, 10].
class Net(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.hidden, self.out = nn.Linear(64, width), nn.Linear(width, 10)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(x)))


def private_run(algorithm: dict, target_epsilon: float, rounds: int) -> dpfl.Results:
    """Calibrates ``algorithm`` on the arrays to ``target_epsilon``, prints the answer, runs it and prints the
    accuracy and the epsilon each observer was spent."""
    config = {"algorithm": {**algorithm, "rounds": rounds}, "data": {"test_fraction": 0.2}, "run": {"noise_seed": 0}}
    torch.manual_seed(0)  # the module's initial parameters are the run's starting point
    model = Net()
    calibrated = dpfl.calibrate(config, target_epsilon=target_epsilon, model=model, data=(x, y, client))
    print(calibrated)
    results = dpfl.run(calibrated, model=model, data=(x, y, client))
    spent = ", ".join(f"{observer} {eps:.3f}" for observer, eps in results.epsilon.items())
    print(f"  test accuracy {results.final['test_accuracy']:.3f}; epsilon per observer: {spent}")
    return results


def main(rounds: int = int(os.environ.get("DPFL_NOTEBOOK_ROUNDS", 30))) -> dict[str, dpfl.Results]:
    # %% Record-level DP: each client clips and noises its own minibatch gradients; the target bounds every observer.
    record = private_run({"name": "dp-fedavg", "client_rate": 0.5, "local_steps": 5, "sample_rate": 0.2, "lr": 0.5,
                          "clip": 1.0}, target_epsilon=8.0, rounds=rounds)
    # %% User-level DP: each client's whole update is clipped, the server adds the noise; the target bounds another
    # client (the observer this noise placement protects).
    user = private_run({"name": "dp-fedavg-user", "client_rate": 0.5, "local_steps": 5, "lr": 0.5, "clip": 1.0},
                       target_epsilon=8.0, rounds=rounds)
    return {"dp-fedavg": record, "dp-fedavg-user": user}


if __name__ == "__main__":
    main()
