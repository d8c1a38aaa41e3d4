"""Next-token models over sequences of token ids: an embedding + LSTM and a small causal transformer.

A record is a sequence of L token ids (stored as float32, exact below 2^24, like every record of ``ClientArrays``);
its label is the id of the token that follows it. The vocabulary is the data's classes: every input id and every
label lies in [0, num_classes) (Shakespeare: LEAF's 80 characters and "other", 81 classes; next-word: the words kept
and the special tokens, ``dpfl.data.next_word``). Both models read the whole sequence and predict from its last
position, as LEAF's next-character task is posed (Caldas et al. 2018).

* ``NextTokenLSTM`` (McMahan, Moore, Ramage, Hampson, Aguera y Arcas 2017, "Communication-efficient learning of deep
  networks from decentralized data", Sec. 3: "a character-level LSTM language model ... reads each character into
  an 8-dimensional embedding, then two LSTM layers of 256 units, then a softmax output layer with one node per
  character"). For 81 characters: 648 + 271,360 + 525,312 + 20,817 = 818,137 parameters (one bias per gate: nn.LSTM's
  two biases per gate are one parameter written twice).
* ``CausalTransformer``: token and learned position embeddings, pre-norm blocks of causal multi-head self-attention
  and a 4x MLP (GELU), a final LayerNorm and a linear read-out (Vaswani et al. 2017's decoder, in Radford et al.
  2019's pre-norm arrangement), small by default.

Both are written from matrix products, not nn.LSTM's fused kernel or nn.MultiheadAttention's fast path: torch.func's
vmap over clients (and over examples, for per-example clipping) has batching rules for matmuls and element-wise
ops, whereas nn.LSTM's CPU kernel (aten::mkldnn_rnn_layer) falls back to a Python loop over the vmapped rows. Neither
mixes examples of a batch (no batch normalisation, no dropout), so per-example gradients are defined and the record-
level families clip them through ``CohortGradients``' vmap strategy.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn


def normal(*shape: int, std: float = 1.0) -> torch.Tensor:
    """A tensor of N(0, std^2) draws (torch's global generator, seeded by run.seed), or its shape alone on the meta
    device (a memory estimate), where torch's in-place normal draw would first import its compiler (seconds, once a
    process)."""
    tensor = torch.empty(*shape)
    return tensor if tensor.is_meta else nn.init.normal_(tensor, std=std)


def embedding_layer(vocabulary: int, width: int) -> nn.Embedding:
    """nn.Embedding(vocabulary, width) with its N(0, 1) initial weights drawn by ``normal``."""
    return nn.Embedding(vocabulary, width, _weight=normal(vocabulary, width))


def token_ids(x: torch.Tensor) -> torch.Tensor:
    """Records of float32 token ids as the int64 indices an embedding takes."""
    return x.long()


class LSTMLayer(nn.Module):
    """One LSTM layer (Hochreiter and Schmidhuber 1997, with a forget gate, Gers et al. 2000): for each step t,
    [i, f, g, o] = W x_t + U h_{t-1} + b, c_t = sigmoid(f) c_{t-1} + sigmoid(i) tanh(g), h_t = sigmoid(o) tanh(c_t),
    from h_0 = c_0 = 0. Initialised as nn.LSTM: every weight uniform in [-1/sqrt(units), 1/sqrt(units)]."""

    def __init__(self, inputs: int, units: int):
        super().__init__()
        self.units = units
        self.input = nn.Linear(inputs, 4 * units)
        self.recurrent = nn.Linear(units, 4 * units, bias=False)
        bound = 1 / math.sqrt(units)
        for weight in self.parameters():
            nn.init.uniform_(weight, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, L, inputs] -> the hidden states [N, L, units]."""
        projected = self.input(x)  # every step's input projection in one product
        h = c = projected.new_zeros(*x.shape[:-2], self.units)
        states = []
        for t in range(x.shape[-2]):
            i, f, g, o = (projected[..., t, :] + self.recurrent(h)).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            states.append(h)
        return torch.stack(states, dim=-2)


class NextTokenLSTM(nn.Module):
    """Embedding(vocabulary, embedding) -> ``layers`` LSTM layers of ``units`` -> Linear(units, vocabulary), read at
    the last position (module docstring; McMahan et al. 2017's 8, 2 x 256 by default)."""

    def __init__(self, vocabulary: int, embedding: int = 8, units: int = 256, layers: int = 2):
        super().__init__()
        self.embedding = embedding_layer(vocabulary, embedding)
        self.layers = nn.ModuleList(LSTMLayer(embedding if k == 0 else units, units) for k in range(layers))
        self.output = nn.Linear(units, vocabulary)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Records [N, L] of token ids -> logits [N, vocabulary] for the token after each."""
        h = self.embedding(token_ids(x))
        for layer in self.layers:
            h = layer(h)
        return self.output(h[..., -1, :])


class CausalSelfAttention(nn.Module):
    """Multi-head attention of each position to itself and the positions before it: softmax(q k^T / sqrt(d_head) +
    causal mask) v, the heads concatenated and projected."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *lead, length, d_model = x.shape
        q, k, v = (part.reshape(*lead, length, self.heads, -1).transpose(-3, -2)
                   for part in self.qkv(x).chunk(3, dim=-1))  # [..., heads, L, d_head]
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        attended = scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v
        return self.out(attended.transpose(-3, -2).reshape(*lead, length, d_model))


class Block(nn.Module):
    """x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x)) with a 4 d_model GELU hidden layer."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.norm1, self.attention = nn.LayerNorm(d_model), CausalSelfAttention(d_model, heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CausalTransformer(nn.Module):
    """Token and position embeddings (d_model) -> ``layers`` ``Block``s -> LayerNorm -> Linear(d_model, vocabulary),
    read at the last position, for sequences of ``length`` tokens (module docstring)."""

    def __init__(self, vocabulary: int, length: int, d_model: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.embedding = embedding_layer(vocabulary, d_model)
        self.position = nn.Parameter(normal(length, d_model, std=0.02))
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.output = nn.Linear(d_model, vocabulary)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Records [N, L] of token ids -> logits [N, vocabulary] for the token after each."""
        h = self.embedding(token_ids(x)) + self.position
        for block in self.blocks:
            h = block(h)
        return self.output(self.norm(h[..., -1, :]))


__all__ = ["NextTokenLSTM", "CausalTransformer", "LSTMLayer", "embedding_layer", "normal", "token_ids"]
