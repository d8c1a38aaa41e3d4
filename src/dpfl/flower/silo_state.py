"""A silo's own state, kept next to its data and never sent: its noise key and its journal (``silo_journal``) of
what it committed to: its data's fingerprint, each round it answered and on which input (with the run's epsilon then),
each secure aggregation stage it answered.

On Flower a silo draws its noise itself, from streams named by a key only it holds (``dpfl.engine.keys``): the silo's
secret (``noise.key``, 256 bits of the OS's entropy, created on its first round, owner-only), from which it derives one
key per run, ``derived_key(secret, release sha256, run id)`` (the run id is the ServerApp's public run.json
``run_id``), so no two runs share noise. The ServerApp sends nothing from which noise can be derived: its config
carries ``run.seed``, which seeds public randomness only. The research mode (``run.noise_seed``: every party draws
from that seed, as ``dpfl run`` does) is the silo's choice, never the server's (``dpfl.flower.pin``).

**Noise bound to the computation.** A round's noise (the streams of ``NOISE_PURPOSES``) is drawn from
``bound_key(run key, data fingerprint, input digest)``: the run's key, the SHA-256 of the silo's records and of the
round's input (its index, the server state and client rows it was sent). One key can therefore never draw the same
noise onto two different computations, whatever the server re-sends and even if the journal below were lost. The
record sampling streams stay on the run's key: some algorithms fix them across rounds (an epoch's permutation), and
replaying them onto another computation is what the journal refuses.

Replaying noise is safe only onto the same computation, so the silo refuses to answer (``SiloStateError``, before any
noise is drawn)

* a round of a run it already answered with another input (the server state and client state it was sent); the same
  input gets the same reply, which releases nothing new (a resumed round);
* when its data changed since its first round (the SHA-256 of the records it trains on);
* when it has answered rounds but its key is gone, or its key exists but its journal is gone, truncated, rolled back
  or edited (``silo_journal``: hash-chained, its head beside the key).

With secure aggregation on Flower (``dpfl.flower.secure_sum``) the journal also records, before each answer leaves the
node, so that no re-sent message and no restart can make it answer twice:

* per run id, the release config (its sha256) and the default policy it gave at the run's first secure aggregation
  (``secagg_defaults``): the run id coming back with another release config is refused;
* per round, the setup of the aggregation under way (its SHA-256) and each stage it answered (``secagg_stage``):
  each stage is answered once and in order, and once the silo has sent its masked input for a round it takes part
  in no other secure aggregation of that round, ever (a second sum of the same inputs over another survivor set
  would give the server a client's input as the difference). Before that, nothing about its input has left the
  silo, and an aggregation of the round may start again (a resumed round).

The state folder is the node config's ``state-dir``, by default the silo file's path with ``.dpfl-state`` appended;
`dpfl silo status STATE_DIR` prints what its journal holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dpfl.engine.keys import KEY_FILE, derived_key, fresh_key, load_key, save_key
from dpfl.errors import DpflError
from dpfl.flower.silo_journal import HEAD_FILE, JOURNAL_FILE, JournalError, SiloJournal

#: The suffix of a silo file's default state folder.
STATE_SUFFIX = ".dpfl-state"
#: The purposes whose streams a round draws from its input-bound key (``bound_key``); the others use the run's key.
NOISE_PURPOSES = ("noise", "rounding")
#: The files of an earlier dpfl's silo state (before the journal).
LEGACY_FILES = ("data.sha256", "rounds.json", "secagg.json")


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
    """The state folder of one silo (module docstring): its noise key and its journal (``SiloJournal``)."""

    directory: Path

    @classmethod
    def beside(cls, data_path: str | Path, state_dir: str | Path | None = None) -> "SiloState":
        """The state of the silo whose file is ``data_path`` (in ``state_dir``, or beside the file)."""
        return cls(Path(state_dir) if state_dir is not None else Path(str(data_path) + STATE_SUFFIX))

    @property
    def journal(self) -> SiloJournal:
        return SiloJournal(self.directory)

    def check_data(self, fingerprint: str) -> None:
        """Records the data's fingerprint on the first round; SiloStateError if it changed since."""
        recorded = [e["sha256"] for e in self._entries() if e["kind"] == "data"]
        if not recorded:
            self.journal.append({"kind": "data", "sha256": fingerprint})
        elif recorded[0] != fingerprint:
            raise SiloStateError(
                f"this silo's data changed since its first round (SHA-256 {recorded[0][:12]}..., now "
                f"{fingerprint[:12]}...): its noise key would draw noise onto other records. Restore the data; or, "
                f"for a new study, move {self.directory} away (the privacy spent on the old data stays spent)")

    def run_key(self, release: str, run_id: str) -> int:
        """The silo's noise key for the run (release sha256, run id): derived from its secret, which is created on
        its first round (after its journal); SiloStateError if the secret is gone after rounds were answered."""
        path = self.directory / KEY_FILE
        if not path.exists():
            if any(e["kind"] == "round" for e in self._entries()):
                raise SiloStateError(
                    f"this silo has answered rounds but its noise key {path} is gone: a new key would draw fresh noise "
                    "onto computations whose noise was already released, which the ledger did not charge. Restore "
                    f"the file; or, for a new study, move {self.directory} away")
            save_key(path, fresh_key())
        return derived_key(load_key(path), release, run_id)

    def admit(self, release: str, run_id: str, round_index: int, digest: str,
              epsilon: dict[str, float | None] | None = None,
              before_new: Callable[[list[dict]], None] | None = None) -> None:
        """Records that round ``round_index`` of the run is computed on the input ``digest`` (and the run's epsilon
        per observer through that round, ``epsilon``); SiloStateError if that round was answered before on another
        input (a replay is allowed only onto the same computation). ``before_new(rounds)``, given the rounds recorded
        so far (``rounds``), may refuse a round not recorded yet (a replay releases nothing new), e.g. by the silo's
        budget."""
        run = f"{release}/{run_id}"
        rounds = [e for e in self._entries() if e["kind"] == "round"]
        recorded = [e["input"] for e in rounds if e["run"] == run and e["round"] == round_index]
        if recorded and recorded[0] != digest:
            raise SiloStateError(
                f"round {round_index + 1} of this run was already answered on another input (server or client state): "
                "its noise would be drawn again onto a different computation, where the two replies' difference "
                "cancels it. Refused; a resumed run must send each round's original state")
        if not recorded:
            if before_new is not None:
                before_new(rounds)
            self.journal.append({"kind": "round", "run": run, "round": round_index, "input": digest,
                                 "epsilon": epsilon})

    def secagg_defaults(self, run_id: str, release: str, defaults: dict[str, int]) -> dict[str, int]:
        """The default secure aggregation policy of run ``run_id``: ``defaults`` (what its release config gives), as
        recorded at the run's first secure aggregation; SiloStateError if the run id arrives with another release
        config than it had then."""
        recorded = [e for e in self._entries() if e["kind"] == "secagg-run" and e["run"] == run_id]
        if not recorded:
            recorded = [self.journal.append({"kind": "secagg-run", "run": run_id, "release": release,
                                             "defaults": dict(defaults)})]
        if recorded[0]["release"] != release:
            raise SiloStateError(
                f"run {run_id} came with the release config {recorded[0]['release'][:12]}... to this silo's first "
                f"secure aggregation of it, and now comes with {release[:12]}...: refused (the first fixed its policy)")
        return dict(recorded[0]["defaults"])

    def secagg_stage(self, run_id: str, round_index: int, setup: str, stage: int, committed: int) -> None:
        """Records, before the answer leaves the silo, that it answers stage ``stage`` (the position in the round's
        stages) of the secure aggregation of round ``round_index`` of run ``run_id``, set up as ``setup``;
        SiloStateError for a stage out of order, answered before or of another setup than the aggregation under way,
        and for a new aggregation (stage 0) of a round in which the silo has answered the stage ``committed`` (its
        masked input). ``secagg_defaults`` must have recorded the run."""
        entries = self._entries()
        if not any(e["kind"] == "secagg-run" and e["run"] == run_id for e in entries):
            raise SiloStateError(f"run {run_id} has no secure aggregation policy recorded (secagg_defaults first)")
        setup = hashlib.sha256(setup.encode()).hexdigest()
        stages = [e for e in entries if e["kind"] == "secagg-stage" and e["run"] == run_id and
                  e["round"] == round_index]
        record = stages[-1] if stages else None
        if stage == 0 and any(e["answered"] >= committed for e in stages):
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
        self.journal.append({"kind": "secagg-stage", "run": run_id, "round": round_index, "setup": setup,
                             "answered": stage})

    def rounds(self) -> list[dict]:
        """The rounds this silo answered, in order: {"run": release/run id, "round", "input", "epsilon"}."""
        return [e for e in self._entries() if e["kind"] == "round"]

    def _entries(self) -> list[dict]:
        """The journal's entries; a silo's first call starts the journal (before its key exists). SiloStateError for
        state that an earlier dpfl wrote, JournalError for a journal that cannot be trusted (a key without one
        included)."""
        journal = self.journal
        if not journal.exists and not journal.path.exists():
            legacy = sorted(name for name in LEGACY_FILES if (self.directory / name).exists())
            if legacy:
                raise SiloStateError(
                    f"{self.directory} holds the state of an earlier dpfl ({', '.join(legacy)}) without a journal: "
                    "finish that study with the dpfl that began it, or move the folder away for a new one")
            if (self.directory / KEY_FILE).exists():
                raise JournalError(f"this silo's journal cannot be trusted: its noise key {self.directory / KEY_FILE} "
                                   f"exists but its journal ({JOURNAL_FILE}, {HEAD_FILE}) is gone. Without it the "
                                   "silo cannot tell which rounds it answered, so it answers none. Restore the state "
                                   f"folder {self.directory} as it was; or, for a new study, move it away")
            journal.start()
        return journal.entries()


def bound_key(run_key: int, fingerprint: str, digest: str) -> int:
    """The key of a round's noise (module docstring, "Noise bound to the computation"): the run's key, the data's
    fingerprint and the round's input digest (``input_digest``), so that one key can never draw noise twice for two
    different computations, also when the journal that refuses them is gone."""
    return derived_key(run_key, "round input", fingerprint, digest)


__all__ = ["SiloState", "SiloStateError", "STATE_SUFFIX", "NOISE_PURPOSES", "data_fingerprint", "input_digest",
           "bound_key"]
