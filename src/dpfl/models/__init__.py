"""Models as ordinary torch.nn modules, built by name from a config.

``build_model`` takes the shape of one record's features, as the data holds them: flat features ``(F,)`` (an int
``F`` means the same), a one-channel image ``(H, W)`` or an image ``(C, H, W)``. The dense models (``logreg``,
``mlp``) read any shape as its flat pixels; the CNNs read images: ``(C, H, W)`` as it is, ``(H, W)`` as one channel,
and ``F`` flat features only when F is a square, as the pixels of a one-channel ``sqrt(F) x sqrt(F)`` image row by
row (scikit-learn's digits: 64 = 8 x 8). The sequence models (``lstm``, ``transformer``: ``sequence.py``) read records
``(L,)`` of token ids below ``num_classes`` (the vocabulary), and only from data that declares them so (``tokens``:
a data set whose provenance records a ``sequence_length``, Shakespeare's and next-word's; ``token_records``). A model
that cannot take the data's shape raises a ConfigError naming ``model.name``.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from dpfl.errors import ConfigError
from dpfl.models.sequence import CausalTransformer, NextTokenLSTM

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "elu": nn.ELU}
SEQUENCE_MODELS = ("lstm", "transformer")
MODELS = ("logreg", "mlp", "femnist-cnn", "papernot-cnn", *SEQUENCE_MODELS)
#: The sequence models' size keys and their defaults (McMahan et al. 2017's LSTM; a small transformer).
SEQUENCE_KEYS = {"lstm": {"embedding": 8, "units": 256, "layers": 2},
                 "transformer": {"d_model": 64, "layers": 2, "heads": 4}}
#: ``model.name`` of a torch module a Python caller hands ``dpfl.run(config, model=...)``; ``build_model`` refuses it.
CUSTOM = "custom"


def feature_shape_of(features: int | tuple[int, ...]) -> tuple[int, ...]:
    """The shape of one record's features: an int F is ``(F,)``."""
    return (int(features),) if isinstance(features, int) else tuple(int(n) for n in features)


def image_shape(name: str, features: tuple[int, ...]) -> tuple[int, int, int]:
    """(C, H, W): how a CNN reads a record of shape ``features`` (see the module docstring)."""
    if len(features) == 3:
        return features
    if len(features) == 2:
        return (1, *features)
    side = math.isqrt(features[0]) if len(features) == 1 else 0
    if len(features) != 1 or side * side != features[0]:
        raise ConfigError("model.name", name, f"a model for the data's features of shape {list(features)}: {name} "
                                              "takes images, [C, H, W] or [H, W] per record (an npz's x [N, C, H, W] "
                                              "or [N, H, W]), or a square number of flat features read as one-channel "
                                              "images (64 = 8 x 8, 784 = 28 x 28)")
    return (1, side, side)


class Image(nn.Module):
    """Records [..., *features] as images [..., C, H, W] (``image_shape``)."""

    def __init__(self, features: tuple[int, ...], shape: tuple[int, int, int]):
        super().__init__()
        self.dims, self.shape = len(features), shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(*x.shape[: x.dim() - self.dims], *self.shape)


def _dense_input(features: tuple[int, ...]) -> tuple[list[nn.Module], int]:
    """The layers that flatten a record of shape ``features`` (none for flat features) and its flat width."""
    width = math.prod(features)
    return ([nn.Flatten(-len(features))] if len(features) > 1 else []), width


class LogisticRegression(nn.Sequential):
    """Multinomial logistic regression: logits = W x (+ b) (softmax cross-entropy is the loss). Zhou et al. 2021
    (Sec. VI) use it without bias: 784 x 10 = 7,840 parameters on MNIST."""

    def __init__(self, features: int | tuple[int, ...], num_classes: int, bias: bool = True):
        flatten, width = _dense_input(feature_shape_of(features))
        super().__init__(*flatten, nn.Linear(width, num_classes, bias=bias))


