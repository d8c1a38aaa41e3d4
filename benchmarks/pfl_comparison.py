"""dpfl against Apple's pfl-research (``pfl`` 0.6.0) on one user-level DP-FedAvg workload: seconds per round, the
epsilon each reports, and peak memory, each framework in its own process and (for pfl) its own Python environment.

    PYTHONPATH=src python benchmarks/pfl_comparison.py --pfl-python /path/to/pflvenv/bin/python
    PYTHONPATH=src python benchmarks/pfl_comparison.py --rounds 20 --json pfl.json   # pfl: $PFL_PYTHON, if set

pfl lives in a separate virtual environment (it pins its own dp-accounting and numpy), e.g.
``python3 -m venv pflvenv && pflvenv/bin/pip install torch==2.13.0 pfl==0.6.0``; ``--pfl-python`` (default: the
environment variable ``PFL_PYTHON``) names its interpreter. Where none is given or it cannot ``import pfl``, only
dpfl's side runs and the table says "pfl: not installed".

Workload (McMahan, Ramage, Talwar, Zhang 2018, DP-FedAvg with user-level DP and the noise at a trusted server): M =
1,000 users of 50 records of dpfl's synthetic data (Li et al. 2020's (0, 0); 40 train and 10 test records each),
multinomial logistic regression (40 features, 10 classes), Poisson cohorts at q = 0.1, each member running K = 5
local SGD steps of 8 records (lr 0.1) from the global model, its whole update clipped to C = 1, the sum noised with
N(0, (z C)^2), z = 1, by the server and divided by the expected cohort qM = 100 (McMahan et al.'s fixed denominator),
server step 1; delta = 1e-6; one CPU thread each. dpfl runs ``dp-fedavg-user`` with ``noise_at = "server"``,
``client_sampling = "poisson"``, ``privacy.boundary = "trusted"`` and its default ``privacy.cohort = "secret"``.
pfl runs ``FederatedAveraging`` with ``WeightByUser``, ``CentrallyAppliedPrivacyMechanism(GaussianMechanism)`` and a
``FederatedDataset`` whose cohorts are Poisson draws at q (pfl's own samplers draw a fixed count of users with
replacement, which its Poisson accountant does not describe), on the same records: this script writes dpfl's train
and test arrays to one npz file that pfl's process reads. (pfl's simulator fails on an empty cohort, where dpfl
releases the noise alone: at M = 1,000 and q = 0.1 one has probability 0.9^1000.)

Epsilon. pfl reports its ``PLDPrivacyAccountant``'s: dp_accounting's PLD of the Poisson subsampled Gaussian,
``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` composed T times (sensitivity C under add/remove of one user; the
noise std z C on the sum). dpfl's default charges, towards a third party and towards another silo (neither of whom
knows the cohort: the server draws it from its secret key), the same event under zero-out (a null user, whose
clipped update is 0, leaves the sum as an absent one does, so the two relations give the same privacy loss towards
an observer of the noised sum; docs/user-level.md, "Who knows the cohort"), so both report the same epsilon. The
table prints both, and their difference.

Time. Each framework's process generates or reads its data, builds its run, then times every round: dpfl calls
``Simulation.step`` once a round (cohort draw, the ledger's record, the cohort's client work and the server's noisy
step); pfl's round is the time between its consecutive ``after_central_iteration`` callbacks (the first from
``on_train_begin``). Neither evaluates during training, except pfl's first round, where ``FederatedAveraging``
evaluates every member before and after its local training (``do_evaluation`` holds at iteration 0 whatever the
evaluation frequency): hence "mean after the first" and "mean of all" separately. Epsilon is computed after the
rounds (dpfl: ``ledger.epsilon_through(T)``) or before them (pfl: its accountant, at construction) and timed apart
from them; test accuracy is measured once, on the final model. Peak memory is the process's ``ru_maxrss``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
SRC = HERE.parents[1] / "src"

#: The workload, shared by both sides (see the module docstring).
CLIENTS = 1000
RECORDS = 50
CLIENT_RATE = 0.1
CLIP = 1.0
NOISE_MULTIPLIER = 1.0
DELTA = 1e-6
LOCAL_STEPS = 5
SAMPLE_RATE = 0.2  # dpfl's minibatch: floor(0.2 * 40) = 8 records; pfl's local_batch_size is set to the same count
LOCAL_LR = 0.1
SEED = 0


def dpfl_settings(clients: int, records: int, rounds: int) -> list[str]:
    """dpfl's config overrides for the workload at ``clients`` users of ``records`` records, ``rounds`` rounds."""
    return ["algorithm.name='dp-fedavg-user'", f"algorithm.rounds={rounds}", f"algorithm.client_rate={CLIENT_RATE}",
            "algorithm.client_sampling='poisson'", "algorithm.noise_at='server'",
            f"algorithm.noise_multiplier={NOISE_MULTIPLIER}", f"algorithm.clip={CLIP}",
            f"algorithm.local_steps={LOCAL_STEPS}", f"algorithm.sample_rate={SAMPLE_RATE}", f"algorithm.lr={LOCAL_LR}",
            "algorithm.server_lr=1.0", f"privacy.delta={DELTA}", "privacy.boundary='trusted'",
            "data.name='synthetic'", f"data.num_clients={clients}", f"data.samples_per_client={records}",
            f"data.seed={SEED}", f"run.seed={SEED}", "run.threads=1", f"run.eval_every={rounds}"]


