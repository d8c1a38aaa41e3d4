"""Planning a private deployment before training: how many rounds and clients per round (Zhou et al. 2021), and the
problem constants those plans need, estimated from data without privacy."""
