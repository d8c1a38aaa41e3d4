"""Experiments: validated configs, the runner that turns one into results.json, plots."""
