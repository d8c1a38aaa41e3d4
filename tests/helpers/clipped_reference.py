"""The clipped per-example gradient sum by its definition, one client and one example at a time (torch.autograd):
the reference both gradient strategies (tests/engine/test_grads.py, test_ghost.py) are checked against."""

import torch
import torch.nn.functional as F


def hand_clipped_sum(model, grads, theta, x, y, mask, clip, norm="l2"):
    """sum_j mask_j clip(grad l(theta_c; x_cj, y_cj)) per client c, writing each client's parameters into ``model``."""
    out = torch.zeros_like(theta)
    for c in range(theta.shape[0]):
        with torch.no_grad():
            for p, v in zip(model.parameters(), grads.unflatten(theta[c]).values()):
                p.copy_(v)
        for j in range(x.shape[1]):
            if mask[c, j] == 0:
                continue
            loss = F.cross_entropy(model(x[c, j : j + 1]), y[c, j : j + 1])
            g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss, list(model.parameters()))])
            if clip is not None:
                size = g.norm() if norm == "l2" else g.abs().sum()
                g = g / max(1.0, float(size) / clip)
            out[c] += g
    return out
