"""Every model name runs end to end from a config through the real entry point, on the data's own record shape:
flat features (digits' 64 pixels, read by a CNN as 8 x 8 images) and image-shaped npz arrays ([N, H, W], [N, C, H,
W]), and token ids (next-word's JSON lines) for the sequence models; a model that cannot take the data's shape is
refused with exit status 2 and a message naming model.name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dpfl.cli import main
from dpfl.data.next_word import synthetic_users, write_jsonl
from dpfl.models import MODELS, SEQUENCE_MODELS

RUN = ("[algorithm]\nname = 'dp-fedavg'\nrounds = 2\nclient_rate = 1.0\nlocal_steps = 1\nsample_rate = 0.5\n"
       "noise_multiplier = 1.0\nlr = 0.1\n")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def images(folder, shape: tuple[int, ...], records: int = 48):
    """An npz of ``records`` random images of ``shape`` and 3 classes."""
    rng = np.random.default_rng(0)
    path = folder / f"images_{'x'.join(map(str, shape))}.npz"
    np.savez(path, x=rng.random((records, *shape)).astype(np.float32), y=np.arange(records) % 3)
    return path


def run(tmp_path, data: str, model: str, capsys, model_keys: str = "") -> tuple[int, dict | None, str]:
    config = tmp_path / "config.toml"
    config.write_text(f"[data]\n{data}\n[model]\nname = '{model}'\n{model_keys}{RUN}")
    out = tmp_path / "run"
    code = main(["run", str(config), "--out", str(out), "--no-progress", "--json"])
    err = capsys.readouterr().err
    return code, json.loads((out / "results.json").read_text()) if code == 0 else None, err


DIGITS = "name = 'digits'\nnum_clients = 3\nsamples_per_client = 30\nscale = 0.0625"


#: The models that read records as numbers (the sequence models take token ids only).
NUMERIC = [m for m in MODELS if m not in SEQUENCE_MODELS]


@pytest.mark.parametrize("model", [m for m in NUMERIC if m != "papernot-cnn"])
def test_every_model_but_papernots_runs_on_digits_flat_pixels(tmp_path, capsys, model):
    code, results, err = run(tmp_path, DIGITS, model, capsys)
    assert code == 0, err
    assert results["final"]["round"] == 2 and np.isfinite(results["final"]["train_loss"])
    assert results["config"]["model"]["name"] == model


@pytest.mark.parametrize("model", NUMERIC)
@pytest.mark.parametrize("shape", [(16, 16), (3, 16, 16)])
def test_every_model_runs_on_image_shaped_npz_records(tmp_path, capsys, model, shape):
    data = f"name = 'npz'\npath = '{images(tmp_path, shape)}'\nnum_clients = 3"
    code, results, err = run(tmp_path, data, model, capsys)
    assert code == 0, err
    assert results["final"]["round"] == 2 and np.isfinite(results["final"]["train_loss"])


def test_papernots_cnn_refuses_digits_8_x_8_images_with_the_smallest_it_takes(tmp_path, capsys):
    code, _, err = run(tmp_path, DIGITS, "papernot-cnn", capsys)
    assert code == 2 and "Traceback" not in err
    assert "model.name = 'papernot-cnn'" in err and "8 x 8 images" in err and "at least 16 x 16" in err


def test_a_cnn_refuses_flat_features_that_are_not_a_square_image(tmp_path, capsys):
    data = "name = 'breast_cancer'\nnum_clients = 3"
    code, _, err = run(tmp_path, data, "femnist-cnn", capsys)
    assert code == 2 and "model.name = 'femnist-cnn'" in err and "shape [30]" in err and "images" in err


@pytest.mark.parametrize("model", SEQUENCE_MODELS)
def test_the_sequence_models_run_on_next_word_text_and_refuse_digits(tmp_path, capsys, model):
    path = write_jsonl(tmp_path / "text.jsonl", synthetic_users(4, words=30, sentences=(3, 3), mean_length=4))
    sizes = "units = 4\n" if model == "lstm" else "d_model = 8\nheads = 2\n"
    code, results, err = run(tmp_path, f"name = 'next-word'\npath = '{path}'\nsequence_length = 4", model, capsys,
                             sizes)
    assert code == 0, err
    assert results["final"]["round"] == 2 and np.isfinite(results["final"]["train_loss"])
    (tmp_path / "digits").mkdir()
    code, _, err = run(tmp_path / "digits", DIGITS, model, capsys)
    assert code == 2 and "Traceback" not in err
    assert f"model.name = '{model}'" in err and f"shape [64]: {model} takes sequences of token ids" in err
