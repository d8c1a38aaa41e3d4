"""One client holding a single record sets every record's epsilon (its fixed-size batch of max(1, floor(s n)) = 1 of
n = 1 record is no sample, so Wang et al. 2019's amplification vanishes for it): `dpfl run` warns, naming the client
and its count (``dpfl.experiments.doubtful.check_smallest_client``); clients of similar sizes draw no warning."""

import json

import numpy as np
import pytest

from dpfl.cli import main

CONFIG = """[data]
name = "npz"
path = "clinics.npz"
[algorithm]
name = "dp-fedavg"
rounds = 2
local_steps = 2
noise_multiplier = 1.0
client_rate = 1.0
[privacy]
delta = 1e-4
"""


def clinics(folder, sizes: list[int]):
    """An npz of len(sizes) clients (ids 10, 11, ...) with ``sizes`` training records and a fifth as many test ones
    (one at least), and its config."""
    rng = np.random.default_rng(0)
    client = np.repeat(np.arange(10, 10 + len(sizes)), [n + max(1, n // 5) for n in sizes])
    x = rng.normal(size=(len(client), 3))
    split = np.concatenate([[0] * n + [1] * max(1, n // 5) for n in sizes])
    np.savez(folder / "clinics.npz", x=x, y=(x[:, 0] > 0).astype(int), client=client, split=split)
    (folder / "study.toml").write_text(CONFIG)
    return folder / "study.toml"


def third_party_epsilon(config, out, capsys) -> tuple[float, str]:
    assert main(["run", str(config), "--out", str(out), "--no-progress", "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out)["epsilon"]["third_party"], captured.err


@pytest.mark.parametrize("sizes, warned", [([40, 40, 40, 1], True), ([40, 40, 40, 30], False)])
def test_a_client_of_one_record_is_named_with_its_count(tmp_path, capsys, sizes, warned):
    epsilon, err = third_party_epsilon(clinics(tmp_path, sizes), tmp_path / "run", capsys)
    assert ("dpfl run: warning: client 3 (id 13) holds 1 training record(s), the median client 40" in err) == warned
    assert ("raises every observer's epsilon" in err) == warned
    assert epsilon == pytest.approx(8.75079 if warned else 2.36677, rel=1e-5)
