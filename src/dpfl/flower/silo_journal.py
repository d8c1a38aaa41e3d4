"""A silo's journal: one append-only, hash-chained, fsynced file of everything the silo committed to (its data's
fingerprint, each round it answered and on which input, each secure aggregation stage it answered, its epsilon), with
its head recorded in a second file beside the noise key, so that a journal that is missing, truncated, rolled back or
swapped is refused like a missing key.

Why a chain and a head. A silo's refusals (a round re-sent on another input, a second secure aggregation of a round)
are only as good as its memory of what it answered: a server that can make it forget (a partial restore, ephemeral
storage, an operator cleaning up) gets the same round answered twice, and the difference of two answers is a
client's update. So

* each line is one JSON entry ``{"seq": n, "prev": h(n-1), ...}``, ``h(n)`` the SHA-256 of line n's bytes
  (``h(0)`` is the genesis line's); a line is appended and fsynced before the answer it records leaves the silo;
* the head, ``journal.head``, holds ``n h(n)`` of the last entry, rewritten atomically after each append. It is
  created before the noise key is (``SiloState``), so a silo with a key and no head has lost its journal;
* reading verifies the chain up to the head: a line changed, removed or reordered breaks it; a journal shorter than
  its head (truncated, or an older copy restored) does not reach it; a journal without a head, or a head without a
  journal, is refused. One line past the head is a crash between the append and the head's rewrite: it is kept and
  the head advanced (the answer it records may have left). A torn last line past the head (a crash mid-append,
  before its fsync returned, so before any answer left) is dropped.

What it cannot see: the whole state folder (key, head and journal together) replaced by an older copy. That needs a
counter the silo's storage cannot roll back (a TPM's monotonic counter, a remote log) and is outside what dpfl can
enforce; docs/flower.md says so.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from dpfl.durable import write_text_atomically
from dpfl.errors import DpflError

JOURNAL_FILE = "journal.jsonl"
HEAD_FILE = "journal.head"
#: The hash before the first entry.
GENESIS = "0" * 64


class JournalError(DpflError):
    """A silo's journal that cannot be trusted (missing, truncated, rolled back, damaged); the message says which file
    and what to do."""


def line_hash(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


class SiloJournal:
    """The journal in ``directory`` (module docstring)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.path, self.head_path = self.directory / JOURNAL_FILE, self.directory / HEAD_FILE

    @property
    def exists(self) -> bool:
        """Whether the journal was started (its head written)."""
        return self.head_path.exists()

    def start(self) -> None:
        """Creates the empty journal and its head (the genesis entry); the caller creates the noise key after it."""
        if self.exists or self.path.exists():
            raise JournalError(f"{self.directory} already holds a journal: refusing to start another")
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._append_line(json.dumps({"seq": 0, "prev": GENESIS, "kind": "genesis"}, sort_keys=True).encode(), 0)

    def entries(self) -> list[dict]:
        """Every entry after the genesis, verified against the head (module docstring); JournalError otherwise."""
        return [entry for entry in self._verified() if entry["kind"] != "genesis"]

    def append(self, entry: dict) -> dict:
        """Appends ``entry`` (a JSON object with a "kind"), fsynced, then advances the head; the entry as written."""
        last = self._verified_lines()[-1]
        record = json.loads(last)
        written = {**entry, "seq": record["seq"] + 1, "prev": line_hash(last)}
        self._append_line(json.dumps(written, sort_keys=True).encode(), written["seq"])
        return written

    # -- reading ------------------------------------------------------------------------------------------------
    def _verified(self) -> Iterator[dict]:
        for line in self._verified_lines():
            yield json.loads(line)

    def _verified_lines(self) -> list[bytes]:
        if not self.exists:
            if self.path.exists():
                raise self._error(f"its head {self.head_path} is gone")
            raise JournalError(f"{self.directory} has no journal yet (SiloJournal.start)")
        try:
            seq_text, head = self.head_path.read_text().split()
            head_seq = int(seq_text)
        except (OSError, ValueError) as err:
            raise self._error(f"its head {self.head_path} is damaged ({err})") from None
        if not self.path.exists():
            raise self._error(f"the journal {self.path} is gone")
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        torn = lines.pop()  # b"" after a complete last line
        prev, kept = GENESIS, []
        for number, line in enumerate(lines):
            if not self._links(line, number, prev):
                raise self._error(f"entry {number} of {self.path} does not follow entry {number - 1} (the file was "
                                  "edited or damaged)")
            prev = line_hash(line)
            kept.append(line)
            if number == head_seq:
                if prev != head:
                    raise self._error(f"entry {number} of {self.path} is not the one its head {self.head_path} "
                                      "recorded (the journal was replaced)")
                break
        else:
            raise self._error(f"{self.path} ends at entry {len(kept) - 1} but its head records entry {head_seq} (the "
                              "journal was truncated or an older copy restored)")
        rest = lines[head_seq + 1:]
        if len(rest) > 1:
            raise self._error(f"{self.path} has {len(rest)} entries past its head: more than a crash leaves")
        if rest:  # a crash between the append and the head's rewrite: the entry is real, advance the head
            if not self._links(rest[0], head_seq + 1, prev):
                raise self._error(f"the entry past the head of {self.path} does not follow it")
            kept.append(rest[0])
            self._write_head(head_seq + 1, line_hash(rest[0]))
        if torn and not rest and len(lines) == head_seq + 1:
            self._truncate(len(raw) - len(torn))  # a torn append (no fsync returned, no answer left): dropped
        elif torn:
            raise self._error(f"{self.path} ends in an incomplete entry that is not the last one appended")
        return kept

    @staticmethod
    def _links(line: bytes, seq: int, prev: str) -> bool:
        try:
            record = json.loads(line)
            return record["seq"] == seq and record["prev"] == prev
        except (ValueError, KeyError, TypeError):
            return False

    def _error(self, what: str) -> JournalError:
        return JournalError(
            f"this silo's journal cannot be trusted: {what}. Without it the silo cannot tell which rounds and secure "
            "aggregations it answered, and answering one again on another input gives its update away, so it answers "
            f"none. Restore the state folder {self.directory} as it was (key, journal.jsonl and journal.head "
            "together); or, for a new study, move the folder away (the privacy spent stays spent)")

    # -- writing ------------------------------------------------------------------------------------------------
    def _append_line(self, line: bytes, seq: int) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        self._write_head(seq, line_hash(line))

    def _write_head(self, seq: int, digest: str) -> None:
        write_text_atomically(self.head_path, f"{seq} {digest}\n", "the silo's journal head")

    def _truncate(self, size: int) -> None:
        with open(self.path, "r+b") as file:
            file.truncate(size)
            os.fsync(file.fileno())


__all__ = ["SiloJournal", "JournalError", "JOURNAL_FILE", "HEAD_FILE"]
