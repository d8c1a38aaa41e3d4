"""W2: dpfl at 10^5 clients on one machine (DP-SCAFFOLD, whose control variates are per-client state).

The population: synthetic (alpha, beta) = (1, 1) clients of 50 records (40 train, 10 test), written once as a folder of
stacked client arrays (``dpfl.data.stacked``) and read memory-mapped (``data.name = "clients"``). Each case runs in a
fresh process (its peak resident memory is its own): build, one warm-up round, ``--rounds`` timed rounds without
evaluation, then one evaluation over every client's records, timed on its own. Cases: logreg (d = 410) and an MLP
(hidden 200, d = 10,210); the population at 10^4 and 10^5 clients with a cohort of 1,000 (s/round flat in the
population), and cohorts of 250, 500 and 1,000 of 10^5 (s/round linear in the cohort). K = 10 local steps, record
sampling 0.25 (10 records a step), clip 1, z = 1.

    PYTHONPATH=src python benchmarks/scale.py [--device cpu] [--rounds 3] [--threads 2] [--quick] [--folder DIR]

--quick: 2 x 10^4 clients, cohorts of 100 and 200, logreg only (about a minute). Prints a Markdown table: clients,
cohort, model, s/round, s/round per 1,000 cohort clients, one evaluation's seconds, the clients holding state, and
peak resident memory (MB).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
MODELS = {"logreg": [], "mlp": ["model.name='mlp'", "model.hidden=[200]"]}


def write_population(folder: Path, clients: int) -> Path:
    """The synthetic population, written once (reused when ``folder`` already holds one of ``clients``)."""
    from dpfl.data import stacked
    from dpfl.data.sources import build_dataset

    if (folder / stacked.MANIFEST).exists() and stacked.shape_of(folder)["clients"] == clients:
        return folder
    started = time.perf_counter()
    stacked.save(build_dataset("synthetic", num_clients=clients, samples_per_client=50, alpha=1.0, beta=1.0), folder)
    print(f"wrote {clients:,} clients to {folder} in {time.perf_counter() - started:.0f} s", file=sys.stderr,
          flush=True)
    return folder


def one_case(folder: str, clients: int, cohort: int, model: str, rounds: int, device: str, threads: int) -> dict:
    """One case in this process (``--case``): build, warm up, time ``rounds`` rounds and one evaluation."""
    import torch

    from dpfl.experiments.config import load_config
    from dpfl.experiments.runner import build_simulation

    config = load_config(None, [
        "algorithm.name='dp-scaffold'", "data.name='clients'", f"data.path='{folder}'",
        f"algorithm.client_rate={cohort / clients}", "algorithm.local_steps=10", "algorithm.sample_rate=0.25",
        "algorithm.clip=1.0", "algorithm.noise_multiplier=1.0", f"algorithm.rounds={rounds + 2}", "run.noise_seed=0",
        f"run.eval_every={10 ** 6}", f"run.threads={threads}", f"run.device='{device}'", *MODELS[model]])
    sim = build_simulation(config)
    sim.step()  # warm-up; then rounds alone (Simulation.run would evaluate after its last round)
    start = time.perf_counter()
    for _ in range(rounds):
        sim.step()
    if sim.device.type == "cuda":
        torch.cuda.synchronize(sim.device)
    seconds = (time.perf_counter() - start) / rounds
    start = time.perf_counter()
    sim.evaluate()
    evaluation = time.perf_counter() - start
    held = sum(t.held for t in sim.state.clients.values())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"clients": clients, "cohort": cohort, "model": model, "d": sim.grads.num_params, "s_round": seconds,
            "evaluation_s": evaluation, "held": held, "peak_mb": peak}


def cases(quick: bool) -> list[tuple[int, int, str]]:
    if quick:
        return [(10_000, 100, "logreg"), (20_000, 100, "logreg"), (20_000, 200, "logreg")]
    return [(clients, 1_000, model) for model in MODELS for clients in (10_000, 100_000)] + \
        [(100_000, cohort, model) for model in MODELS for cohort in (250, 500)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="run.device (default cpu)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds a case (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--quick", action="store_true", help="2 x 10^4 clients, logreg: about a minute")
    parser.add_argument("--folder", default=None, help="where the populations are written (default: a temporary "
                                                       "folder, removed after)")
    parser.add_argument("--case", nargs=3, metavar=("CLIENTS", "COHORT", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path.insert(0, SRC)
    if args.case:
        clients, cohort, model = int(args.case[0]), int(args.case[1]), args.case[2]
        print(json.dumps(one_case(args.folder, clients, cohort, model, args.rounds, args.device, args.threads)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.folder or scratch)
        rows = []
        path = os.environ.get("PYTHONPATH")  # kept after this checkout's src: packages installed beside it
        for clients, cohort, model in cases(args.quick):
            folder = write_population(root / f"clients-{clients}", clients)
            out = subprocess.run([sys.executable, __file__, "--case", str(clients), str(cohort), model, "--folder",
                                  str(folder), "--rounds", str(args.rounds), "--device", args.device, "--threads",
                                  str(args.threads)], capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, path]))})
            if out.returncode:
                sys.exit(f"case {clients} / {cohort} / {model} failed:\n{out.stderr[-3000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"{model} {clients:,} clients, cohort {cohort:,}: {rows[-1]['s_round']:.3g} s/round",
                  file=sys.stderr, flush=True)
    print("\n| clients | cohort | model (d) | s/round | s/round per 1,000 of cohort | evaluation (s) | clients holding "
          "state | peak memory (MB) |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['clients']:,} | {r['cohort']:,} | {r['model']} ({r['d']:,}) | {r['s_round']:.3g} | "
              f"{1000 * r['s_round'] / r['cohort']:.3g} | {r['evaluation_s']:.3g} | {r['held']:,} | "
              f"{r['peak_mb']:,.0f} |")


if __name__ == "__main__":
    main()
