"""dpfl: differentially private federated learning.

A vectorised simulator for DP federated learning (clients are a tensor axis) and a privacy-accounting layer that
reports epsilon per observer (third party, server, other silos), built on google's dp_accounting.
"""

__version__ = "0.1.0"
