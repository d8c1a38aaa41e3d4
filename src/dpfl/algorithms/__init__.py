"""Federated algorithms: small pieces of math on stacked client state; the simulator owns everything else."""
