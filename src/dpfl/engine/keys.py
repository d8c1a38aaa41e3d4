"""Where DP randomness comes from: a secret noise key, never a public seed.

Every draw the privacy analysis needs to be unpredictable (noise, rounding coins, record and client sampling whose
secrecy the accounting assumes, the shuffler's permutation, a secret partition or stopping time) comes from a stream
named by (noise key, round, client, purpose) (``dpfl.engine.randomness``). Whoever knows the key can regenerate every
draw, subtract the noise from a released model and identify a record exactly (delta = 1 at every epsilon), so:

* by default the key is 256 bits of the operating system's entropy (``fresh_key``), drawn when a run starts and kept
  only where the noise is drawn: the run directory's ``noise.key`` (owner-only permissions, beside the checkpoint,
  which a resume needs anyway), or, on Flower, each silo's own state next to its data (``dpfl.flower.silo_state``),
  from which a silo derives one key per run (``derived_key``). Nothing that a server, a config or results.json holds
  derives it.
* ``run.seed`` seeds only public randomness: the initial model, generated data (``data.seed``), and data-independent
  schedules the analysis treats as public (fedsgd-dpc's reply schedule, Prox-SVRG's output positions).
* ``run.noise_seed = N`` is the research mode: the key is N, so the noise is reproducible (N = run.seed reproduces the
  streams of dpfl before secret keys). Every epsilon then holds only against observers who do not know N; results.json
  (``privacy.noise``) and the CLI summary say so.

A known limit of the default mode (Mironov 2012): the noise is sampled in floating point (torch's generators), whose
rounding leaks through the low bits of a released value; the accounting assumes exact real-valued noise, as every
DP-SGD library does, and the streams are independent but not secret in the cryptographic sense (a Mersenne
twister's state follows from 624 outputs). The Skellam and binomial mechanisms (integers) are free of the first.
``run.secure_noise = true`` closes both for the Gaussian mechanism of dp-fedavg, dp-fedsgd, dp-scaffold(-warm) and
dp-fedavg-user (client or server noise): ``dpfl.noise.DiscreteGaussianMechanism`` rounds the value to a power-of-two
grid and adds exact discrete Gaussian noise (``dpfl.exact_noise``) drawn from ChaCha20 streams keyed by this key
(``dpfl.engine.secure_streams``), and its event charges the rounding (docs/accounting.md, "Secure noise"); every other
path refuses the key.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from dpfl.durable import write_atomically
from dpfl.errors import RunDirectoryError

#: The bits of a fresh key.
KEY_BITS = 256
#: The run directory's file holding the key of the run's noise.
KEY_FILE = "noise.key"


def fresh_key() -> int:
    """A key from the operating system's entropy: KEY_BITS bits that nobody else can derive."""
    return secrets.randbits(KEY_BITS)


def derived_key(key: int, *labels: str) -> int:
    """The key of its own for ``labels`` (e.g. a silo's key for one run: its secret and the run's identity):
    SHA-256 over the key and the length-prefixed labels, as an integer. Distinct labels give independent keys, and
    none of them reveals ``key``."""
    digest = hashlib.sha256(b"dpfl-noise-key")
    for part in (key.to_bytes((key.bit_length() + 7) // 8 or 1, "big"), *(label.encode() for label in labels)):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return int.from_bytes(digest.digest(), "big")


def save_key(path: Path, key: int) -> None:
    """Writes ``key`` to ``path`` (hex, atomically, readable by its owner only)."""
    path = Path(path)

    def write(file) -> None:
        os.chmod(file.name, 0o600)
        file.write(f"{key:064x}\n".encode())

    write_atomically(path, write, "the noise key")


def load_key(path: Path) -> int:
    """The key in ``path``; RunDirectoryError naming the file if it is missing or damaged."""
    path = Path(path)
    try:
        text = path.read_text().strip()
        return int(text, 16)
    except FileNotFoundError:
        raise RunDirectoryError(
            f"{path} (the secret key the run's noise was drawn from) is missing: a resumed round would draw other "
            "noise onto a computation whose noise was already released, which the ledger cannot charge; restore the "
            "file, or pass --restart to archive the run and start over") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise RunDirectoryError(f"{path} is not a valid noise key ({getattr(err, 'strerror', None) or err}); "
                                "restore it, or pass --restart to archive the run and start over") from None


__all__ = ["KEY_BITS", "KEY_FILE", "fresh_key", "derived_key", "save_key", "load_key"]
