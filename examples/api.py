"""dpfl's Python API, cell by cell (a notebook: `# %%` starts a cell; or run it: `python examples/api.py`).

Everything comes from `import dpfl`: a config run, your own torch module and numpy arrays, what dpfl refuses and
why, accounting and calibration without training, and a run driven round by round.
"""

# %% A config run: a dict of the keys a TOML file would set (every other key at its default, every key checked).
import numpy as np
import torch
from torch import nn

import dpfl

# (1,437 training records: a small data set, so a large epsilon.) Pass out="runs/api" for a run directory.
config = {"data": {"name": "digits", "num_clients": 20, "scale": 1 / 16},
          "algorithm": {"name": "dp-fedavg", "rounds": 10, "client_rate": 0.5, "local_steps": 5, "lr": 1.0,
                        "noise_multiplier": 1.0}}
results = dpfl.run(config)
print("digits, logistic regression:", results)
print("final:", results.final, "\nprivacy:", results.privacy["accountant"], results.privacy["unit"])


# %% Your own module on your own arrays: the same per-example-gradient engine, the same accounting.
class Net(nn.Module):
    """Any module mapping records [N, ...] to logits [N, classes]; a residual block, not a Sequential."""

    def __init__(self, features: int = 20, width: int = 16, classes: int = 2):
        super().__init__()
        self.inner, self.block = nn.Linear(features, width), nn.Linear(width, width)
        self.out = nn.Linear(width, classes)

    def forward(self, x):
        h = torch.tanh(self.inner(x))
        return self.out(h + torch.tanh(self.block(h)))


rng = np.random.default_rng(0)
x = rng.normal(size=(2000, 20)).astype(np.float32)
y = (x[:, 0] + x[:, 1] > 0).astype(int)
hospital = rng.integers(0, 20, size=2000)  # each record's client; without it, data.partition over data.num_clients
mine = {"algorithm": {"name": "dp-fedavg", "rounds": 5, "client_rate": 0.5, "local_steps": 10, "lr": 0.5,
                      "noise_multiplier": 2.0}}
torch.manual_seed(0)  # the module's initial parameters are the run's starting point (and part of its fingerprint)
own = dpfl.run(mine, model=Net(), loss=nn.CrossEntropyLoss(reduction="none"), data=(x, y, hospital))
print("own module, own arrays:", own)
print("recorded as:", own.config["model"], own.config["data"]["name"], sorted(own.config["supplied"]))

# The accounting reads the data's counts and the config, never the module: dpfl's logistic regression on the same
# arrays spends exactly the same epsilon.
builtin = dpfl.run(mine, data=(x, y, hospital))
assert builtin.final["epsilon"] == own.final["epsilon"]
print("same epsilon with dpfl's logistic regression:", builtin.epsilon)

# %% What the per-example engine cannot use is refused before round 1, naming the layer or the loss.
for model, loss in ((nn.Sequential(nn.Linear(20, 16), nn.BatchNorm1d(16), nn.Linear(16, 2)), None),
                    (Net(), nn.CrossEntropyLoss())):  # the default reduction, 'mean', mixes the examples
    try:
        dpfl.run(mine, model=model, loss=loss, data=(x, y, hospital))
    except dpfl.ConfigError as refused:
        print("refused:", str(refused)[:160], "...")

# %% Accounting without training: the TensorFlow Privacy DP-SGD MNIST tutorial (z = 1.1, batch 256 of 60,000,
# 14,063 steps, delta = 1e-5): PLD 2.38178, RDP with the classic conversion 3.00839 (docs/accounting.md).
mnist = dict(sampling_rate=256 / 60000, steps=14063, delta=1e-5)
print("PLD:", dpfl.account(noise_multiplier=1.1, **mnist).epsilon)
print("RDP:", dpfl.account(noise_multiplier=1.1, **mnist, accountant="rdp", conversion="classic").epsilon)
print("noise for epsilon 3 (RDP):", dpfl.calibrate(3.0, **mnist, accountant="rdp"))

# %% A run driven round by round, without a run directory.
simulation = dpfl.build(mine, model=Net(), data=(x, y, hospital))
for metrics in simulation.run(2):
    print(f"round {metrics.round}: train loss {metrics.train_loss:.4f}, epsilon {metrics.epsilon}")
