"""dpfl's algorithms on Flower (``pip install dpfl[flower]``): when the silos are real machines.

Flower moves the messages (a SuperLink, one SuperNode per silo); dpfl brings the algorithm, the noise and the
per-observer ledger, exactly as in ``dpfl run``: the ServerApp (``dpfl.flower.server_app``) is ``dpfl run``'s round
loop (``dpfl.engine.simulator.Simulation``) with the cohort's client work sent to the silos' ClientApps
(``dpfl.flower.client_app``), which run the algorithm's ``client_round`` on their own data with their own random
streams (named by (noise key, round, client, purpose): ``dpfl.engine.randomness``), the key being each silo's own
secret (``silo_state``), never sent. The ledger does not depend on the noise, so it equals ``dpfl run``'s; the model
equals it draw for draw only in the research mode (``run.noise_seed``), where every party uses that seed. The round
is recorded in the ledger before any client is asked to train.

With ``privacy.secure_aggregation = true`` the secagg boundary is enforced: ``secure_sum`` runs Bonawitz et al.
2017's protocol between the ServerApp and the ClientApps, so the server holds masked vectors and the sum, never an
update.

The server reads no records: it builds the run from the federation's public metadata and the record counts the nodes
report (``federation``), and evaluates where the run config says (``evaluation``: not at all, on a set it may hold,
or on the silos, in the clear and NOT covered by epsilon).

``silo`` (reading a silo's file), ``silo_state`` (its key, data fingerprint and journal of rounds), ``federation``,
``evaluation``, ``records`` (tensors as Flower records) and ``app_dir`` (``dpfl flower-app``) import without flwr;
``server_app``, ``client_app`` and ``secure_sum`` need it.
"""
