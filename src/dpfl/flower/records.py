"""What crosses Flower's wire: named tensors as ArrayRecords, the round's job and the drawn noise as ConfigRecords.

A query's reply holds the record "job" with the node's client id, its number of training records and its secure
aggregation public key ("secagg-identity": an OpenSSH line, empty without one). A train message from the ServerApp
holds the records "job" (ConfigRecord: the resolved dpfl config and the algorithm's ``registry.Setting`` as JSON, the
round index, the client id), "server" (ArrayRecord: the broadcast server state) and "client" (ArrayRecord: the
client's own state rows, leading axis 1). The reply holds "messages" (ArrayRecord: what crosses the boundary, leading
axis 1), "client" (the new state rows) and "drawn" (ConfigRecord: the events of the noise the client drew, JSON,
which the ServerApp checks against the declaration). With federated evaluation (``dpfl.flower.evaluation``) a query
"evaluate" holds "job" and "server" (the model "x"), and its reply "metrics" (ConfigRecord: train_loss,
train_records, test_accuracy, test_records: the silo's own, in the clear).
"""

from __future__ import annotations

import json

import torch
from dp_accounting import dp_event
from flwr.app import ArrayRecord, ConfigRecord

from dpfl.accounting.events import event_from_dict, event_to_dict

JOB, SERVER, CLIENT, MESSAGES, DRAWN = "job", "server", "client", "messages", "drawn"
#: The query of federated evaluation, and its reply's record.
EVALUATE, METRICS = "evaluate", "metrics"
#: The field of a query reply's "job" record with the node's secure aggregation public key (empty: none).
IDENTITY = "secagg-identity"


def tensors_record(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    return ArrayRecord(torch_state_dict={name: value.detach().contiguous() for name, value in tensors.items()})


def tensors_of(record: ArrayRecord) -> dict[str, torch.Tensor]:
    return dict(record.to_torch_state_dict())


def events_record(events: list[dp_event.DpEvent]) -> ConfigRecord:
    return ConfigRecord({"events": json.dumps([event_to_dict(e) for e in events])})


def events_of(record: ConfigRecord) -> list[dp_event.DpEvent]:
    return [event_from_dict(d) for d in json.loads(record["events"])]


__all__ = ["JOB", "SERVER", "CLIENT", "MESSAGES", "DRAWN", "IDENTITY", "EVALUATE", "METRICS", "tensors_record",
           "tensors_of", "events_record",
           "events_of"]
