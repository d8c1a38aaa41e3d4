"""What a Python caller hands a run besides its config (``dpfl.run(config, model=..., loss=..., data=...)``): a torch
module, a per-example loss, records; and their fingerprint, which puts them in the run's release config.

The config names them: ``model.name = "custom"`` stands for a module, ``data.name = "arrays"`` for records (arrays,
federated by the config's [data] keys exactly as an npz file's arrays are, ``files.federate_arrays``; or a
``FederatedDataset``, used as it is). The privacy accounting is the config run's: it reads only the data's counts
and the config, never the module (except its number of parameters, for an algorithm whose noise depends on it).

``Supplied.fingerprint`` is the config's ``supplied`` section. It is part of the release config
(``run_directory.release_hash``), so run.json records it and a resume refuses another module, loss or data, naming the key
that differs: the module's class, its architecture (its repr and every parameter's and buffer's name, shape and
type), its initial parameters (they decide every round's release, as run.seed does for a built-in model), the loss
(its name, and a digest of its source or settings) and the records (sha256 of the arrays, or of the data set's
tensors and provenance).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from dpfl.data.federated import FederatedDataset
from dpfl.data.files import NPZ_ARRAYS, federate_arrays
from dpfl.data.preprocess import rescale
from dpfl.engine.grads import CohortGradients, check_layers
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.models import CUSTOM

#: The config section that records what was supplied (not a schema section: ``dpfl.run`` writes it).
SECTION = "supplied"
#: ``data.name`` of records handed to ``dpfl.run``.
ARRAYS = "arrays"
#: How ``data`` may be given.
DATA_FORMS = ("(x, y), (x, y, client ids), a dict of the arrays 'x', 'y', optionally 'client' and 'split' (as in an "
              "npz file), or a FederatedDataset")


@dataclass(frozen=True)
class Supplied:
    """A caller's module, per-example loss and records (each None when the config's own is used); build with
    ``Supplied.of``, which checks them."""

    model: nn.Module | None = None
    loss: Callable | None = None
    data: dict[str, np.ndarray] | FederatedDataset | None = None

    @classmethod
    def of(cls, model=None, loss=None, data=None) -> Supplied:
        """Checks the objects (ConfigError naming ``model``, ``loss`` or ``data``); arrays become numpy arrays named
        as an npz file's (``x``, ``y``, ``client``, ``split``). A module's layers are checked here, before any data is
        built (``grads.check_layers``)."""
        if model is not None:
            if not isinstance(model, nn.Module):
                raise ConfigError("model", type(model).__name__, "a torch.nn.Module mapping records [N, ...] to logits "
                                                                 "[N, classes]")
            check_layers(model)
        if loss is not None and not callable(loss):
            raise ConfigError("loss", type(loss).__name__, "a per-example loss(outputs [N, C], labels [N]) -> [N]")
        return cls(model, loss, None if data is None else _arrays(data))

    def __bool__(self) -> bool:
        return self.model is not None or self.loss is not None or self.data is not None

    def names(self) -> dict[str, str]:
        """{section: name} the config must give what was supplied: model.name 'custom', data.name 'arrays'."""
        return {**({"model": CUSTOM} if self.model is not None else {}),
                **({"data": ARRAYS} if self.data is not None else {})}

    @functools.cached_property
    def fingerprint(self) -> dict:
        """The config's ``supplied`` section (see the module docstring); empty when nothing is supplied."""
        found: dict = {}
        if self.model is not None:
            found.update(_model_fingerprint(self.model))
        if self.loss is not None:
            found.update(loss=_name(self.loss), loss_sha256=_digest(_loss_text(self.loss)))
        if isinstance(self.data, FederatedDataset):
            found.update(data="FederatedDataset", data_sha256=_dataset_digest(self.data))
        elif self.data is not None:
            found.update(data=ARRAYS, data_arrays=", ".join(f"{k} {list(a.shape)} {a.dtype}" for k, a in
                                                           self.data.items()), data_sha256=_arrays_digest(self.data))
        return found

    def check(self, config: dict) -> None:
        """Refuses a config that does not name what was supplied (model.name 'custom' exactly when a module is,
        data.name 'arrays' exactly when records are), whose ``supplied`` section is not their fingerprint, or whose
        [data] keys would be ignored (a FederatedDataset is used as it is)."""
        for section, name, what in (("model", CUSTOM, "a module (dpfl.run(config, model=...))"),
                                    ("data", ARRAYS, "records (dpfl.run(config, data=...))")):
            given = config[section]["name"]
            if given == name and section not in self.names():
                raise ConfigError(f"{section}.name", given, f"another name: {name!r} stands for {what}, and none "
                                                            "was given")
            if given != name and section in self.names():
                raise ConfigError(f"{section}.name", given, f"{name!r} when {what} is given (dpfl.run sets it when "
                                                            "the config is a path or a dict of sections)")
        if config.get(SECTION, {}) != self.fingerprint:
            raise ConfigError(SECTION, config.get(SECTION), f"the fingerprint of what was supplied, {self.fingerprint} "
                                                            "(dpfl.run writes it)")
        if isinstance(self.data, FederatedDataset):
            _check_unused_data_keys(config["data"])

    def dataset(self, data_cfg: Mapping) -> FederatedDataset:
        """The supplied records as a federated data set: a FederatedDataset as it is; arrays partitioned, split and
        preprocessed by the config's [data] keys (``data_cfg``) exactly as an npz file's arrays
        (``sources.build_dataset``)."""
        if isinstance(self.data, FederatedDataset):
            return self.data
        source = {"name": ARRAYS, "format": "arrays", "arrays": sorted(self.data),
                  "num_records": int(len(self.data["y"])), "sha256": self.fingerprint["data_sha256"]}
        return rescale(federate_arrays(
            self.data, ARRAYS, source, bounds=data_cfg["bounds"],
            check_scale=data_cfg["scale"] == 1 and data_cfg["standardize"] == "none",
            num_clients=data_cfg["num_clients"], partition=data_cfg["partition"],
            partition_param=data_cfg["partition_param"], samples_per_client=data_cfg["samples_per_client"],
            seed=data_cfg["seed"], test_fraction=data_cfg["test_fraction"], standardize_scope=data_cfg["standardize"],
            label_map=data_cfg["labels"]), data_cfg["scale"])

    def check_model(self, model: nn.Module, dataset: FederatedDataset) -> None:
        """Tries ``model`` with the supplied loss on two training records (``CohortGradients.check``), when a module
        or a loss was supplied (dpfl's own pair needs no trial)."""
        if self.model is None and self.loss is None:
            return
        train = dataset.train
        first = int(torch.nonzero(train.counts)[0, 0])
        if int(train.counts[first]) >= 2:
            x, y = train.x[first, :2], train.y[first, :2]
        else:  # one record per client: the first record of two clients
            rows = torch.nonzero(train.counts)[:2, 0]
            x, y = train.x[rows, 0], train.y[rows, 0]
        CohortGradients(model, loss=self.loss).check(x, y, dataset.num_classes)


