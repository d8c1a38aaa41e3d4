"""The sequence models (``dpfl.models.sequence``): McMahan et al. 2017's LSTM size, the LSTM written from matmuls
equal to torch's nn.LSTM, causal attention, per-example gradients through vmap, the unclipped per-client gradient
equal to the sum of the per-example ones, clear refusals, and runs on LEAF Shakespeare files through a config and
through ``dpfl.run(model=...)``."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

import dpfl
from dpfl.data.leaf import ALPHABET
from dpfl.engine.grads import CohortGradients
from dpfl.errors import ConfigError
from dpfl.models import build_model
from dpfl.models.sequence import CausalTransformer, LSTMLayer, NextTokenLSTM

CHARACTERS = len(ALPHABET) + 1  # LEAF's 80 and "other"
LINES = {"ROMEO": "But soft, what light through yonder window breaks? It is the east, and Juliet is the sun.",
         "JULIET": "O Romeo, Romeo, wherefore art thou Romeo? Deny thy father and refuse thy name.",
         "HAMLET": "To be, or not to be, that is the question: whether tis nobler in the mind to suffer",
         "MACBETH": "Tomorrow, and tomorrow, and tomorrow, creeps in this petty pace from day to day"}


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def tokens(shape, vocabulary: int = CHARACTERS, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocabulary, shape, generator=torch.Generator().manual_seed(seed)).float()


def test_the_lstm_has_mcmahan_et_al_s_shape():
    """8-dim embedding, 2 x 256 LSTM, softmax over the 81 characters: 648 + 4 * 256 * (8 + 256 + 1) + 4 * 256 * (256
    + 256 + 1) + 257 * 81 parameters."""
    model = build_model("lstm", 80, CHARACTERS, tokens=True)
    assert count(model) == 648 + 271_360 + 525_312 + 20_817 == 818_137
    assert model(tokens((3, 80))).shape == (3, CHARACTERS)


def test_the_lstm_layer_is_torchs_lstm():
    """The same weights (nn.LSTM's two biases summed into one) give nn.LSTM's hidden states."""
    torch.manual_seed(0)
    reference, layer = nn.LSTM(5, 7, batch_first=True), LSTMLayer(5, 7)
    with torch.no_grad():
        layer.input.weight.copy_(reference.weight_ih_l0)
        layer.input.bias.copy_(reference.bias_ih_l0 + reference.bias_hh_l0)
        layer.recurrent.weight.copy_(reference.weight_hh_l0)
    x = torch.randn(3, 11, 5, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(layer(x), reference(x)[0], rtol=1e-5, atol=1e-6)


def test_the_transformer_is_causal_and_reads_the_last_position():
    """Changing token t leaves every hidden state before t as it was; the logits change."""
    torch.manual_seed(0)
    model = CausalTransformer(CHARACTERS, 12, d_model=16, layers=2, heads=4)
    x = tokens((2, 12))
    changed = x.clone()
    changed[:, 7] = (changed[:, 7] + 1) % CHARACTERS

    def hidden(x):
        h = model.embedding(x.long()) + model.position
        for block in model.blocks:
            h = block(h)
        return h

    torch.testing.assert_close(hidden(x)[:, :7], hidden(changed)[:, :7])
    assert not torch.allclose(hidden(x)[:, 7:], hidden(changed)[:, 7:])
    assert count(model) == 81 * 16 + 12 * 16 + 2 * (2 * 32 + 16 * 48 + 48 + 16 * 16 + 16 + 16 * 64 + 64 + 64 * 16
                                                    + 16) + 32 + 16 * 81 + 81
    assert model(x).shape == (2, CHARACTERS)


@pytest.mark.parametrize("name, sizes", [("lstm", {"embedding": 4, "units": 6, "layers": 2}),
                                         ("transformer", {"d_model": 8, "layers": 1, "heads": 2})])
def test_per_example_gradients_are_clipped_through_vmap_and_the_unclipped_sum_is_one_gradient(name, sizes):
    """Record-level families clip each example's gradient (vmap strategy); without a clip the engine takes one
    gradient of each client's masked loss sum, equal to the sum of the per-example gradients of its real examples."""
    torch.manual_seed(0)
    grads = CohortGradients(build_model(name, 10, CHARACTERS, tokens=True, **sizes))
    assert grads.strategy == "vmap"
    theta = grads.initial_params().unsqueeze(0).repeat(2, 1)
    theta[1] += 0.01
    x, y = tokens((2, 5, 10)), tokens((2, 5), seed=1).long()
    mask = torch.tensor([[1.0, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    clipped = grads.clipped_sum(theta, x, y, mask, 0.1)
    norms = grads.example_norms(theta, x, y, mask)
    assert float(norms.max()) > 0.1 and float(clipped.norm(dim=1)[0]) <= 4 * 0.1 + 1e-6
    by_example = grads.clipped_sum(theta, x, y, mask, float("inf"))
    torch.testing.assert_close(grads.clipped_sum(theta, x, y, mask, None), by_example, rtol=1e-4, atol=1e-6)


def test_sequence_models_refuse_data_that_are_not_token_sequences():
    with pytest.raises(ConfigError, match=r"model.name = 'lstm'.*shape \[64\]: lstm takes sequences of token ids"):
        build_model("lstm", 64, 10)
    with pytest.raises(ConfigError, match=r"shape \[1, 28, 28\]: transformer takes"):
        build_model("transformer", (1, 28, 28), 62, tokens=True)
    with pytest.raises(ConfigError, match=r"model.heads = 3 is not allowed: expected a divisor of model.d_model = 64"):
        build_model("transformer", 80, CHARACTERS, tokens=True, heads=3)
    with pytest.raises(ConfigError, match=r"model.units = 0 is not allowed: expected a positive integer"):
        build_model("lstm", 80, CHARACTERS, tokens=True, units=0)
    with pytest.raises(ConfigError, match="lstm takes sequences of token ids"):
        dpfl.run({"data": {"name": "digits", "num_clients": 10}, "model": {"name": "lstm"}})


def role(text: str, length: int) -> tuple[list, list]:
    """LEAF's next-character records of a role: each window of ``length`` characters (the text prefixed with spaces)
    and the character after it."""
    padded = " " * length + text
    return [padded[i : i + length] for i in range(len(text))], [padded[i + length] for i in range(len(text))]


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shakespeare")
    (folder / "all_data").mkdir()
    users = {name: role(text, 20) for name, text in LINES.items()}
    document = {"users": list(users), "num_samples": [len(y) for _, y in users.values()],
                "user_data": {name: {"x": x, "y": y} for name, (x, y) in users.items()}}
    (folder / "all_data" / "all_data.json").write_text(json.dumps(document))
    return str(folder)


SMALL_LSTM = {"name": "lstm", "embedding": 4, "units": 8, "layers": 2}


@pytest.mark.parametrize("algorithm", [{"name": "dp-fedavg-user", "noise_multiplier": 1.0, "client_rate": 0.5},
                                       {"name": "dp-ftrl", "client_rate": 0.5},
                                       {"name": "dp-fedavg", "client_rate": 0.5, "local_steps": 2}])
def test_the_lstm_trains_on_leaf_shakespeare_from_a_config_and_as_a_callers_module(shakespeare, algorithm):
    """The built-in lstm of a config and the same module handed to dpfl.run(model=...) (built under run.seed's
    torch seed, as the config's is) give the same run: the same accuracy each round, the same epsilon."""
    config = {"algorithm": {**algorithm, "rounds": 2}, "data": {"name": "shakespeare", "path": shakespeare},
              "model": SMALL_LSTM, "run": {"noise_seed": 1}}
    built = dpfl.run(config)
    torch.manual_seed(0)
    module = NextTokenLSTM(CHARACTERS, embedding=4, units=8, layers=2)
    supplied = dpfl.run({**config, "model": {"name": "custom"}}, model=module)
    assert built.status == supplied.status == "finished" and len(built.rounds) == 2
    assert [r["test_accuracy"] for r in built.rounds] == [r["test_accuracy"] for r in supplied.rounds]
    assert built.epsilon == supplied.epsilon and built.epsilon["third_party"] > 0
