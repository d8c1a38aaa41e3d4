"""Models as ordinary torch.nn modules, built by name from a config."""

from __future__ import annotations

import torch.nn as nn

from dpfl.errors import ConfigError

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "elu": nn.ELU}
MODELS = ("logreg", "mlp")


class LogisticRegression(nn.Sequential):
    """Multinomial logistic regression: logits = W x + b (softmax cross-entropy is the loss)."""

    def __init__(self, num_features: int, num_classes: int):
        super().__init__(nn.Linear(num_features, num_classes))


class MLP(nn.Sequential):
    """Fully connected network: Linear -> activation -> ... -> Linear (logits)."""

    def __init__(self, num_features: int, num_classes: int, hidden: tuple[int, ...] = (200,), activation: str = "relu"):
        if activation not in ACTIVATIONS:
            raise ConfigError("model.activation", activation, f"one of {sorted(ACTIVATIONS)}")
        layers: list[nn.Module] = []
        width = num_features
        for size in hidden:
            layers += [nn.Linear(width, size), ACTIVATIONS[activation]()]
            width = size
        super().__init__(*layers, nn.Linear(width, num_classes))


def build_model(name: str, num_features: int, num_classes: int, hidden=(200,), activation: str = "relu") -> nn.Module:
    if name == "logreg":
        return LogisticRegression(num_features, num_classes)
    if name == "mlp":
        hidden = tuple(hidden)
        if not hidden or any(not isinstance(h, int) or h < 1 for h in hidden):
            raise ConfigError("model.hidden", list(hidden), "a non-empty list of positive integers")
        return MLP(num_features, num_classes, hidden, activation)
    raise ConfigError("model.name", name, f"one of {list(MODELS)}")
