"""Scale-out: one workload through dpfl's in-process engine (`dpfl run`'s ``run_experiment``) and through Flower's
simulation runtime (``flwr.simulation.run_simulation``, one virtual SuperNode per client, ClientApps on Ray), with
per-round times, their ratio, and where Flower's time goes.

    PYTHONPATH=src /work/venv-flower/bin/python benchmarks/flower_scale.py               # 1,000 clients
    PYTHONPATH=src /work/venv-flower/bin/python benchmarks/flower_scale.py --clients 100  # a quick look

Workload: DP-FedAvg (Local SGD with per-example clipping and Gaussian noise), multinomial logistic regression on the
synthetic data, N clients with 20 records each, a fixed cohort of N/10 per round, 3 rounds, single-threaded torch.
Flower's ClientApps run on 2 Ray actors (one CPU each). The Flower run's model and ledger equal the in-process
run's (``tests/flower``); only the time differs.

Where Flower's time goes (timers, not a profiler: the ServerApp runs in a thread and the ClientApps in Ray worker
processes): on the server, "encode" (the train messages' records: ``records.tensors_record``), "exchange" (from
sending the messages to the last reply: Flower's message routing, Ray actor dispatch and the clients' work), "decode"
(the replies' tensors and drawn events); on the clients, each train call split into "silo" (reading the silo's
file), "build" (the algorithm and model, once per job and actor) and "client_round" (the algorithm's work), written
by the actors to a timing file. "dispatch" = exchange - (summed client train time / actors): what Flower and Ray add.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from unittest import mock

import torch

ACTORS = 2


def config_of(clients: int, rounds: int) -> dict:
    from dpfl.experiments.config import load_config

    text = (f'[data]\nname = "synthetic"\nnum_clients = {clients}\nsamples_per_client = 25\n\n'
            f'[algorithm]\nname = "dp-fedavg"\nrounds = {rounds}\nlocal_steps = 2\nclient_rate = 0.1\n'
            'client_sampling = "fixed"\nsample_rate = 0.5\nlr = 0.5\nclip = 1.0\nnoise_multiplier = 1.0\n\n'
            '[run]\nthreads = 1\n')
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as file:
        file.write(text)
    try:
        return load_config(file.name)
    finally:
        os.unlink(file.name)


class Timers:
    """Each call's seconds, per label; ``wrap`` times a function or method in place."""

    def __init__(self):
        self.calls = defaultdict(list)

    @contextlib.contextmanager
    def timing(self, label: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.calls[label].append(time.perf_counter() - start)

    def total(self, label: str) -> float:
        return sum(self.calls[label])

    def wrap(self, owner, name: str, label: str):
        """A context in which ``owner.name`` is timed as ``label``."""
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            with self.timing(label):
                return original(*args, **kwargs)

        return mock.patch.object(owner, name, timed)


def timed_client_app(silo_template: str, timing_file: str):
    """dpfl's ClientApp whose train calls time their parts into ``timing_file`` (one JSON line per call)."""
    from flwr.clientapp import ClientApp

    from dpfl.flower import client_app as dpfl_client

    app = ClientApp()
    run_config = {"silo-path": silo_template}

    @app.query()
    def query(msg, context):
        start = time.perf_counter()
        reply = dpfl_client.identify(msg, context, run_config)
        with open(timing_file, "a") as out:
            out.write(json.dumps({"pid": os.getpid(), "query": time.perf_counter() - start, "at": time.time()}) + "\n")
        return reply

    @app.train()
    def train(msg, context):
        parts = Timers()
        with parts.wrap(dpfl_client, "node_silo", "silo"), parts.wrap(dpfl_client, "algorithm_of", "build"), \
                parts.timing("train"):
            reply = dpfl_client.train(msg, context, run_config)
        seconds = {label: parts.total(label) for label in ("train", "silo", "build")}
        seconds["client_round"] = seconds["train"] - seconds["silo"] - seconds["build"]
        with open(timing_file, "a") as out:
            out.write(json.dumps({"pid": os.getpid(), **seconds}) + "\n")
        return reply

    return app


def in_process(config: dict, folder: Path) -> list[float]:
    from dpfl.engine.simulator import Simulation
    from dpfl.experiments.runner import run_experiment

    timers = Timers()
    with timers.wrap(Simulation, "step", "round"):  # one round: sampling, ledger, client work, sum, server step
        run_experiment(config, folder / "in-process")
    return timers.calls["round"]


def on_flower(config: dict, folder: Path) -> tuple[list[float], Timers, list[dict], float]:
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.simulation import run_simulation

    from dpfl.engine.simulator import Simulation
    from dpfl.experiments.assembly import build_data
    from dpfl.flower import records, server_app
    from dpfl.flower.app_dir import app_config
    from dpfl.flower.federation import Federation

    timers = Timers()
    timing_file = folder / "client-times.jsonl"
    carried = app_config(config, Federation.of_dataset(build_data(config["data"])))  # what `dpfl flower-app` writes
    run_config = {"dpfl-config": json.dumps(carried), "out": str(folder / "flower"), "round-timeout": 600.0}
    start, started_at = time.perf_counter(), time.time()
    with contextlib.ExitStack() as timed:
        for owner, name, label in [(Simulation, "step", "round"), (records, "tensors_record", "encode"),
                                   (records, "tensors_of", "decode"), (records, "events_of", "decode"),
                                   (server_app.FlowerCohort, "_exchange", "exchange"),
                                   (server_app.FlowerCohort, "connect", "connect"),
                                   (InMemoryLinkState, "get_message_ins", "routing scan"),
                                   (RayBackend, "process_message", "ray call")]:
            timed.enter_context(timers.wrap(owner, name, label))
        run_simulation(server_app.server_app(run_config),
                       timed_client_app(str(folder / "silo-{partition-id}.npz"), str(timing_file)),
                       num_supernodes=config["data"]["num_clients"],
                       backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": ACTORS}})
    total = time.perf_counter() - start
    calls = [json.loads(line) for line in timing_file.read_text().splitlines()]
    clients = [c for c in calls if "train" in c]
    timers.calls["client query"] = [c["query"] for c in calls if "query" in c]
    timers.first_client_call = min(c["at"] for c in calls if "at" in c) - started_at
    rounds = list(timers.calls["round"])
    rounds[0] -= timers.total("connect")  # the first round connects first: every node is asked its client id
    return rounds, timers, clients, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from dpfl.experiments.assembly import build_data
    from dpfl.flower.silo import write_silos

    torch.set_num_threads(1)
    config = config_of(args.clients, args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_silos(build_data(config["data"]), folder)
        local = in_process(config, folder)
        flower, timers, clients, total = on_flower(config, folder)
        same = [r["epsilon"] for r in json.loads((folder / "flower" / "results.json").read_text())["rounds"]] == \
            [r["epsilon"] for r in json.loads((folder / "in-process" / "results.json").read_text())["rounds"]]
    cohort = int(round(0.1 * args.clients))
    print(f"{args.clients} clients, cohort {cohort}, {args.rounds} rounds of dp-fedavg (logreg, synthetic), "
          f"{ACTORS} Ray actors")
    print("round   in-process s   Flower s   ratio")
    for r, (a, b) in enumerate(zip(local, flower), start=1):
        print(f"{r:5d}   {a:12.3f}   {b:8.2f}   {b / a:7.0f}x")
    print(f"median  {statistics.median(local):12.3f}   {statistics.median(flower):8.2f}   "
          f"{statistics.median(flower) / statistics.median(local):7.0f}x   (epsilons equal: {same})")
    print(f"Flower: run_simulation {total:.1f} s in all; connecting (a query to each of the {args.clients} nodes, "
          f"before round 1, not in its time above) {timers.total('connect'):.1f} s, of which the queries' own "
          f"work (reading the silo) {timers.total('client query') / ACTORS:.1f} s per actor; the first ClientApp call "
          f"ran {timers.first_client_call:.1f} s after run_simulation started (Ray and its actors starting, each "
          "importing torch and dpfl)")
    print(f"Flower's routing thread (vce add_messages_to_queue: every 0.1 s, for each of the {args.clients} nodes, "
          f"a scan of all undelivered and unanswered messages): {len(timers.calls['routing scan'])} scans, "
          f"{timers.total('routing scan'):.1f} s in all; Ray calls (send to an actor, run, return): "
          f"{len(timers.calls['ray call'])}, median {statistics.median(timers.calls['ray call']) * 1e3:.0f} ms")
    n = len(flower)
    exchange = sum(timers.calls["exchange"][-n:]) / n  # the rounds' (the connect's queries come first)
    client = {label: sum(c[label] for c in clients) / n / ACTORS for label in ("train", "silo", "build",
                                                                               "client_round")}
    encode, decode = timers.total("encode") / n, timers.total("decode") / n
    print("where a Flower round's time goes (seconds per round, mean over the rounds):")
    for label, seconds in [("server: encode the train messages", encode),
                           ("server: exchange (first send .. last reply)", exchange),
                           ("  clients' train calls / actors", client["train"]),
                           ("    silo file reads", client["silo"]),
                           ("    algorithm + model builds", client["build"]),
                           ("    client_round (the algorithm's work)", client["client_round"]),
                           ("  Flower + Ray dispatch (the rest)", exchange - client["train"]),
                           ("server: decode the replies", decode),
                           ("server: the rest (ledger, sum, server step)", sum(flower) / n - encode - exchange
                            - decode)]:
        print(f"  {label:<46} {seconds:8.3f}")
    print(f"  ({len(clients)} train calls on {len({c['pid'] for c in clients})} actor processes)")


if __name__ == "__main__":
    main()