def export_data(clients: int, records: int, path: Path) -> None:
    """Writes the records dpfl's run is built from (its [data] section at ``clients`` x ``records``) to ``path``:
    x_train [M, n, d], y_train [M, n], counts_train [M] and the same for test (zero-padded rows past each count)."""
    import numpy as np

    from dpfl.experiments.assembly import build_data
    from dpfl.experiments.config import load_config

    dataset = build_data(load_config(None, dpfl_settings(clients, records, 1))["data"])
    np.savez(path, **{f"{name}_{split}": getattr(getattr(dataset, split), name).numpy()
                      for split in ("train", "test") for name in ("x", "y", "counts")})


def round_seconds(seconds: list[float]) -> dict:
    """The rounds' times: the first, the mean of the rest (None with one round) and the mean of all."""
    return {"first": seconds[0], "mean_after_first": statistics.fmean(seconds[1:]) if len(seconds) > 1 else None,
            "mean_all": statistics.fmean(seconds), "rounds": len(seconds)}


def peak_mib() -> float:
    """This process's peak resident memory in MiB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- the two sides, each run in its own process (``--worker``) ------------------------------------------------------

def run_dpfl(clients: int, records: int, rounds: int) -> dict:
    """dpfl's side: builds the run (``dpfl.build``), times ``rounds`` steps, then its epsilons and test accuracy."""
    import dpfl

    build, load_config = dpfl.build, dpfl.load_config  # imported here (dpfl imports lazily), not in the build's time
    started = time.perf_counter()
    sim = build(load_config(None, dpfl_settings(clients, records, rounds)))
    build_seconds = time.perf_counter() - started
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        sim.step()
        seconds.append(time.perf_counter() - started)
    started = time.perf_counter()
    epsilon = sim.ledger.epsilon_through(rounds)
    accounting = time.perf_counter() - started
    metrics = sim.evaluate()
    return {"framework": "dpfl", "version": dpfl.__version__, "build_seconds": build_seconds, "round_seconds": seconds,
            "accounting_seconds": accounting, "epsilon": epsilon, "test_accuracy": metrics.test_accuracy,
            "peak_mib": peak_mib()}


