"""dpfl on a device (run.device) against a one-client-at-a-time torch.func baseline on the same device, in one run.

Workloads:
  * W0: the seed-000 workload of benchmarks/seed000_throughput.py (DP-SCAFFOLD, synthetic, 100 clients x 4000 train
    records, d = 40, logistic regression, cohort 20, K = 50, batch 800);
  * W1: 100 clients x 400 train and 100 test generated 28 x 28 one-channel images of 62 classes, femnist-cnn
    (110,526 parameters), dp-fedavg, cohort 20, K = 10 local steps, batch 64, clip 1, noise 1, test accuracy and
    train loss every round.
The baseline runs the same rounds the way per-client DP-SGD loops are usually written (and Opacus costs the same):
for each client of the cohort, K steps of torch.func per-example gradients of its minibatch, clipped, summed, plus
Gaussian noise; then the server averages the updates and evaluates. Prints the device's name and a Markdown table of
s/round and the baseline's s/round over dpfl's (on a GPU, W0 also with dpfl on the CPU: --threads torch threads).

    PYTHONPATH=src python benchmarks/gpu_throughput.py [--device auto|cpu|cuda|cuda:N] [--rounds 5] [--quick] [--scale]

--scale adds W2 (benchmarks/scale.py): 10^5 clients, cohorts up to 1,000, peak memory and s/round.

--quick scales both workloads down (fewer records, clients and local steps; one timed round) so that it runs in about
a minute on a CPU; the full run is sized to finish in under 4 minutes on one H100.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

sys.path.insert(0, str(Path(__file__).resolve().parent))  # seed000_throughput, beside this file
import scale  # noqa: E402
from seed000_throughput import WORKLOAD as W0  # noqa: E402

from dpfl.data.federated import ClientArrays, FederatedDataset  # noqa: E402
from dpfl.engine.device import resolve_device  # noqa: E402
from dpfl.experiments.config import load_config  # noqa: E402
from dpfl.experiments.runner import build_simulation  # noqa: E402

W1 = ["algorithm.name='dp-fedavg'", "model.name='femnist-cnn'", "algorithm.client_rate=0.2",
      "algorithm.local_steps=10", "algorithm.sample_rate=0.16", "algorithm.clip=1.0", "algorithm.noise_multiplier=1.0",
      "algorithm.lr=0.1", "run.eval_every=1"]
#: --quick: W0 with 500 records a client and K = 10; W1 with 20 clients (cohort 4) and K = 2
QUICK = {"W0": ["data.samples_per_client=500", "algorithm.local_steps=10"],
         "W1": ["algorithm.local_steps=2"]}


def images(num_clients: int, train: int = 400, test: int = 100, classes: int = 62, seed: int = 0) -> FederatedDataset:
    """W1's data: each class a random 28 x 28 template, each image its class's template plus N(0, 1) pixel noise."""
    rng = np.random.default_rng(seed)
    templates = rng.normal(0.0, 1.0, (classes, 28, 28)).astype(np.float32)

    def split(n: int) -> ClientArrays:
        y = rng.integers(0, classes, (num_clients, n))
        x = templates[y] + rng.normal(0.0, 1.0, (num_clients, n, 28, 28)).astype(np.float32)
        return ClientArrays(torch.from_numpy(x), torch.from_numpy(y), torch.full((num_clients,), n))

    return FederatedDataset(split(train), split(test), classes, "generated", {"source": "gpu_throughput.images"})


def simulation(workload: str, device: str, threads: int, quick: bool):
    overrides = [*(W0 if workload == "W0" else W1), *(QUICK[workload] if quick else []), f"run.device='{device}'",
                 f"run.threads={threads}", "run.noise_seed=0"]
    if workload == "W0":
        return build_simulation(load_config(None, overrides))
    clients = 20 if quick else 100
    return build_simulation(load_config(None, [*overrides, f"data.num_clients={clients}"]), dataset=images(clients))


def synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def dpfl_seconds(sim, rounds: int) -> float:
    sim.run(1)  # warm-up: first-call overheads, the accountant's curve cache
    synchronise(sim.device)
    start = time.perf_counter()
    sim.run(1 + rounds)
    synchronise(sim.device)
    return (time.perf_counter() - start) / rounds


def baseline_seconds(sim, rounds: int) -> float:
    """One client at a time, torch.func per-example gradients (vmap over its minibatch), on the run's device: the same
    cohort size, K, batch, clip, noise multiplier and step as dp-fedavg / dp-scaffold's local steps, train loss and
    test accuracy every round."""
    device, algorithm = sim.device, sim.algorithm
    model, train = sim.grads.model, sim.train
    cohort, steps = sim.clients.cohort_size, algorithm.local_steps
    batch = int(algorithm.examples_per_client(train.counts))
    clip, z = algorithm.clip, algorithm.mechanism.noise_multiplier
    step = algorithm.lr / (algorithm.sampler.rate * steps)
    (train_x, train_y), (test_x, test_y) = train.flat(), sim.test.flat()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}

    def example_loss(p, x, y):
        return F.cross_entropy(functional_call(model, p, (x.unsqueeze(0),)), y.unsqueeze(0))

    per_example = vmap(grad(example_loss), in_dims=(None, 0, 0))
    generator = torch.Generator(device=device).manual_seed(0)

    def one_round():
        total = {k: torch.zeros_like(v) for k, v in params.items()}
        for c in torch.randperm(train.num_clients, generator=generator, device=device)[:cohort].tolist():
            local, n = {k: v.clone() for k, v in params.items()}, int(train.counts[c])
            for _ in range(steps):
                idx = torch.randperm(n, generator=generator, device=device)[:batch]
                g = per_example(local, train.x[c, idx], train.y[c, idx])
                norms = torch.sqrt(sum(t.flatten(1).square().sum(1) for t in g.values()))
                factor = torch.clamp(clip / (norms + 1e-12), max=1.0)
                for k, t in g.items():
                    noise = torch.randn(t.shape[1:], generator=generator, device=device) * (z * clip)
                    local[k] -= step * (torch.einsum("b,b...->...", factor, t) + noise) / batch
            for k in total:
                total[k] += local[k] - params[k]
        for k in params:
            params[k] += total[k] / cohort
        with torch.no_grad():
            loss = sum(F.cross_entropy(functional_call(model, params, (train_x[i : i + 65536],)),
                                       train_y[i : i + 65536], reduction="sum").item()
                       for i in range(0, len(train_y), 65536)) / len(train_y)
            correct = sum((functional_call(model, params, (test_x[i : i + 65536],)).argmax(-1)
                           == test_y[i : i + 65536]).sum().item() for i in range(0, len(test_y), 65536))
        return loss, correct / len(test_y)

    one_round()  # warm-up
    synchronise(device)
    start = time.perf_counter()
    for _ in range(rounds):
        one_round()
    synchronise(device)
    return (time.perf_counter() - start) / rounds


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores (torch {torch.__version__})"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="run.device: auto, cpu, cuda or cuda:N (default auto)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds of dpfl (default 5; 1 with --quick)")
    parser.add_argument("--baseline-rounds", type=int, default=None, help="timed rounds of the baseline (default 2; "
                                                                          "1 with --quick)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (run.threads; default 1)")
    parser.add_argument("--quick", action="store_true", help="scaled-down workloads: about a minute on a CPU")
    parser.add_argument("--scale", action="store_true", help="also W2, 10^5 clients (benchmarks/scale.py)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 5)
    baseline_rounds = args.baseline_rounds or (1 if args.quick else 2)
    device = resolve_device(args.device)
    torch.set_num_threads(args.threads)
    print(f"device: {device_name(device)}; {'quick' if args.quick else 'full'} workloads, {rounds} timed dpfl "
          f"rounds, {baseline_rounds} baseline rounds", flush=True)
    rows = []
    for workload in ("W0", "W1"):
        sim = simulation(workload, str(device), args.threads, args.quick)
        dpfl = dpfl_seconds(sim, rounds)
        baseline = baseline_seconds(simulation(workload, str(device), args.threads, args.quick), baseline_rounds)
        rows.append((workload, f"dpfl ({sim.grads.strategy})", device.type, dpfl, baseline / dpfl))
        rows.append((workload, "one client at a time, torch.func", device.type, baseline, 1.0))
        if workload == "W0" and device.type == "cuda":
            cpu = dpfl_seconds(simulation(workload, "cpu", args.threads, args.quick), max(1, rounds // 2))
            rows.append((workload, f"dpfl ({sim.grads.strategy}, {args.threads} threads)", "cpu", cpu,
                         baseline / cpu))
        print(f"{workload} done", file=sys.stderr, flush=True)
    print("\n| workload | implementation | device | s/round | baseline / this |\n|---|---|---|---|---|")
    for workload, name, where, seconds, ratio in rows:
        print(f"| {workload} | {name} | {where} | {seconds:.3g} | {ratio:.3g}x |")
    if not all(math.isfinite(r[3]) for r in rows):
        sys.exit(1)
    if args.scale:
        print("\nW2:", flush=True)
        scale.main(["--device", str(device), "--threads", str(args.threads), *(["--quick"] if args.quick else [])])


if __name__ == "__main__":
    main()
