"""Per-example clipped gradient sums for a whole cohort of client models in one call.

Every client of the cohort has its own model (a row of ``theta``, shape [clients, P]) and its own minibatch
(``x`` [clients, batch, ...], ``y`` [clients, batch], ``mask`` [clients, batch]). One call returns, for each client,

    sum_j  mask_j * clip(grad l(theta_i; x_ij, y_ij))        clip(g) = g / max(1, ||g|| / C')

(Noble et al. 2022 Alg. 1 line "g~_j = g_j / max(1, ||g_j||_2 / C)", with C' = C (1 - 2^-20) for float32 rounding,
and 0 for an example whose norm is not finite: ``dpfl.engine.clipping``), with no Python loop over clients or
examples. The number of examples so zeroed is counted on the device and read once a round
(``take_nonfinite_examples``).

Two strategies give the same numbers:

* ``ghost`` (stacks of plain convolutions, pooling and element-wise activations, then nn.Linear layers and
  element-wise activations: logistic regression, MLPs, femnist-cnn, papernot-cnn; ``dpfl.engine.ghost``).
  For a linear layer z = W h + b the per-example gradient is the outer product delta h^T, whose squared norm is
  ||delta||^2 (||h||^2 + 1) (Goodfellow 2015; "ghost clipping", Li et al. 2022); a convolution's is its unfolded
  input times delta, whose norm comes from that small product or from Gram matrices (Bu et al. 2023). So one batched
  forward pass, one backward pass to the pre-activations and a few einsums give exact per-example norms and the
  clipped sum without materialising a [clients, batch, P] tensor.
* ``vmap`` (any model): torch.func per-example gradients, vmapped over examples and then over clients (on the CPU in
  chunks of clients sized for the cache, ``VMAP_CPU_CHUNK_BYTES``; on a GPU the whole cohort the simulator hands over
  in one call). Also used for the l1 norm (Zhou et al.'s Laplace mechanism), which has no ghost identity.

The loss is cross-entropy on the model's logits, or a caller's per-example loss ``loss(outputs [N, C], labels [N]) ->
[N]`` (reduction 'none'), used in both strategies, in the train loss and in the evaluation. Layers whose per-example
gradients are undefined or unkeyed are refused when a ``CohortGradients`` is built (``check_layers``), and a caller's
module or loss is tried on two records before a run (``CohortGradients.check``): both raise a ConfigError naming the
layer or the problem, never a traceback from inside torch.func.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from dpfl.engine import ghost
from dpfl.engine.clipping import any_nonfinite, clip_weights, finite_or_zero, zeroed_examples
from dpfl.engine.device import full_float32_matmuls
from dpfl.errors import ConfigError

NORMS = ("l2", "l1")
#: Layers whose per-example gradients are undefined: batch normalisation in any mode (training: each example is
#: normalised by its batch's statistics, so one example's gradient depends on every other; its running statistics
#: are updated in place, which torch.func refuses).
BATCH_MIXING = (nn.modules.batchnorm._BatchNorm,)
#: Layers that draw randomness when training: their draws would come from torch's global generator, not the run's
#: keyed streams (and torch.func's vmap refuses random operations).
RANDOM_WHEN_TRAINING = (nn.modules.dropout._DropoutNd,)
#: On the CPU the ``vmap`` strategy takes the cohort's clients in chunks whose per-example gradients [clients, batch,
#: P] fit in this many bytes. Measured (``clipped_sum``, femnist-cnn, 110,526 parameters; 8 clients of 64 28 x 28
#: images; one thread, a shared 2-core machine, best of 3): 0.95 s for the 8 clients in one call (226 MB of
#: gradients), 0.46 s in chunks of 1 client (28 MB), 0.64 s of 2, 0.80 s of 4; one vmap over the 512 (client,
#: example) pairs flattened took 1.17 s against 0.87 s nested (a convolution per example, not per client). On a GPU
#: the clients the simulator hands over are one call: it sizes them from the GPU's free memory
#: (``dpfl.engine.device.chunk_budget_bytes``). Chunks change no number beyond float rounding (each client's
#: gradients are computed from its own row alone).
VMAP_CPU_CHUNK_BYTES = 32 * 2**20


#: The devices on which the ghost strategy runs convolutional stacks (elsewhere they take ``vmap``). On a CPU its
#: unfolded inputs cost more than vmap's convolutions: femnist-cnn's clipped sum of 8 clients x 64 28 x 28 images took
#: 0.19 s against vmap's 0.17 (2-core machine, best of 3), and of 20 clients 0.50 s against 0.43.
CONV_GHOST_DEVICES = ("cuda",)


def default_strategy(model: nn.Module, device_type: str) -> str:
    """The strategy a model gets on a device of ``device_type``: ``ghost`` for what it takes (``ghost.supports``;
    convolutional stacks only on ``CONV_GHOST_DEVICES``), else ``vmap``."""
    if not ghost.supports(model):
        return "vmap"
    convolutional = any(isinstance(m, nn.Conv2d) for m in model.modules())
    return "ghost" if not convolutional or device_type in CONV_GHOST_DEVICES else "vmap"


class CohortGradients:
    """Clipped per-example gradient sums and losses for a model whose parameters are a flat vector per client."""

    def __init__(self, model: nn.Module, strategy: str | None = None, loss=None,
                 chunk_bytes: int | None = VMAP_CPU_CHUNK_BYTES):
        """``loss``: None for cross-entropy, or a per-example loss ``loss(outputs [N, C], labels [N]) -> [N]``.
        ``chunk_bytes``: on the CPU, the bytes of per-example gradients one vmap call holds (``VMAP_CPU_CHUNK_BYTES``;
        None: the whole cohort in one call)."""
        check_layers(model)
        self.model = model
        self.loss = loss
        params = dict(model.named_parameters())
        self.names = list(params)
        self.shapes = [p.shape for p in params.values()]
        self.sizes = [p.numel() for p in params.values()]
        self.num_params = sum(self.sizes)
        if strategy is None:
            strategy = default_strategy(model, next(model.parameters()).device.type)
        elif strategy not in ("ghost", "vmap"):
            raise ValueError(f"strategy = {strategy!r} is not allowed: expected 'ghost' or 'vmap'")
        elif strategy == "ghost" and not ghost.supports(model):
            raise ValueError("strategy 'ghost' needs a Sequential of plain convolutions, pooling and element-wise "
                             "activations, a Flatten, then nn.Linear layers and element-wise activations "
                             "(dpfl.engine.ghost.supports)")
        self.strategy = strategy
        self._ghost_bytes: dict[tuple[int, ...], int] = {}
        self.chunk_bytes = chunk_bytes
        self._per_example_grads = vmap(vmap(grad(self._example_loss), in_dims=(None, 0, 0)), in_dims=(0, 0, 0))
        self._nonfinite: torch.Tensor | None = None  # examples zeroed since the last take_nonfinite_examples

    def take_nonfinite_examples(self) -> int:
        """The number of real examples whose gradient norm was not finite, so that they contributed 0 to the clipped
        sums (``dpfl.engine.clipping``), since the last call; reading it is the one host synchronisation."""
        zeroed, self._nonfinite = self._nonfinite, None
        return 0 if zeroed is None else int(zeroed)

    @contextlib.contextmanager
    def counted_if_completed(self) -> Iterator[None]:
        """The examples zeroed inside the block count (``take_nonfinite_examples``) only if it completes: the work of a
        round that does not (a budget stop drops the first chunk computed beside its check) reports nothing."""
        counted = self._nonfinite
        try:
            yield
        except BaseException:
            self._nonfinite = counted
            raise

    def _weights(self, clip, norms: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """(``clip_weights``, whether some norm may not be finite: ``any_nonfinite``), the zeroed examples added to
        the device-side count."""
        nonfinite = any_nonfinite(norms)
        if nonfinite:
            zeroed = zeroed_examples(norms, mask)
            self._nonfinite = zeroed if self._nonfinite is None else self._nonfinite + zeroed.to(self._nonfinite.device)
        return clip_weights(clip, norms, mask, nonfinite), nonfinite

    def ghost_bytes_per_example(self, record_shape: tuple[int, ...]) -> int:
        """``ghost.bytes_per_example`` of this model, kept per record shape (a CNN's takes a pass on the meta
        device, and the simulator asks every round)."""
        if record_shape not in self._ghost_bytes:
            self._ghost_bytes[record_shape] = ghost.bytes_per_example(self.model, record_shape)
        return self._ghost_bytes[record_shape]

    # -- parameters ---------------------------------------------------------------------------------------------
    def initial_params(self) -> torch.Tensor:
        """The model's current parameters as one flat vector [P] (the order of model.named_parameters())."""
        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()]).clone()

    def unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of a flat vector [..., P] as the model's named parameter tensors [..., *shape]."""
        lead = theta.shape[:-1]
        chunks = torch.split(theta, self.sizes, dim=-1)
        return {n: c.reshape(*lead, *s) for n, c, s in zip(self.names, chunks, self.shapes)}

    # -- per-example clipped sums --------------------------------------------------------------------------------
    def clipped_sum(
        self,
        theta: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor,
        clip: float | torch.Tensor | None,
        norm: str = "l2",
    ) -> torch.Tensor:
        """Sum over each client's examples of the clipped per-example gradients.

        Args:
          theta: [clients, P] one parameter vector per client.
          x: [clients, batch, ...] inputs; y: [clients, batch] labels; mask: [clients, batch] 1.0 on real examples.
          clip: C, the bound on each example's gradient norm: a number, a [clients] tensor (one bound per client),
            or None (no clipping: the plain gradient sum).
          norm: "l2" (Gaussian mechanisms) or "l1" (Laplace mechanisms, Zhou et al.).
        Returns:
          [clients, P]; every example contributes a vector of norm at most C, for any input: one whose gradient norm
          is not finite contributes 0 and is counted (``take_nonfinite_examples``; ``dpfl.engine.clipping``).
        """
        _check_norm(norm)
        if self.strategy == "ghost" and norm == "l2":
            with full_float32_matmuls():  # the sum and the norms are separate products: both in full float32
                layers = ghost.backward(self.model, self.unflatten(theta), x, y, mask, self.loss)
                if clip is None:
                    return ghost.weighted_sum(layers, mask, clean=False)
                weights, nonfinite = self._weights(clip, ghost.sq_norms(layers, y.shape[0]).sqrt(), mask)
                return ghost.weighted_sum(layers, weights, clean=nonfinite)
        if clip is None:  # sum_j mask_j grad l_j = grad sum_j mask_j l_j: one gradient per client, none per example
            return self._in_chunks(lambda theta, x, y, mask, _: self._client_grads(theta, x, y, mask),
                                   theta, x, y, mask, None, per_example=False)

        def clipped(theta, x, y, mask, clip):
            g = self._per_example_grads(theta, x, y)  # [clients, batch, P]
            weights, nonfinite = self._weights(clip, _norms(g, norm), mask)
            return torch.einsum("cb,cbp->cp", weights, finite_or_zero(g, in_place=True) if nonfinite else g)

        return self._in_chunks(clipped, theta, x, y, mask, clip)

    def clipped_examples(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor,
                         clip: float) -> torch.Tensor:
        """[clients, batch, P]: each example's gradient clipped to l2 norm <= C, 0 on masked examples and on those whose
        norm is not finite (counted as in ``clipped_sum``), for local randomisers that encode every example's vector,
        e.g. the shuffle model's."""
        def clipped(theta, x, y, mask, clip):
            g = self._per_example_grads(theta, x, y)
            weights, nonfinite = self._weights(clip, _norms(g, "l2"), mask)
            return weights.unsqueeze(-1) * (finite_or_zero(g, in_place=True) if nonfinite else g)

        return self._in_chunks(clipped, theta, x, y, mask, clip)

    def example_norms(self, theta, x, y, mask, norm: str = "l2") -> torch.Tensor:
        """[clients, batch] norms of the per-example gradients (0 on masked examples)."""
        _check_norm(norm)
        if self.strategy == "ghost" and norm == "l2":
            with full_float32_matmuls():
                return ghost.sq_norms(ghost.backward(self.model, self.unflatten(theta), x, y, mask, self.loss),
                                      y.shape[0]).sqrt()
        return self._in_chunks(lambda theta, x, y, mask, _: _norms(self._per_example_grads(theta, x, y), norm) * mask,
                               theta, x, y, mask, None)

    def clients_per_call(self, theta: torch.Tensor, x: torch.Tensor, per_example: bool = True) -> int:
        """How many clients one vmap call takes: all of them on a GPU or without ``chunk_bytes``; on the CPU as many
        as have per-example gradients [clients, batch, P] (``per_example``; else one gradient [clients, P]) within
        ``chunk_bytes`` (at least one)."""
        clients = theta.shape[0]
        if self.chunk_bytes is None or theta.device.type != "cpu":
            return clients
        per_client = theta.element_size() * (max(x.shape[1], 1) if per_example else 1) * self.num_params
        return max(1, min(clients, self.chunk_bytes // per_client))

    def _in_chunks(self, compute, theta, x, y, mask, clip, per_example: bool = True) -> torch.Tensor:
        """``compute(theta, x, y, mask, clip)`` on chunks of ``clients_per_call`` clients, concatenated (one call when
        the cohort fits; a [clients] ``clip`` is split with them)."""
        size = self.clients_per_call(theta, x, per_example)
        if size >= theta.shape[0]:
            return compute(theta, x, y, mask, clip)
        per_client = isinstance(clip, torch.Tensor) and clip.dim() > 0
        return torch.cat([compute(theta[s : s + size], x[s : s + size], y[s : s + size], mask[s : s + size],
                                  clip[s : s + size] if per_client else clip)
                          for s in range(0, theta.shape[0], size)])

    def _example_loss(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = functional_call(self.model, self.unflatten(theta), (x.unsqueeze(0),))
        if self.loss is not None:
            return self.loss(logits, y.unsqueeze(0)).sum()
        return F.cross_entropy(logits, y.unsqueeze(0))

    def _client_grads(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[clients, P]: each client's gradient of its masked loss sum, sum_j mask_j l(theta_i; x_ij, y_ij)."""
        def masked_loss(theta, x, y, mask):
            return self._summed_loss(functional_call(self.model, self.unflatten(theta), (x,)), y, mask)

        return vmap(grad(masked_loss))(theta, x, y, mask)

    def _summed_loss(self, logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The loss summed over examples (logits [N, C], y [N]), each weighted by ``mask`` [N] when given."""
        if mask is not None:
            losses = self.loss(logits, y) if self.loss is not None else F.cross_entropy(logits, y, reduction="none")
            return (mask * losses).sum()
        if self.loss is not None:
            return self.loss(logits, y).sum()
        return F.cross_entropy(logits, y, reduction="sum")

    # -- a caller's model and loss ---------------------------------------------------------------------------------
    def check(self, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> None:
        """Tries the model and the loss on a few records (x [N, ...], y [N], N >= 2) before a run, so that a module or
        loss the engine cannot use fails here with a ConfigError, not in round 1 inside torch.func: the module must map
        records [N, ...] to logits [N, num_classes]; the loss must return one value per example, each independent of
        the other examples of the batch (reduction 'none': a mean or a sum mixes the examples, so their gradients
        cannot be clipped one by one); the per-example gradients must be computable (``clipped_sum``)."""
        model_name = type(self.model).__name__
        theta = self.initial_params()
        with torch.no_grad():
            outputs = _tried("model", model_name, f"a module that takes a batch of records [N, {_shape(x[0])}]",
                             lambda: functional_call(self.model, self.unflatten(theta), (x,)))
            if not isinstance(outputs, torch.Tensor) or tuple(outputs.shape) != (len(x), num_classes):
                found = list(outputs.shape) if isinstance(outputs, torch.Tensor) else type(outputs).__name__
                raise ConfigError("model", model_name, f"a module returning logits [N, {num_classes}] for a batch of N "
                                                       f"records ({num_classes} classes in the data); it returned "
                                                       f"{found} for N = {len(x)}")
            if self.loss is not None:
                self._check_loss(outputs, y)
        counted = self._nonfinite  # a trial, not a step of the run: its zeroed examples are not the run's
        _tried("model", model_name, "a module torch.func can take per-example gradients of (vmap of grad over the "
                                    "examples)",
               lambda: self.clipped_sum(theta.unsqueeze(0), x.unsqueeze(0), y.unsqueeze(0), torch.ones(1, len(x)), 1.0))
        self._nonfinite = counted

    def _check_loss(self, outputs: torch.Tensor, y: torch.Tensor) -> None:
        name = getattr(self.loss, "__qualname__", type(self.loss).__name__)
        expected = "a per-example loss(outputs [N, C], labels [N]) -> [N] (reduction 'none', e.g. " \
                   "nn.CrossEntropyLoss(reduction='none'))"
        together = _tried("loss", name, expected, lambda: self.loss(outputs, y))
        if not isinstance(together, torch.Tensor) or tuple(together.shape) != (len(y),):
            found = list(together.shape) if isinstance(together, torch.Tensor) else type(together).__name__
            raise ConfigError("loss", name, f"{expected}; it returned {found} for N = {len(y)} examples: a mean or a "
                                            "sum mixes the examples, so their gradients cannot be clipped one by one")
        alone = torch.cat([self.loss(outputs[i : i + 1], y[i : i + 1]).reshape(1) for i in range(len(y))])
        if not torch.allclose(together, alone, rtol=1e-5, atol=1e-6):
            raise ConfigError("loss", name, f"{expected} in which each example's loss does not depend on the other "
                                            f"examples of the batch; it gives {together.tolist()} for {len(y)} "
                                            f"examples together and {alone.tolist()} one by one")

    # -- evaluation ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def example_losses(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """[clients]: the loss of one example per model (theta [clients, P], x [clients, ...], y [clients])."""
        return vmap(self._example_loss)(theta, x, y)

    def loss_and_accuracy(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, chunk: int = 65536):
        """Mean loss (cross-entropy, or the loss given) and accuracy of one model [P] on examples x [N, ...], y [N]."""
        return self.mean_loss_and_accuracy(theta, _pieces(x, y, chunk))

    def mean_loss_and_accuracy(self, theta: torch.Tensor, pieces: Iterable[tuple[torch.Tensor, torch.Tensor]]):
        """``loss_and_accuracy`` over the examples of ``pieces`` (x, y), one piece in memory at a time
        (``ClientArrays.flat_chunks``)."""
        params = self.unflatten(theta)
        total_loss = torch.zeros((), dtype=torch.float64, device=theta.device)  # each piece's sum added in float64
        correct, n = torch.zeros((), dtype=torch.long, device=theta.device), 0
        for x, target in pieces:  # no host synchronisation until the two numbers are read
            logits = functional_call(self.model, params, (x,))
            total_loss += self._summed_loss(logits, target).double()
            correct += (logits.argmax(-1) == target).sum()
            n += x.shape[0]
        return total_loss.item() / max(n, 1), correct.item() / max(n, 1)

    def loss_gradient(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, chunk: int = 65536) -> torch.Tensor:
        """[P]: the gradient of the mean loss of one model [P] on examples x [N, ...], y [N] (no clipping)."""
        return self.mean_loss_gradient(theta, _pieces(x, y, chunk))

    def mean_loss_gradient(self, theta: torch.Tensor,
                           pieces: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """``loss_gradient`` over the examples of ``pieces`` (x, y), one piece in memory at a time."""
        def summed_loss(theta, xs, ys):
            return self._summed_loss(functional_call(self.model, self.unflatten(theta), (xs,)), ys)

        total, n = torch.zeros_like(theta), 0
        for x, y in pieces:
            total += grad(summed_loss)(theta, x, y)
            n += x.shape[0]
        return total / max(n, 1)


def _pieces(x: torch.Tensor, y: torch.Tensor, chunk: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for start in range(0, x.shape[0], chunk):
        yield x[start : start + chunk], y[start : start + chunk]


def _check_norm(norm: str) -> None:
    if norm not in NORMS:
        raise ValueError(f"norm = {norm!r} is not allowed: expected one of {NORMS}")


def _norms(g: torch.Tensor, norm: str) -> torch.Tensor:
    return g.norm(dim=-1) if norm == "l2" else g.abs().sum(dim=-1)


def check_layers(model: nn.Module) -> None:
    """Raises ConfigError naming the first layer of ``model`` whose per-example gradients are undefined
    (``BATCH_MIXING``) or whose randomness is not the run's (``RANDOM_WHEN_TRAINING``, in training mode)."""
    for path, module in model.named_modules():
        where = f"{path or '(the model itself)'} ({type(module).__name__})"
        if isinstance(module, BATCH_MIXING):
            raise ConfigError("model", where, "a module without batch normalisation: BatchNorm normalises each example "
                                              "by its batch's statistics, so one example's gradient depends on the "
                                              "others and per-example gradients (hence their clipping, hence the "
                                              "sensitivity of DP-SGD) are undefined; use GroupNorm or LayerNorm, "
                                              "which normalise each example on its own")
        if isinstance(module, RANDOM_WHEN_TRAINING) and module.training and module.p > 0:
            raise ConfigError("model", where, "a module without active dropout: its masks would be drawn from torch's "
                                              "global generator, not the run's keyed streams, and torch.func's vmap "
                                              "refuses random operations; remove it, or call .eval() on it (no "
                                              "dropout)")


def _tried(field: str, name: str, expected: str, call):
    """``call()``, with any exception it raises reported as a ConfigError naming ``field`` (a caller's model or loss
    that torch cannot run is a bad input, not a bug deep inside the engine)."""
    try:
        return call()
    except Exception as err:  # noqa: BLE001 - any failure of a caller's code is reported as what it is
        first = (str(err).strip().splitlines() or [""])[0]
        raise ConfigError(field, name, f"{expected} (it raised {type(err).__name__}: {first})") from None


def _shape(record: torch.Tensor) -> str:
    return ", ".join(str(n) for n in record.shape)


def memory_per_example(grads: CohortGradients, record_shape: tuple[int, ...]) -> int:
    """Rough bytes one example of one client needs in `clipped_sum` (used to chunk the cohort)."""
    if grads.strategy == "ghost":
        return grads.ghost_bytes_per_example(tuple(record_shape))
    return 4 * (math.prod(record_shape) + 2 * grads.num_params)


__all__ = ["CohortGradients", "CONV_GHOST_DEVICES", "default_strategy", "VMAP_CPU_CHUNK_BYTES", "NORMS", "BATCH_MIXING",
           "RANDOM_WHEN_TRAINING", "check_layers", "memory_per_example"]
