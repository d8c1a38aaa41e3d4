"""What a silo accepts as a secure aggregation round on Flower: its own policy and its own keys, not the server's say.

The ServerApp chooses the setup of every round it sends (cohort, threshold); a malicious one could run a round with
a cohort of one client and threshold 1, whose "sum" is that client's input. So a silo answers a round only if

* its cohort has at least ``min_cohort`` clients and its threshold is at least ``min_threshold`` (``SecAggPolicy``):
  from the node config's ``secagg-min-cohort`` and ``secagg-min-threshold``, each by default what the run's release
  config gives (the cohort its client sampler invites and the threshold its secure aggregation sets for it), as
  recorded at the silo's first secure aggregation of the run (``SiloState.secagg_defaults``). The defaults trust the
  release config the server sends: a silo that does not trust the coordinator sets both keys itself;
* it matches the round the silo trained (its index, run, cohort size, dimension and ring: ``check_setup``);
* it is the actively secure variant (``dpfl.protocols.secagg``), by default: the node config's
  ``secagg-signing-key`` (the silo's private key file: ``dpfl write-silos`` makes one for a test bed,
  ``dpfl.flower.enrolment``; the EC key its SuperNode authenticates with, ``--auth-supernode-private-key``, can
  serve) and ``secagg-peers`` (a folder with the public key of every client of the federation, ``<client id>.pub``,
  obtained from a source other than the server) make it sign its keys, its shares and the survivor set and check
  everyone else's; such a silo refuses any round set up without signatures, so a server cannot turn them off
  (``NodeIdentity``). A silo without them refuses every round (``check_variant``) unless its node config opts in to
  the honest-but-curious protocol, ``secagg-honest-but-curious = true``: that protocol is secure only against a
  server that follows it (one that substitutes the other clients' keys reads the silo's input, Bonawitz et al.
  2017, Sec. 4), which the silo's operator then accepts explicitly, not by leaving two keys out.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from dpfl.engine.sampling import ClientSampler
from dpfl.engine.secure_sum import SecureAggregation
from dpfl.errors import ConfigError, check_range
from dpfl.protocols.identity import (
    SigningKey,
    VerifyingKey,
    load_registry,
    load_signing_key,
    public_text,
    same_key,
)
from dpfl.protocols.messages import SecAggError
from dpfl.protocols.session import SecAggConfig

#: The node config's keys (``flower-supernode --node-config``).
MIN_COHORT, MIN_THRESHOLD = "secagg-min-cohort", "secagg-min-threshold"
SIGNING_KEY, PEERS = "secagg-signing-key", "secagg-peers"
HONEST_BUT_CURIOUS = "secagg-honest-but-curious"


@dataclass(frozen=True)
class SecAggPolicy:
    """The smallest cohort and threshold a silo accepts in a secure aggregation round."""

    min_cohort: int
    min_threshold: int

    @classmethod
    def of_release(cls, secure: SecureAggregation, setting: Mapping) -> "SecAggPolicy":
        """The defaults a run's release config gives: the cohort its client sampler invites (``setting``: the job's
        ``registry.Setting`` as a dict) and the threshold its secure aggregation sets for that cohort."""
        cohort = ClientSampler(setting["num_clients"], setting["client_rate"], setting["client_sampling"]).cohort_size
        return cls(cohort, secure.threshold(cohort))

    def under(self, node_config: Mapping) -> "SecAggPolicy":
        """This policy with the node config's ``secagg-min-cohort`` / ``secagg-min-threshold`` where set."""
        values = asdict(self)
        for key, field in ((MIN_COHORT, "min_cohort"), (MIN_THRESHOLD, "min_threshold")):
            if key in node_config:
                values[field] = check_range(key, node_config[key], 1, integer=True)
        return SecAggPolicy(**values)

    def check(self, config: SecAggConfig, client: int) -> None:
        """SecAggError unless the round's cohort and threshold are at least the policy's."""
        n, t = len(config.clients), config.threshold
        if n < self.min_cohort or t < self.min_threshold:
            raise SecAggError(config.round_id, f"client {client}",
                              f"a round of {n} clients with threshold {t}: this silo takes part only in rounds of at "
                              f"least {self.min_cohort} clients with threshold at least {self.min_threshold} (node "
                              f"config {MIN_COHORT}, {MIN_THRESHOLD}; by default the run's release config)")