def run_pfl(data: Path, rounds: int) -> dict:
    """pfl's side on the records in ``data`` (``export_data``): the workload through pfl's own simulator, with
    Poisson cohorts at q; its accountant's epsilon, the rounds' times and the final model's test accuracy."""
    import numpy as np
    import torch

    from pfl.model.pytorch import PyTorchModel  # first: importing it selects pfl's PyTorch framework

    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByUser
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.metrics import Metrics, Weighted
    from pfl.privacy import CentrallyAppliedPrivacyMechanism, GaussianMechanism, PLDPrivacyAccountant
    from pfl.version import __version__

    np.random.seed(SEED)
    torch.manual_seed(SEED)
    with np.load(data) as npz:
        arrays = {name: npz[name] for name in npz.files}  # each npz[name] reads the file again
    counts = arrays["counts_train"]
    users = [Dataset(raw_data=[torch.from_numpy(arrays["x_train"][i, :n]), torch.from_numpy(arrays["y_train"][i, :n])],
                     user_id=i) for i, n in enumerate(counts)]
    expected_cohort = CLIENT_RATE * len(users)
    batch = int(SAMPLE_RATE * int(counts.min()))

    class PoissonCohorts(FederatedDataset):
        """pfl's FederatedDataset whose every cohort takes each user independently with probability q."""

        def get_cohort(self, cohort_size):
            for user in np.flatnonzero(np.random.random(len(users)) < CLIENT_RATE):
                yield users[user], self._get_seed()

    class FixedDenominatorFedAvg(FederatedAveraging):
        """FedAvg stepping on the noisy sum over the expected cohort qM, as dpfl (pfl's divides by the count)."""

        def process_aggregated_statistics(self, central_context, aggregate_metrics, model, statistics):
            return model.apply_model_update(statistics.apply_elementwise(lambda v: v / expected_cohort))

    class LogisticRegression(torch.nn.Module):
        def __init__(self, features: int, classes: int):
            super().__init__()
            self.linear = torch.nn.Linear(features, classes)

        def forward(self, x):
            return self.linear(x)

        def loss(self, x, y, **_):
            return torch.nn.functional.cross_entropy(self(x), y)

        @torch.no_grad()
        def metrics(self, x, y, **_):
            logits = self(x)
            return {"loss": Weighted(float(torch.nn.functional.cross_entropy(logits, y, reduction="sum")), len(y)),
                    "accuracy": Weighted(float((logits.argmax(1) == y).sum()), len(y))}

    class RoundClock(TrainingProcessCallback):
        def __init__(self):
            self.marks: list[float] = []

        def on_train_begin(self, *, model):
            self.marks = [time.perf_counter()]
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            self.marks.append(time.perf_counter())
            return False, Metrics()

    started = time.perf_counter()
    accountant = PLDPrivacyAccountant(num_compositions=rounds, sampling_probability=CLIENT_RATE, mechanism="gaussian",
                                      noise_parameter=NOISE_MULTIPLIER, delta=DELTA)
    accounting = time.perf_counter() - started
    started = time.perf_counter()
    federated = PoissonCohorts(make_dataset_fn=users.__getitem__, user_sampler=lambda: 0)
    mechanism = CentrallyAppliedPrivacyMechanism(GaussianMechanism.from_privacy_accountant(accountant, CLIP))
    backend = SimulatedBackend(training_data=federated, val_data=federated,
                               postprocessors=[WeightByUser(), mechanism])
    net = LogisticRegression(arrays["x_train"].shape[-1], int(arrays["y_train"].max()) + 1)
    model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    params = NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=rounds + 1,
                               train_cohort_size=round(expected_cohort), val_cohort_size=None)
    train = NNTrainHyperParams(local_num_epochs=None, local_num_steps=LOCAL_STEPS, local_learning_rate=LOCAL_LR,
                               local_batch_size=batch)
    clock = RoundClock()
    build_seconds = time.perf_counter() - started
    FixedDenominatorFedAvg().run(algorithm_params=params, backend=backend, model=model, model_train_params=train,
                                 callbacks=[clock], send_metrics_to_platform=False)
    seconds = list(np.diff(clock.marks))
    with torch.no_grad():
        test = torch.from_numpy(arrays["counts_test"])[:, None] > torch.arange(arrays["y_test"].shape[1])
        x, y = torch.from_numpy(arrays["x_test"])[test], torch.from_numpy(arrays["y_test"])[test]
        accuracy = float((net(x).argmax(1) == y).double().mean())
    return {"framework": "pfl", "version": __version__, "build_seconds": build_seconds, "round_seconds": seconds,
            "accounting_seconds": accounting, "epsilon": {"pfl": accountant.epsilon}, "test_accuracy": accuracy,
            "peak_mib": peak_mib()}


def _worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    found = (run_dpfl(args.clients, args.records, args.worker_rounds) if args.worker == "dpfl"
             else run_pfl(Path(args.data), args.worker_rounds))
    Path(args.result).write_text(json.dumps(found))


# -- the driver ------------------------------------------------------------------------------------------------------

def _single_threaded_env(pythonpath: str | None) -> dict:
    """This environment with one OpenMP / BLAS thread and ``pythonpath`` (None: no PYTHONPATH) as PYTHONPATH."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def pfl_installed(python: str | None) -> str | None:
    """pfl's version under the interpreter ``python``, or None where there is none or it cannot import pfl."""
    if not python:
        return None
    try:
        done = subprocess.run([python, "-c", "from pfl.version import __version__; print(__version__)"],
                              capture_output=True, text=True, env=_single_threaded_env(None), timeout=300)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _in_own_process(python: str, pythonpath: str | None, argv: list[str], result: Path) -> dict:
    """This script's worker (``--worker``) under the interpreter ``python``, single-threaded; what it wrote."""
    env = _single_threaded_env(pythonpath)
    subprocess.run([python, str(HERE), *argv, "--result", str(result)], check=True, env=env)
    return json.loads(result.read_text())


