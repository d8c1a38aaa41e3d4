"""A silo's own state, kept next to its data and never sent: its noise key, its data's fingerprint, and what each round
it answered was computed on.

On Flower a silo draws its noise itself, from streams named by a key only it holds (``dpfl.engine.keys``): the silo's
secret (``noise.key``, 256 bits of the OS's entropy, created on its first round, owner-only), from which it derives one
key per run, ``derived_key(secret, release sha256, run id)`` (the run id is the ServerApp's public run.json
``run_id``), so no two runs share noise. The ServerApp sends nothing from which noise can be derived: its config
carries ``run.seed``, which seeds public randomness only. In the research mode (``run.noise_seed``) every silo uses
that seed instead, as ``dpfl run`` does (and the run says that its epsilons hold only against observers who do not
know it).

Replaying noise is safe only onto the same computation, so the silo refuses to answer (``SiloStateError``, before any
noise is drawn)

* a round of a run it already answered with another input (the server state and client state it was sent): the same
  noise on two different computations would cancel in their difference; the same input gets the same reply, which
  releases nothing new (a resumed round);
* when its data changed since its first round (the SHA-256 of the records it trains on): its key would draw the same
  noise onto other data;
* when it has answered rounds but its key is gone: a new key would draw fresh noise onto computations whose noise was
  already released, which the server's ledger did not charge.

With secure aggregation on Flower (``dpfl.flower.secure_sum``) the silo also keeps a journal of its secure
aggregations (``secagg.json``), written before each answer leaves the node, so that no re-sent message and no
restart can make it answer twice:

* per run id, the release config (its sha256) and the default policy it gave at the run's first secure aggregation
  (``secagg_defaults``): the run id coming back with another release config is refused;
* per round, the setup of the aggregation under way (its SHA-256) and the last stage it answered (``secagg_stage``):
  each stage is answered once and in order, and once the silo has sent its masked input for a round it takes part
  in no other secure aggregation of that round, ever (a second sum of the same inputs over another survivor set
  would give the server a client's input as the difference). Before that, nothing about its input has left the
  silo, and an aggregation of the round may start again (a resumed round).

The state folder is the node config's ``state-dir``, by default the silo file's path with ``.dpfl-state`` appended.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from dpfl.durable import write_text_atomically
from dpfl.engine.keys import KEY_FILE, derived_key, fresh_key, load_key, save_key
from dpfl.errors import DpflError

#: The suffix of a silo file's default state folder.
STATE_SUFFIX = ".dpfl-state"
DATA_FILE = "data.sha256"
JOURNAL_FILE = "rounds.json"
SECAGG_FILE = "secagg.json"


class SiloStateError(DpflError):
    """A silo refuses a round (see the module docstring); the message says why and what to do."""


def data_fingerprint(x: torch.Tensor, y: torch.Tensor) -> str:
    """SHA-256 of the records a silo trains on (their shapes, dtypes and bytes)."""
    digest = hashlib.sha256()
    for value in (x, y):
        value = value.detach().contiguous()
        digest.update(f"{tuple(value.shape)}{value.dtype}".encode())
        digest.update(value.numpy().tobytes())
    return digest.hexdigest()


def input_digest(round_index: int, *parts: dict[str, torch.Tensor]) -> str:
    """SHA-256 of a round's input: its index and the named tensors it was sent (the server state, the client's rows)."""
    digest = hashlib.sha256(str(round_index).encode())
    for part in parts:
        for name, value in sorted(part.items()):
            value = value.detach().contiguous()
            for piece in (name.encode(), f"{tuple(value.shape)}{value.dtype}".encode(), value.numpy().tobytes()):
                digest.update(len(piece).to_bytes(8, "little"))
                digest.update(piece)
    return digest.hexdigest()


@dataclass
class SiloState:
    """The state folder of one silo (module docstring)."""

    directory: Path

    @classmethod
    def beside(cls, data_path: str | Path, state_dir: str | Path | None = None) -> "SiloState":
        """The state of the silo whose file is ``data_path`` (in ``state_dir``, or beside the file)."""
        return cls(Path(state_dir) if state_dir is not None else Path(str(data_path) + STATE_SUFFIX))

    def check_data(self, fingerprint: str) -> None:
        """Records the data's fingerprint on the first round; SiloStateError if it changed since."""
        path = self.directory / DATA_FILE
        if not path.exists():
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_text_atomically(path, fingerprint + "\n", "the silo's data fingerprint")
            return
        recorded = path.read_text().strip()
        if recorded != fingerprint:
            raise SiloStateError(
                f"this silo's data changed since its first round (SHA-256 {recorded[:12]}..., now {fingerprint[:12]}"
                f"...): its noise key would draw the same noise onto other records. Restore the data; or, for a new "
                f"study, move {self.directory} away (the privacy spent on the old data stays spent)")

    def run_key(self, release: str, run_id: str) -> int:
        """The silo's noise key for the run (release sha256, run id): derived from its secret, which is created on
        its first round; SiloStateError if the secret is gone after rounds were answered."""
        path = self.directory / KEY_FILE
        if not path.exists():
            if self._journal():
                raise SiloStateError(
                    f"this silo has answered rounds but its noise key {path} is gone: a new key would draw fresh noise "
                    "onto computations whose noise was already released, which the ledger did not charge. Restore "
                    f"the file; or, for a new study, move {self.directory} away")
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            save_key(path, fresh_key())
        return derived_key(load_key(path), release, run_id)

    def admit(self, release: str, run_id: str, round_index: int, digest: str) -> None:
        """Records that round ``round_index`` of the run is computed on the input ``digest``; SiloStateError if that
        round was answered before on another input (a replay is allowed only onto the same computation)."""
        journal = self._journal()
        rounds = journal.setdefault(f"{release}/{run_id}", {})
        recorded = rounds.get(str(round_index))
        if recorded is not None and recorded != digest:
            raise SiloStateError(
                f"round {round_index + 1} of this run was already answered on another input (server or client state): "
                "its noise would be drawn again onto a different computation, where the two replies' difference "
                "cancels it. Refused; a resumed run must send each round's original state")
        if recorded is None:
            rounds[str(round_index)] = digest
            self._write(JOURNAL_FILE, journal, "the silo's journal of rounds")

    def secagg_defaults(self, run_id: str, release: str, defaults: dict[str, int]) -> dict[str, int]:
        """The default secure aggregation policy of run ``run_id``: ``defaults`` (what its release config gives), as
        recorded at the run's first secure aggregation; SiloStateError if the run id arrives with another release
        config than it had then."""
        journal = self._journal(SECAGG_FILE)
        if run_id not in journal:
            journal[run_id] = {"release": release, "defaults": dict(defaults), "rounds": {}}
            self._write(SECAGG_FILE, journal, "the silo's journal of secure aggregations")
        run = journal[run_id]
        if run["release"] != release:
            raise SiloStateError(
                f"run {run_id} came with the release config {run['release'][:12]}... to this silo's first secure "
                f"aggregation of it, and now comes with {release[:12]}...: refused (the first fixed its policy)")
        return dict(run["defaults"])

    def secagg_stage(self, run_id: str, round_index: int, setup: str, stage: int, committed: int) -> None:
        """Records, before the answer leaves the silo, that it answers stage ``stage`` (the position in the round's
        stages) of the secure aggregation of round ``round_index`` of run ``run_id``, set up as ``setup``;
        SiloStateError for a stage out of order, answered before or of another setup than the aggregation under way,
        and for a new aggregation (stage 0) of a round in which the silo has answered the stage ``committed`` (its
        masked input). ``secagg_defaults`` must have recorded the run."""
        journal = self._journal(SECAGG_FILE)
        if run_id not in journal:
            raise SiloStateError(f"run {run_id} has no secure aggregation policy recorded (secagg_defaults first)")
        rounds, setup = journal[run_id]["rounds"], hashlib.sha256(setup.encode()).hexdigest()
        record = rounds.get(str(round_index))
        if stage == 0 and record is not None and record["answered"] >= committed:
            raise SiloStateError(
                f"this silo already sent its masked input in round {round_index + 1} of this run: it takes part in "
                "no other secure aggregation of that round (a second sum over other survivors would give the server "
                "a client's input as the difference)")
        if stage > 0 and (record is None or record["setup"] != setup or record["answered"] != stage - 1):
            last = "none" if record is None else f"stage {record['answered']}" + (
                "" if record["setup"] == setup else " of an aggregation set up differently")
            raise SiloStateError(
                f"stage {stage} of round {round_index + 1}'s secure aggregation out of order: this silo's last answer "
                f"in that round was {last} (each stage is answered once, in order)")
        rounds[str(round_index)] = {"setup": setup, "answered": stage}
        self._write(SECAGG_FILE, journal, "the silo's journal of secure aggregations")

    def _journal(self, name: str = JOURNAL_FILE) -> dict:
        path = self.directory / name
        if not path.exists():
            return {}
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise SiloStateError(f"{path} is damaged ({err}); this silo cannot tell which rounds it answered, so it "
                                 "answers none: restore the file") from None

    def _write(self, name: str, journal: dict, what: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_text_atomically(self.directory / name, json.dumps(journal, indent=1, sort_keys=True), what)


__all__ = ["SiloState", "SiloStateError", "STATE_SUFFIX", "data_fingerprint", "input_digest"]