@dataclass(frozen=True)
class NodeIdentity:
    """A silo's signing key and the registry of the federation's public keys (module docstring)."""

    key: SigningKey
    peers: dict[int, VerifyingKey]

    @property
    def public(self) -> str:
        """The silo's public key as an OpenSSH line (what it tells the ServerApp when asked who it is)."""
        return public_text(self.key)


def node_identity(node_config: Mapping, client: int) -> NodeIdentity | None:
    """The silo's identity from its node config (None without ``secagg-signing-key``); ConfigError for one key
    without the other, an unreadable key, or a registry whose key for this client is not the silo's."""
    path, peers = node_config.get(SIGNING_KEY), node_config.get(PEERS)
    if path is None and peers is None:
        return None
    if path is None or peers is None:
        missing, given = (SIGNING_KEY, PEERS) if path is None else (PEERS, SIGNING_KEY)
        raise ConfigError(missing, None, f"set together with {given} (the silo's signing key and the folder of the "
                                         "federation's public keys, <client id>.pub)")
    identity = _load(str(path), str(peers))
    if client not in identity.peers or not same_key(identity.peers[client], identity.key.public_key()):
        raise ConfigError(PEERS, str(peers), f"the public key of this silo's {SIGNING_KEY} as {client}.pub (this "
                                             f"silo is client {client})")
    return identity


@functools.lru_cache(maxsize=4)
def _load(path: str, peers: str) -> NodeIdentity:
    return NodeIdentity(load_signing_key(path, SIGNING_KEY), load_registry(peers, PEERS))


def check_variant(config: SecAggConfig, node_config: Mapping, client: int) -> NodeIdentity | None:
    """The silo's identity (``node_identity``) once the round's variant is one the silo takes part in (module
    docstring): the actively secure one with a signing key; without one, the honest-but-curious one, and only with
    ``secagg-honest-but-curious = true``. SecAggError for a round of another variant or without the opt-in;
    ConfigError for an opt-in that is not a boolean or comes with a signing key."""
    identity = node_identity(node_config, client)
    opted_in = node_config.get(HONEST_BUT_CURIOUS, False)
    if not isinstance(opted_in, bool):
        raise ConfigError(HONEST_BUT_CURIOUS, opted_in, "true or false")
    if opted_in and identity is not None:
        raise ConfigError(HONEST_BUT_CURIOUS, opted_in, f"false (or unset) with {SIGNING_KEY}: a silo with a signing "
                                                        "key takes part in the actively secure variant only")
    if identity is None and not opted_in:
        raise SecAggError(config.round_id, f"client {client}",
                          f"this silo has no signing key: it takes part in secure aggregation in the actively secure "
                          f"variant, with the node config keys {SIGNING_KEY} and {PEERS} (dpfl write-silos makes them "
                          f"for a test bed), or, if its operator accepts a server that could read its input by "
                          f"substituting keys, in the honest-but-curious protocol with {HONEST_BUT_CURIOUS} = true")
    if (identity is not None) != config.active:
        raise SecAggError(config.round_id, f"client {client}",
                          "a round set up without signatures: this silo has a signing key and takes part in the "
                          "actively secure variant only, which a server cannot turn off" if identity else
                          f"a round of the actively secure variant, but this silo has no signing key (node config "
                          f"{SIGNING_KEY} and {PEERS})")
    return identity


def check_setup(config: SecAggConfig, client: int, trained: Mapping) -> None:
    """SecAggError unless the round set up is the one the silo trained: ``trained`` holds its round index,
    ``session``, ``cohort`` (the cohort size its messages were encoded for), ``dimension`` and ``bits``."""
    expected = {"round_id": int(trained["round"]), "session": str(trained["session"]),
                "dimension": int(trained["dimension"]), "bits": int(trained["bits"])}
    wrong = {name: getattr(config, name) for name, value in expected.items() if getattr(config, name) != value}
    if client not in config.clients:
        wrong["clients"] = list(config.clients)
    if len(config.clients) != int(trained["cohort"]):
        wrong["cohort"] = len(config.clients)
    if wrong:
        raise SecAggError(config.round_id, f"client {client}",
                          f"a round set up as {wrong}, but this silo trained round {expected['round_id']} of "
                          f"{expected['session']} for a cohort of {int(trained['cohort'])} clients including itself, "
                          f"d = {expected['dimension']}, {expected['bits']} bits")


__all__ = ["MIN_COHORT", "MIN_THRESHOLD", "SIGNING_KEY", "PEERS", "HONEST_BUT_CURIOUS", "SecAggPolicy", "NodeIdentity",
           "node_identity", "check_variant", "check_setup"]
