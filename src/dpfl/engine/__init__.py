"""The simulation engine: per-example clipped gradients for a whole cohort, noise mechanisms, samplers, the loop."""