def _pooled(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """The output length of a convolution or pooling over ``size`` inputs (PyTorch's floor rule)."""
    return (size + 2 * padding - kernel) // stride + 1


def _too_small(name: str, shape: tuple[int, int, int], smallest: int) -> ConfigError:
    return ConfigError("model.name", name, f"a model for the data's {shape[1]} x {shape[2]} images: {name} needs "
                                           f"images of at least {smallest} x {smallest} pixels")


class FemnistCNN(nn.Sequential):
    """The CNN of Zhou et al. 2021 (Sec. VI) for FEMNIST: Conv(C -> 16, 5x5, 'same') + ReLU + 2x2 max-pool, Conv(16 ->
    32, 5x5, 'same') + ReLU + 2x2 max-pool, Linear(32 (H/4)(W/4) -> classes): 416 + 12,832 + 97,278 = 110,526
    parameters for 28 x 28 one-channel images and 62 classes. Any image of at least 4 x 4 pixels (the pools floor)."""

    def __init__(self, features: int | tuple[int, ...], num_classes: int):
        features = feature_shape_of(features)
        channels, height, width = shape = image_shape("femnist-cnn", features)
        if min(height, width) < 4:
            raise _too_small("femnist-cnn", shape, 4)
        super().__init__(
            Image(features, shape),
            nn.Conv2d(channels, 16, 5, padding="same"), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding="same"), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(-3), nn.Linear(32 * (height // 4) * (width // 4), num_classes),
        )


def _papernot_side(size: int) -> int:
    """The side of PapernotCNN's last feature map for an input side ``size`` (0 or less: too small)."""
    return _pooled(_pooled(_pooled(_pooled(size, 8, stride=2, padding=2), 2), 4, stride=2), 2)


class PapernotCNN(nn.Sequential):
    """The CNN of Papernot et al. 2021 ("Tempered sigmoid activations for deep learning with differential privacy")
    for Fashion-MNIST, as Heikkilä et al. use it: Conv(C -> 16, 8x8, stride 2, padding 2) + tanh + max-pool(2, stride
    1), Conv(16 -> 32, 4x4, stride 2) + tanh + max-pool(2, stride 1), Linear(32 h w -> 32) + tanh, Linear(32 ->
    classes): 1,040 + 8,224 + 16,416 + 330 = 26,010 parameters for 28 x 28 one-channel images (h = w = 4) and 10
    classes. Any image of at least 16 x 16 pixels (the last feature map is then 1 x 1)."""

    def __init__(self, features: int | tuple[int, ...], num_classes: int):
        features = feature_shape_of(features)
        channels, height, width = shape = image_shape("papernot-cnn", features)
        h, w = _papernot_side(height), _papernot_side(width)
        if min(h, w) < 1:
            raise _too_small("papernot-cnn", shape, 16)
        super().__init__(
            Image(features, shape),
            nn.Conv2d(channels, 16, 8, stride=2, padding=2), nn.Tanh(), nn.MaxPool2d(2, stride=1),
            nn.Conv2d(16, 32, 4, stride=2), nn.Tanh(), nn.MaxPool2d(2, stride=1),
            nn.Flatten(-3), nn.Linear(32 * h * w, 32), nn.Tanh(), nn.Linear(32, num_classes),
        )


class MLP(nn.Sequential):
    """Fully connected network: Linear -> activation -> ... -> Linear (logits)."""

    def __init__(self, features: int | tuple[int, ...], num_classes: int, hidden: tuple[int, ...] = (200,),
                 activation: str = "relu"):
        check_model_keys("mlp", hidden, activation)
        layers, width = _dense_input(feature_shape_of(features))
        for size in hidden:
            layers += [nn.Linear(width, size), ACTIVATIONS[activation]()]
            width = size
        super().__init__(*layers, nn.Linear(width, num_classes))


def token_records(info: dict) -> bool:
    """Whether a data set's records are token ids (``FederatedDataset.info``): its source records a
    ``sequence_length`` (Shakespeare's LEAF files, next-word's JSON lines, and a stored folder written from either)."""
    source = info.get("source")
    return isinstance(source, dict) and "sequence_length" in source


def check_model_keys(name: str, hidden=(200,), activation: str = "relu", **sizes) -> None:
    """Raises ConfigError for a [model] value out of its range; what depends on the data (its features' shape) is
    checked when the model is built on it. ``sizes``: a sequence model's ``SEQUENCE_KEYS``."""
    if name not in (*MODELS, CUSTOM):
        raise ConfigError("model.name", name, f"one of {[*MODELS, CUSTOM]}")
    if name in SEQUENCE_KEYS:
        for key, value in sizes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"model.{key}", value, "a positive integer")
        if name == "transformer" and sizes.get("d_model", 64) % sizes.get("heads", 4):
            raise ConfigError("model.heads", sizes.get("heads", 4), f"a divisor of model.d_model = "
                                                                    f"{sizes.get('d_model', 64)} (each head takes "
                                                                    "d_model / heads of it)")
    if name != "mlp":
        return
    if activation not in ACTIVATIONS:
        raise ConfigError("model.activation", activation, f"one of {sorted(ACTIVATIONS)}")
    if not hidden or any(not isinstance(h, int) or isinstance(h, bool) or h < 1 for h in hidden):
        raise ConfigError("model.hidden", list(hidden), "a non-empty list of positive integers")


def _sequence_model(name: str, features: tuple[int, ...], num_classes: int, tokens: bool, sizes: dict) -> nn.Module:
    """``lstm`` or ``transformer`` for records of ``features`` token ids (module docstring), or the refusal."""
    if not tokens or len(features) != 1:
        raise ConfigError("model.name", name, f"a model for the data's records of shape {list(features)}: {name} "
                                              "takes sequences of token ids [L], the next token's id their label "
                                              "and the classes the vocabulary, from data that declares them "
                                              "(data.name 'shakespeare' or 'next-word', or a 'clients' folder "
                                              "written from them); in Python, hand the module itself to "
                                              "dpfl.run(config, model=dpfl.models.NextTokenLSTM(vocabulary))")
    sizes = {**SEQUENCE_KEYS[name], **sizes}
    if name == "lstm":
        return NextTokenLSTM(num_classes, sizes["embedding"], sizes["units"], sizes["layers"])
    return CausalTransformer(num_classes, features[0], sizes["d_model"], sizes["layers"], sizes["heads"])


def build_model(name: str, features: int | tuple[int, ...], num_classes: int, hidden=(200,),
                activation: str = "relu", bias: bool = True, tokens: bool = False, **sizes) -> nn.Module:
    """The model ``name`` for records of shape ``features`` (an int: flat features) and ``num_classes`` classes;
    ``tokens``: whether the records are token ids (``token_records``), which the sequence models need; ``sizes``
    their ``SEQUENCE_KEYS``."""
    check_model_keys(name, hidden, activation, **sizes)
    if name == CUSTOM:
        raise ConfigError("model.name", name, f"one of {list(MODELS)}: {CUSTOM!r} stands for a torch module handed "
                                              "to dpfl.run(config, model=...) in Python, which a config alone cannot "
                                              "name")
    if name in SEQUENCE_KEYS:
        return _sequence_model(name, feature_shape_of(features), num_classes, tokens, sizes)
    if name == "logreg":
        return LogisticRegression(features, num_classes, bias)
    if name == "femnist-cnn":
        return FemnistCNN(features, num_classes)
    if name == "papernot-cnn":
        return PapernotCNN(features, num_classes)
    return MLP(features, num_classes, tuple(hidden), activation)