def compare(rounds: list[int], clients: int, records: int, pfl_python: str | None, work: Path) -> dict:
    """Both sides at each of ``rounds``, each in a fresh process (dpfl under this interpreter with this tree's src,
    pfl under ``pfl_python`` where it imports pfl): {"machine", "pfl", "runs": [{"rounds", "dpfl", "pfl"}]}."""
    at_start = machine()
    data = work / "records.npz"
    export_data(clients, records, data)
    pfl_version = pfl_installed(pfl_python)
    runs = []
    for count in rounds:
        common = ["--clients", str(clients), "--records", str(records), "--worker-rounds", str(count)]
        dpfl_side = _in_own_process(sys.executable, str(SRC), ["--worker", "dpfl", *common],
                                    work / f"dpfl-{count}.json")
        pfl_side = None if pfl_version is None else _in_own_process(
            pfl_python, None, ["--worker", "pfl", "--data", str(data), *common], work / f"pfl-{count}.json")
        runs.append({"rounds": count, "dpfl": summarise(dpfl_side), "pfl": pfl_side and summarise(pfl_side)})
    return {"machine": at_start, "workload": {"clients": clients, "records": records, "client_rate": CLIENT_RATE,
                                               "clip": CLIP, "noise_multiplier": NOISE_MULTIPLIER, "delta": DELTA,
                                               "local_steps": LOCAL_STEPS, "model": "logreg"},
            "pfl": pfl_version or "not installed", "runs": runs}


def summarise(side: dict) -> dict:
    """A side's result with its round times summarised (``round_seconds``) next to the raw times."""
    return {**side, "seconds_per_round": round_seconds(side["round_seconds"])}


def machine() -> dict:
    """What the figures were measured on, and the load average at the start."""
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "load_average": os.getloadavg()[0]}


def table(found: dict) -> list[str]:
    """The printed table: one line per (rounds, framework)."""
    lines = [f"{'rounds':>6} {'framework':<10} {'s/round':>9} {'s/round':>8} {'eps 3rd':>8} {'eps silo':>8} "
             f"{'test acc':>8} {'peak MiB':>8}",
             f"{'':>6} {'':<10} {'after 1st':>9} {'all':>8}"]
    for run in found["runs"]:
        for name in ("dpfl", "pfl"):
            side = run[name]
            if side is None:
                lines.append(f"{run['rounds']:>6} {name:<10} pfl: not installed")
                continue
            timing, eps = side["seconds_per_round"], side["epsilon"]
            third, silo = (eps["third_party"], eps["other_silo"]) if name == "dpfl" else (eps["pfl"], None)
            after = "-" if timing["mean_after_first"] is None else f"{timing['mean_after_first']:.4f}"
            lines.append(f"{run['rounds']:>6} {name:<10} {after:>9} {timing['mean_all']:>8.4f} {third:>8.4f} "
                         f"{'-' if silo is None else f'{silo:.4f}':>8} {side['test_accuracy']:>8.4f} "
                         f"{side['peak_mib']:>8.0f}")
        if run["pfl"] is not None:
            gap = run["dpfl"]["epsilon"]["third_party"] - run["pfl"]["epsilon"]["pfl"]
            lines.append(f"{'':>6} eps(dpfl third party) - eps(pfl) = {gap:.2e}")
    return lines


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--rounds", type=int, nargs="+", default=[20, 200], help="T, one comparison per value")
    parse.add_argument("--clients", type=int, default=CLIENTS, help="M, the users")
    parse.add_argument("--records", type=int, default=RECORDS, help="records per user (80%% train, 20%% test)")
    parse.add_argument("--pfl-python", default=os.environ.get("PFL_PYTHON"),
                       help="the interpreter of pfl's environment (default: $PFL_PYTHON); none: dpfl only")
    parse.add_argument("--json", default=None, help="write the results here")
    parse.add_argument("--worker", choices=["dpfl", "pfl"], help=argparse.SUPPRESS)
    parse.add_argument("--worker-rounds", type=int, help=argparse.SUPPRESS)
    parse.add_argument("--data", help=argparse.SUPPRESS)
    parse.add_argument("--result", help=argparse.SUPPRESS)
    return parse


def main(argv: list[str] | None = None) -> dict | None:
    args = parser().parse_args(argv)
    if args.worker:
        _worker(args)
        return None
    with tempfile.TemporaryDirectory() as work:
        found = compare(args.rounds, args.clients, args.records, args.pfl_python, Path(work))
    print(f"{found['machine']['cpus']} cpus ({found['machine']['processor']}), load average "
          f"{found['machine']['load_average']:.2f} at the start; pfl: {found['pfl']}")
    print("\n".join(table(found)))
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1))
    return found


if __name__ == "__main__":
    main()
