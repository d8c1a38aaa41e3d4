"""Cross-device next-word prediction at 10^5 users on one machine (issue 36, item 3).

The population: synthetic text in next-word's JSON lines (``dpfl.data.next_word.synthetic_users``: a Zipf vocabulary
of 2,000 words, per-user mixtures of 10 topics, 2 to 4 sentences of about 8 words a user), read once into next-word
records (a vocabulary of 1,000 words + 4 special tokens, 20 tokens a record) and written as a folder of stacked client
arrays (``dpfl.data.stacked``), then read memory-mapped (``data.name = "clients"``). Each case runs in a fresh
process (its peak resident memory is its own): build the run, one warm-up round, ``--rounds`` timed rounds without
evaluation, then (``--evaluate``) one evaluation, timed on its own: the engine's pass over every training record
(the train loss) and every test record (the accuracy), in pieces of 65,536 records, or (``--eval-clients N``) those of
a fixed sample of N users (run.eval_clients). dp-fedavg-user (fixed-size
cohorts of 1,000, K = 5 local steps of 20% of a user's records, clip 1, z = 1, noise at the server) with the small
causal transformer (d_model 32, 1 block, 2 heads) and a small LSTM (embedding 8, 1 x 64).

    PYTHONPATH=src python benchmarks/cross_device.py [--users 100000] [--cohort 1000] [--rounds 3] [--threads 1]
        [--evaluate [--eval-clients N]] [--folder DIR]

Prints a Markdown table: users, cohort, model (parameters), s/round (wall clock, and the process's CPU seconds: on
a shared machine the wall clock includes waiting for a core), one evaluation's seconds, clients holding state and
peak resident memory (MB) of the case, and, above it, the seconds and peak memory of building the folder.
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
MODELS = {"transformer": ["model.name='transformer'", "model.d_model=32", "model.layers=1", "model.heads=2"],
          "lstm": ["model.name='lstm'", "model.embedding=8", "model.units=64", "model.layers=1"]}
VOCABULARY, SEQUENCE_LENGTH = 1_000, 20


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_population(folder: Path, users: int) -> dict:
    """Writes the users' JSON lines and the stacked folder (``--build``, in its own process); its cost."""
    from dpfl.data import stacked
    from dpfl.data.next_word import synthetic_users, write_jsonl
    from dpfl.data.sources import build_dataset

    started = time.perf_counter()
    text = write_jsonl(folder / "text" / "users.jsonl",
                       synthetic_users(users, words=2_000, topics=10, sentences=(2, 4), mean_length=8.0, seed=0))
    written = time.perf_counter()
    dataset = build_dataset("next-word", num_clients=None, path=str(text), vocabulary=VOCABULARY,
                            sequence_length=SEQUENCE_LENGTH)
    stacked.save(dataset, folder / "clients")
    return {"users": users, "text_mb": text.stat().st_size / 2**20, "write_s": written - started,
            "build_s": time.perf_counter() - written, "records": int(dataset.train.counts.sum()),
            "max_records": int(dataset.train.y.shape[1]), "peak_mb": peak_mb()}


def one_case(folder: str, users: int, cohort: int, model: str, rounds: int, threads: int, evaluate: bool,
             eval_clients: int | None = None) -> dict:
    """One case in this process (``--case``): build, warm up, time ``rounds`` rounds and (``evaluate``) one
    evaluation (of ``eval_clients`` users: run.eval_clients; None: every user)."""
    from dpfl.experiments.config import load_config
    from dpfl.experiments.runner import build_simulation

    config = load_config(None, [
        "algorithm.name='dp-fedavg-user'", "data.name='clients'", f"data.path='{folder}'",
        f"algorithm.client_rate={cohort / users}", "algorithm.client_sampling='fixed'", "algorithm.clip=1.0",
        "algorithm.noise_multiplier=1.0", "algorithm.noise_at='server'", f"algorithm.rounds={rounds + 2}",
        "run.noise_seed=0", f"run.eval_every={10 ** 6}", f"run.threads={threads}", "run.device='cpu'",
        *([f"run.eval_clients={eval_clients}"] if eval_clients else []), *MODELS[model]])
    sim = build_simulation(config)
    sim.step()  # warm-up; then rounds alone (Simulation.run would evaluate after its last round)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        sim.step()
    seconds, cpu_seconds = (time.perf_counter() - start) / rounds, (time.process_time() - cpu) / rounds
    start, cpu = time.perf_counter(), time.process_time()
    if evaluate:
        sim.evaluate(epsilon=False)
    evaluation = time.perf_counter() - start if evaluate else None
    evaluation_cpu = time.process_time() - cpu if evaluate else None
    held = sum(t.held for t in sim.state.clients.values())
    return {"users": users, "cohort": cohort, "model": model, "d": sim.grads.num_params, "s_round": seconds,
            "cpu_s_round": cpu_seconds, "evaluation_s": evaluation, "evaluation_cpu_s": evaluation_cpu,
            "eval_clients": eval_clients or users, "held": held, "peak_mb": peak_mb()}


def _child(*args: str) -> dict:
    path = os.environ.get("PYTHONPATH")  # kept after this checkout's src: packages installed beside it
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, path]))})
    if out.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=100_000, help="the population (default 10^5)")
    parser.add_argument("--cohort", type=int, default=1_000, help="users a round (default 1,000)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds a case (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--evaluate", action="store_true", help="time one evaluation (a pass over every record)")
    parser.add_argument("--eval-clients", type=int, default=None,
                        help="evaluate on this many users (run.eval_clients; default: every user)")
    parser.add_argument("--folder", default=None, help="where the population is written (default: a temporary "
                                                       "folder, removed after)")
    parser.add_argument("--build", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path.insert(0, SRC)
    if args.build:
        print(json.dumps(write_population(Path(args.folder), args.users)))
        return
    if args.case:
        print(json.dumps(one_case(str(Path(args.folder) / "clients"), args.users, args.cohort, args.case, args.rounds,
                                  args.threads, args.evaluate, args.eval_clients)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.folder or scratch)
        common = ["--folder", str(root), "--users", str(args.users)]
        built = _child("--build", *common)
        print(f"{args.users:,} users: {built['text_mb']:.0f} MB of text written in {built['write_s']:.0f} s, "
              f"{built['records']:,} training records (at most {built['max_records']} a user) built and stored in "
              f"{built['build_s']:.0f} s, peak {built['peak_mb']:,.0f} MB", flush=True)
        rows = []
        for model in args.models:
            timing = ["--cohort", str(args.cohort), "--rounds", str(args.rounds), "--threads", str(args.threads)]
            evaluation = [*(["--evaluate"] if args.evaluate else []),
                          *(["--eval-clients", str(args.eval_clients)] if args.eval_clients else [])]
            rows.append(_child("--case", model, *common, *timing, *evaluation))
            print(f"{model}: {rows[-1]['s_round']:.3g} s/round", file=sys.stderr, flush=True)
    print("\n| users | cohort | model (d) | s/round | CPU s/round | evaluation: users, s (CPU s) | clients holding "
          "state | peak memory (MB) |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        evaluation = "-" if r["evaluation_s"] is None else \
            f"{r['eval_clients']:,}, {r['evaluation_s']:.3g} ({r['evaluation_cpu_s']:.3g})"
        print(f"| {r['users']:,} | {r['cohort']:,} | {r['model']} ({r['d']:,}) | {r['s_round']:.3g} | "
              f"{r['cpu_s_round']:.3g} | {evaluation} | {r['held']:,} | {r['peak_mb']:,.0f} |")


if __name__ == "__main__":
    main()
