"""Models as ordinary torch.nn modules, built by name from a config."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from dpfl.errors import ConfigError

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "elu": nn.ELU}
MODELS = ("logreg", "mlp", "femnist-cnn", "papernot-cnn")


class LogisticRegression(nn.Sequential):
    """Multinomial logistic regression: logits = W x (+ b) (softmax cross-entropy is the loss). Zhou et al. 2021
    (Sec. VI) use it without bias: 784 x 10 = 7,840 parameters on MNIST."""

    def __init__(self, num_features: int, num_classes: int, bias: bool = True):
        super().__init__(nn.Linear(num_features, num_classes, bias=bias))


class Image(nn.Module):
    """Flat features [..., side * side] as one-channel images [..., 1, side, side]."""

    def __init__(self, side: int):
        super().__init__()
        self.side = side

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(*x.shape[:-1], 1, self.side, self.side)


class FemnistCNN(nn.Sequential):
    """The CNN of Zhou et al. 2021 (Sec. VI) for FEMNIST: Conv(1 -> 16, 5x5, 'same') + ReLU + 2x2 max-pool, Conv(16 ->
    32, 5x5, 'same') + ReLU + 2x2 max-pool, Linear(32 (side/4)^2 -> classes): 416 + 12,832 + 97,278 = 110,526
    parameters for 28 x 28 images and 62 classes. The features are a square image's pixels, row by row."""

    def __init__(self, num_features: int, num_classes: int):
        side = math.isqrt(num_features)
        if side * side != num_features or side % 4:
            raise ConfigError("model.name", "femnist-cnn", f"a model for the data's {num_features} features: "
                                                           "femnist-cnn needs square images whose side is a multiple "
                                                           "of 4 (e.g. 784 = 28 x 28)")
        super().__init__(
            Image(side),
            nn.Conv2d(1, 16, 5, padding="same"), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding="same"), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(-3), nn.Linear(32 * (side // 4) ** 2, num_classes),
        )


class PapernotCNN(nn.Sequential):
    """The CNN of Papernot et al. 2021 ("Tempered sigmoid activations for deep learning with differential privacy")
    for Fashion-MNIST, as Heikkilä et al. use it: Conv(1 -> 16, 8x8, stride 2, padding 2) + tanh + max-pool(2, stride
    1), Conv(16 -> 32, 4x4, stride 2) + tanh + max-pool(2, stride 1), Linear(512 -> 32) + tanh, Linear(32 -> classes):
    1,040 + 8,224 + 16,416 + 330 = 26,010 parameters for 28 x 28 images and 10 classes. The features are the pixels
    of a 28 x 28 image, row by row."""

    def __init__(self, num_features: int, num_classes: int):
        if num_features != 28 * 28:
            raise ConfigError("model.name", "papernot-cnn", f"a model for the data's {num_features} features: "
                                                            "papernot-cnn takes 28 x 28 images (784 features)")
        super().__init__(
            Image(28),
            nn.Conv2d(1, 16, 8, stride=2, padding=2), nn.Tanh(), nn.MaxPool2d(2, stride=1),
            nn.Conv2d(16, 32, 4, stride=2), nn.Tanh(), nn.MaxPool2d(2, stride=1),
            nn.Flatten(-3), nn.Linear(32 * 4 * 4, 32), nn.Tanh(), nn.Linear(32, num_classes),
        )


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


def build_model(name: str, num_features: int, num_classes: int, hidden=(200,), activation: str = "relu",
                bias: bool = True) -> nn.Module:
    if name == "logreg":
        return LogisticRegression(num_features, num_classes, bias)
    if name == "femnist-cnn":
        return FemnistCNN(num_features, num_classes)
    if name == "papernot-cnn":
        return PapernotCNN(num_features, num_classes)
    if name == "mlp":
        hidden = tuple(hidden)
        if not hidden or any(not isinstance(h, int) or h < 1 for h in hidden):
            raise ConfigError("model.hidden", list(hidden), "a non-empty list of positive integers")
        return MLP(num_features, num_classes, hidden, activation)
    raise ConfigError("model.name", name, f"one of {list(MODELS)}")
