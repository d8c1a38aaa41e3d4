"""The ghost strategy: exact per-example gradient norms and clipped sums of a cohort's layered models, layer by layer,
without the per-example gradients of the whole model.

A model it takes is an nn.Sequential of, in order: an optional image part (the records shaped as images by
``dpfl.models.Image``, then convolutions, pooling and element-wise activations), an nn.Flatten, and a dense part
(nn.Linear layers and element-wise activations): logistic regression, MLPs, femnist-cnn, papernot-cnn (``supports``).

Each client has its own parameters. One batched forward pass (a convolution runs as one grouped convolution with a
group per client, a linear layer as one batched matmul) and one backward pass to every layer's pre-activation z give,
for each example, each layer's input and its output gradient delta = dl/dz. Then, per example:

* a linear layer z = W h + b has gradient delta h^T (and delta for b), of squared norm ||delta||^2 (||h||^2 + 1)
  (Goodfellow 2015; "ghost clipping", Li et al. 2022);
* a convolution z = W U(h) + b, with U(h) [C k k, T] the unfolded input (im2col) and W [C_out, C k k], has gradient
  delta U^T (and sum_t delta_t for b). Its squared norm is read off that [C_out, C k k] product when it is small,
  else by the ghost identity ||delta U^T||^2 = <U^T U, delta^T delta> over [T, T] Gram matrices, whichever takes
  fewer multiply-adds: Bu et al.'s (2023) "mixed ghost clipping".

The clipped sum sum_j w_j grad_j is assembled layer by layer from the same deltas and inputs, in the flat parameter
order (each layer's weight, then its bias).

Layouts: the dense part is feature-major, [clients, features, batch] (the per-client products W h then have the long
batch axis as their output's inner dimension, 3x faster on a CPU than [clients, batch, features] for narrow layers,
and cross-entropy takes the [N, C, d] layout directly); the image part is [batch, clients * channels, H, W], so that
pooling and activations act per channel, and so per client and example, and a convolution is one call with
``groups = clients``. An example's index in a layer's per-example tensors [batch * clients, ...] is b * clients + c.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

from dpfl.engine.clipping import finite_or_zero
from dpfl.models import Image

ELEMENTWISE = (nn.ReLU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.Identity, nn.LeakyReLU, nn.GELU)
POOLING = (nn.MaxPool2d, nn.AvgPool2d)


def symmetric_padding(conv: nn.Conv2d) -> tuple[int, int] | None:
    """The (height, width) zero padding of ``conv`` when it is the same on both sides of each axis (what unfold takes),
    else None: 'valid' is (0, 0); 'same' (stride 1) pads dilation (k - 1) / 2 a side when that is whole."""
    if conv.padding == "valid":
        return (0, 0)
    if conv.padding == "same":
        total = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size)]
        return None if any(t % 2 for t in total) else (total[0] // 2, total[1] // 2)
    return tuple(conv.padding)


def supports(model: nn.Module) -> bool:
    """Whether ``model`` is a stack the ghost strategy computes exactly (the module docstring's grammar): every
    parameter in an nn.Linear or a plain nn.Conv2d (one group, zero padding, the same on both sides), the image part
    before a flattening nn.Flatten, the dense part after it."""
    children = list(model.children()) if isinstance(model, nn.Sequential) else []
    if not children or any(len(list(m.parameters(recurse=False))) and not isinstance(m, (nn.Linear, nn.Conv2d))
                           for m in model.modules()):
        return False
    image = isinstance(children[0], (Image, nn.Conv2d) + POOLING)
    if isinstance(children[0], Image) or (isinstance(children[0], nn.Flatten) and children[0].end_dim == -1):
        children = children[1:]
    for module in children:
        if isinstance(module, ELEMENTWISE) or (not image and isinstance(module, nn.Linear)):
            continue
        pooling = isinstance(module, POOLING) and not getattr(module, "return_indices", False)  # one tensor out
        if image and (pooling or (isinstance(module, nn.Conv2d) and _plain(module))):
            continue
        if image and isinstance(module, nn.Flatten) and module.end_dim == -1 and module.start_dim in (1, -3):
            image = False
            continue
        return False
    return not image


def _plain(conv: nn.Conv2d) -> bool:
    return conv.groups == 1 and conv.padding_mode == "zeros" and symmetric_padding(conv) is not None


@dataclass
class Layer:
    """One parameterised layer of a ghost pass: its module, its input, and (after the backward pass) its output
    gradient; a convolution's unfolded input and per-example gradients are computed when first needed."""

    module: nn.Module
    inputs: torch.Tensor  # linear: [clients, in, batch]; convolution: [batch, clients * C, H, W]
    delta: torch.Tensor | None = None  # linear: [clients, out, batch]; convolution: [batch, clients * C_out, H', W']
    grads: torch.Tensor | None = None  # convolution: [batch * clients, C_out, C k k] when materialised
    _unfolded: torch.Tensor | None = None

    def unfolded(self) -> torch.Tensor:
        """A convolution's U(h) per example, [batch * clients, C k k, T]: F.unfold's numbers, gathered by one copy of
        a strided view of the padded input (CUDA's im2col launches a kernel per example: 1,280 a call for W1); kept
        for the layer's next use."""
        if self._unfolded is None:
            self._unfolded = self._unfold()
        return self._unfolded

    def _unfold(self) -> torch.Tensor:
        conv = self.module
        h = self.inputs.reshape(-1, conv.in_channels, *self.inputs.shape[2:])
        (pad_h, pad_w), (dil_h, dil_w) = symmetric_padding(conv), conv.dilation
        span_h, span_w = (dil_h * (conv.kernel_size[0] - 1) + 1, dil_w * (conv.kernel_size[1] - 1) + 1)
        windows = F.pad(h, (pad_w, pad_w, pad_h, pad_h)).unfold(2, span_h, conv.stride[0]).unfold(3, span_w,
                                                                                                  conv.stride[1])
        windows = windows[..., ::dil_h, ::dil_w]  # [N, C, H', W', k, k]
        n, _, out_h, out_w = windows.shape[:4]
        return windows.permute(0, 1, 4, 5, 2, 3).reshape(n, -1, out_h * out_w)

    def output_grads(self) -> torch.Tensor:
        """A convolution's delta per example, [batch * clients, C_out, T]."""
        return self.delta.reshape(-1, self.module.out_channels, self.delta.shape[2] * self.delta.shape[3])


def backward(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor,
             loss=None) -> list[Layer]:
    """One forward pass of every client's model (``params``: [clients, *shape] per name) on its records x [clients,
    batch, ...], and one backward pass of sum_ij mask_ij l_ij to the layers' pre-activations: each layer's input and
    output gradient. ``loss``: None for cross-entropy, or a per-example loss on ([N, classes], [N])."""
    clients, batch = y.shape
    children = list(model.named_children())
    if isinstance(children[0][1], (Image, nn.Conv2d) + POOLING):  # the image part: [batch, clients * C, H, W]
        h = x.transpose(0, 1)
        if isinstance(children[0][1], Image):
            h = children.pop(0)[1](h)
        h = h.reshape(batch, -1, *h.shape[3:])
    else:  # flat records, feature-major: [clients, features, batch], a view
        h = x.reshape(clients, batch, -1).transpose(1, 2)
    layers, pre_activations = [], []
    for name, module in children:
        weight, bias = params.get(f"{name}.weight"), params.get(f"{name}.bias")
        if isinstance(module, nn.Conv2d):
            z = F.conv2d(h, weight.reshape(-1, *weight.shape[2:]), None if bias is None else bias.reshape(-1),
                         module.stride, symmetric_padding(module), module.dilation, groups=clients)
        elif isinstance(module, nn.Linear):
            z = torch.bmm(weight, h) if bias is None else torch.baddbmm(bias.unsqueeze(2), weight, h)
        elif isinstance(module, nn.Flatten):
            if h.dim() == 4:  # the image part ends: [clients, C H W, batch]
                h = h.reshape(batch, clients, -1).permute(1, 2, 0)
            continue
        else:
            h = module(h)
            continue
        if not z.requires_grad:  # the first layer: make the pre-activation a leaf of the backward pass
            z.requires_grad_()
        layers.append(Layer(module, h))
        pre_activations.append(z)
        h = z
    if loss is None:
        losses = F.cross_entropy(h, y, reduction="none")  # [clients, batch]
    else:  # a caller's loss takes [N, C] and [N]
        losses = loss(h.transpose(1, 2).reshape(-1, h.shape[1]), y.reshape(-1)).reshape(y.shape)
    deltas = torch.autograd.grad((losses * mask).sum(), pre_activations)
    for layer, delta in zip(layers, deltas):
        layer.inputs, layer.delta = layer.inputs.detach(), delta  # hidden inputs carry the graph: results must not
    return layers


def sq_norms(layers: list[Layer], clients: int) -> torch.Tensor:
    """[clients, batch]: each example's squared gradient norm, summed over the layers."""
    total = 0.0
    for layer in layers:
        if isinstance(layer.module, nn.Linear):
            bias_term = 1.0 if layer.module.bias is not None else 0.0
            total = total + layer.delta.square().sum(1) * (layer.inputs.square().sum(1) + bias_term)
            continue
        unfolded, delta = layer.unfolded(), layer.output_grads()
        width, positions = unfolded.shape[1], unfolded.shape[2]
        if layer.module.out_channels * width <= positions * (layer.module.out_channels + width):
            layer.grads = torch.bmm(delta, unfolded.transpose(1, 2))  # [N, C_out, C k k]: the smaller product
            sq = layer.grads.square().sum((1, 2))
        else:  # <U^T U, delta^T delta>: [T, T] Gram matrices
            sq = (torch.bmm(unfolded.transpose(1, 2), unfolded) * torch.bmm(delta.transpose(1, 2), delta)).sum((1, 2))
        if layer.module.bias is not None:
            sq = sq + delta.sum(2).square().sum(1)
        total = total + sq.reshape(-1, clients).T
    return total


def weighted_sum(layers: list[Layer], weights: torch.Tensor, clean: bool = True) -> torch.Tensor:
    """[clients, P]: sum_j w_j grad_j for weights [clients, batch], in the flat parameter order. With ``clean`` (some
    example's norm is not finite: ``clipping.any_nonfinite``) the layers' inputs, output gradients and per-example
    gradients enter with their non-finite entries as 0 (``finite_or_zero``): an example given weight 0 for a norm that
    is not finite then adds exactly 0, not 0 * inf = NaN, and every other example's entries are finite already
    (``dpfl.engine.clipping``)."""
    clients, batch = weights.shape
    per_example = weights.T.reshape(batch, clients)  # a convolution's examples are ordered b * clients + c
    finite = finite_or_zero if clean else (lambda values, in_place=False: values)
    pieces = []
    for layer in layers:
        if isinstance(layer.module, nn.Linear):
            weighted = finite(layer.delta * weights.unsqueeze(1))  # [clients, out, batch]
            pieces.append(torch.bmm(weighted, finite(layer.inputs).transpose(1, 2)).reshape(clients, -1))
            if layer.module.bias is not None:
                pieces.append(weighted.sum(2))
            continue
        delta = finite(layer.output_grads()).reshape(batch, clients, layer.module.out_channels, -1)
        if layer.grads is not None:
            grads = finite(layer.grads, in_place=True).reshape(batch, clients, -1)
            pieces.append(torch.einsum("bc,bcp->cp", per_example, grads))
        else:
            unfolded = finite(layer.unfolded()).reshape(batch, clients, -1, delta.shape[-1])
            pieces.append(torch.einsum("bc,bcot,bckt->cok", per_example, delta, unfolded).reshape(clients, -1))
        if layer.module.bias is not None:
            pieces.append(torch.einsum("bc,bco->co", per_example, delta.sum(3)))
    return torch.cat(pieces, dim=1)


def bytes_per_example(model: nn.Module, record_shape: tuple[int, ...]) -> int:
    """Rough bytes one example takes in a ghost pass: the record, and per layer its input, output and output gradient
    (a linear layer's in + 2 out, three times over for the autograd graph), a convolution's unfolded input and the
    smaller of its per-example gradient and Gram matrices. A dense stack's is read off its layers; a convolutional
    one's needs its feature maps' shapes: one pass on torch's meta device (about 10 ms; the caller keeps the result)."""
    numel = 3 * sum(m.in_features + 2 * m.out_features for m in model.modules() if isinstance(m, nn.Linear))
    if any(isinstance(m, nn.Conv2d) for m in model.modules()):
        for conv, shape_in, shape_out in _conv_shapes(model, record_shape):
            positions = shape_out[-1] * shape_out[-2]
            width = conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1]
            smaller = min(conv.out_channels * width, 2 * positions * positions)
            numel += 2 * math.prod(shape_in) + 3 * math.prod(shape_out) + width * positions + smaller
    return 4 * (math.prod(record_shape) + numel)


def _conv_shapes(model: nn.Module, record_shape: tuple[int, ...]):
    """(convolution, input shape, output shape) of each convolution for one record, from a pass on torch's meta device
    (shapes only: nothing is computed)."""
    shapes = []
    hooks = [m.register_forward_hook(lambda m, args, out: shapes.append((m, args[0].shape[1:], out.shape[1:])))
             for m in model.modules() if isinstance(m, nn.Conv2d)]
    try:
        meta = {n: torch.empty_like(p, device="meta") for n, p in model.named_parameters()}
        with torch.no_grad():
            functional_call(model, meta, (torch.empty(1, *record_shape, device="meta"),))
    finally:
        for hook in hooks:
            hook.remove()
    return shapes


__all__ = ["ELEMENTWISE", "POOLING", "Layer", "supports", "symmetric_padding", "backward", "sq_norms", "weighted_sum",
           "bytes_per_example"]
