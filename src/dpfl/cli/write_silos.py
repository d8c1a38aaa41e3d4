"""`dpfl write-silos CONFIG.toml [--set key=value ...] --out DIR`: one silo file per client of the config's data
(``DIR/silo-{i}.npz``: client i's training and test records, with its client id and a split column), the files the
SuperNodes of a Flower
deployment read (``dpfl.flower.silo``), for a test bed or a rehearsal on the config's own data; and each silo's
secure aggregation signing key with the registry of their public keys (``DIR/secagg``: ``dpfl.flower.enrolment``),
so that the test bed runs the actively secure variant. Prints each silo's node config, which pins the release
config that `dpfl flower-app` writes for the same config and overrides (``release-sha256``: ``dpfl.flower.pin``): the
silos answer that release and no other. Needs no flwr."""

from __future__ import annotations

import sys
from pathlib import Path

from dpfl.cli.common import add_config_keys
from dpfl.errors import ConfigError


def configure(commands) -> None:
    parser = commands.add_parser("write-silos", help="write one silo file per client of a config's data (for Flower "
                                                     "SuperNodes)", description=__doc__)
    parser.add_argument("config", help="the dpfl TOML config whose [data] section to split into silos")
    parser.add_argument("--out", required=True, help="the folder for silo-0.npz, silo-1.npz, ...")
    add_config_keys(parser, "override a config key, as in dpfl run (give `dpfl flower-app` the same ones: the "
                            "silos pin that release)")
    parser.set_defaults(handler=_write_silos)


def _write_silos(args) -> None:
    from dpfl.experiments.assembly import build_data
    from dpfl.flower.app_dir import app_config, check_enforced, flower_config
    from dpfl.flower.enrolment import FOLDER, enrol, node_config_text
    from dpfl.flower.federation import Federation
    from dpfl.flower.pin import PIN, release_sha256
    from dpfl.flower.silo import write_silos

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", str(out), "a directory (or a path to create one)")
    foreign = sorted(p.name for p in out.iterdir() if not (p.name.startswith("silo-") and p.suffix == ".npz")
                     and p.name != FOLDER) if out.exists() else []
    if foreign:
        raise ConfigError("--out", str(out), f"an empty directory or one holding only silo-*.npz files and {FOLDER}/ "
                                             f"(found {foreign[:5]})")
    config, _ = flower_config(args.config, args.overrides, args.unset)  # as `dpfl flower-app` carries it
    check_enforced(config)
    dataset = build_data(config["data"])
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("silo-*.npz"):  # a previous, larger federation's files would be read as clients
        stale.unlink()
    paths = write_silos(dataset, out)
    keys = enrol(out / FOLDER, range(len(paths)))
    counts = [int(c) for c in dataset.train.counts]
    pin = release_sha256(app_config(config, Federation.of_dataset(dataset)), counts)
    print(f"wrote {len(paths)} silo files to {out} (silo-0.npz .. silo-{len(paths) - 1}.npz: {min(counts)} to "
          f"{max(counts)} training records each) and their secure aggregation keys to {out / FOLDER}; each silo is "
          f"pinned to the release {pin[:12]}... that `dpfl flower-app {args.config}` (with the same --set / --unset) "
          "writes; start client i's SuperNode with --node-config:", file=sys.stderr)
    for i, path in enumerate(paths):
        print(f"  client {i}: '{node_config_text({'data-path': str(Path(path).resolve()), PIN: pin, **keys[i]})}'",
              file=sys.stderr)