def _arrays(data) -> dict[str, np.ndarray] | FederatedDataset:
    """``data`` as npz-named numpy arrays, or the FederatedDataset it is."""
    if isinstance(data, FederatedDataset):
        return data
    if isinstance(data, Mapping):
        unknown = sorted(set(map(str, data)) - set(NPZ_ARRAYS))
        if unknown or not {"x", "y"} <= set(data):
            raise ConfigError("data", f"a dict of {', '.join(sorted(map(str, data)))}", DATA_FORMS)
        named = dict(data)
    elif isinstance(data, (tuple, list)) and len(data) in (2, 3):
        named = dict(zip(("x", "y", "client"), data))
    else:
        raise ConfigError("data", type(data).__name__, DATA_FORMS)
    return {k: np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in named.items()}


def _check_unused_data_keys(data_cfg: dict) -> None:
    """A FederatedDataset is already partitioned, split and preprocessed: a [data] key set away from its default
    would be silently ignored, so it is refused."""
    defaults = load_config({"data": {"name": ARRAYS}})["data"]
    for key, value in data_cfg.items():
        if value != defaults[key]:
            raise ConfigError(f"data.{key}", value, f"{defaults[key]!r} (its default): data= is a FederatedDataset, "
                                                    "already partitioned, split and preprocessed; the [data] keys "
                                                    "shape arrays only")


def _model_fingerprint(model: nn.Module) -> dict:
    tensors = [*model.named_parameters(), *model.named_buffers()]
    architecture = repr(model) + "".join(f"\n{n} {list(t.shape)} {t.dtype}" for n, t in tensors)
    initial = hashlib.sha256()
    for _, t in tensors:
        initial.update(t.detach().cpu().contiguous().numpy().tobytes())
    return {"model": f"{type(model).__module__}.{type(model).__qualname__}",
            "model_parameters": sum(p.numel() for p in model.parameters()),
            "model_architecture_sha256": _digest(architecture), "model_init_sha256": initial.hexdigest()}


def _name(loss: Callable) -> str:
    named = loss if hasattr(loss, "__qualname__") else type(loss)
    return f"{getattr(named, '__module__', '')}.{named.__qualname__}".lstrip(".")


def _loss_text(loss: Callable) -> str:
    """A function's source (its name where Python has none); an object's repr and public settings."""
    if inspect.isfunction(loss) or inspect.ismethod(loss):
        try:
            return inspect.getsource(loss)
        except (OSError, TypeError):
            return _name(loss)
    settings = {k: repr(v) for k, v in sorted(vars(loss).items()) if not k.startswith("_")} \
        if hasattr(loss, "__dict__") else {}
    return repr(loss) + json.dumps(settings, sort_keys=True)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _update(digest, name: str, array: np.ndarray) -> None:
    """One array into ``digest``: its name, dtype and shape, then its bytes (C order)."""
    digest.update(f"{name} {array.dtype.str} {list(array.shape)}\n".encode())
    digest.update(np.ascontiguousarray(array).tobytes())


def _arrays_digest(arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = arrays[name]
        _update(digest, name, array.astype(str) if array.dtype.kind == "O" else array)
    return digest.hexdigest()


def _dataset_digest(dataset: FederatedDataset) -> str:
    digest = hashlib.sha256()
    for split, arrays in (("train", dataset.train), ("test", dataset.test)):
        for name in ("x", "y", "counts"):
            _update(digest, f"{split}.{name}", getattr(arrays, name).numpy())
    digest.update(json.dumps({"num_classes": dataset.num_classes, "info": dataset.info}, sort_keys=True,
                             default=str).encode())
    return digest.hexdigest()


#: Nothing supplied: the config's own model, loss and data.
NOTHING = Supplied()

__all__ = ["SECTION", "ARRAYS", "Supplied", "NOTHING"]
