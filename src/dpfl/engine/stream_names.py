"""The names of dpfl's random streams: (noise key, round, client id, purpose), shared by the default streams
(``dpfl.engine.randomness``) and the cryptographically secure ones (``dpfl.engine.secure_streams``), so that a stream
of either kind is named the same way and neither module imports the other's names."""

from __future__ import annotations

#: Purposes of the streams; each is a separate stream of every client (and of the server, client id SERVER).
#: "output": the server's public choice of which iterate a run outputs (indexed by run, not round).
#: "server_noise": the noise an algorithm's server step draws (``dpfl.engine.protocol.ServerContext``); a stream no
#: engine stage and no client draws from.
#: "shared_noise": one stream of the round (read as client 0's) that every client of the cohort draws the same noise
#: from, under LocalSGD's non-private noise_sharing = "cohort-nonprivate" (Noble et al. 2022's code).
PURPOSES = {"cohort": 0, "records": 1, "noise": 2, "shuffle": 3, "rounding": 4, "stop": 5, "output": 6,
            "server_noise": 7, "shared_noise": 8}
#: The purposes an algorithm's server step may draw from (``ServerContext``): never an engine stage's (the cohort,
#: the shuffler), so that its draws are independent of theirs.
SERVER_PURPOSES = ("server_noise",)
#: The client id of the server's own streams (the cohort draw, the shuffler, the server step's noise).
SERVER = -1


def check_purpose(purpose: str) -> None:
    """ValueError unless ``purpose`` is one of ``PURPOSES``."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose = {purpose!r} is not allowed: expected one of {sorted(PURPOSES)}")


__all__ = ["PURPOSES", "SERVER_PURPOSES", "SERVER", "check_purpose"]
