"""Protocols at the trust boundary: secure aggregation (Bonawitz et al. 2017) and discretisation into a finite ring."""
