"""Empirical privacy auditing: canaries run through the real algorithm, lower bounds on epsilon."""
