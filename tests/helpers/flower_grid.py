"""Shared helpers of the Flower tests (on the tests' path: pyproject's ``pythonpath``); import after
``pytest.importorskip("flwr")``."""

from flwr.app import Context, Error, Message, RecordDict


class InProcessGrid:
    """Flower's Grid (``get_node_ids``, ``send_and_receive``) over ClientApps in this process: node 101 + i holds
    partition i. ``lost(message)`` says whether a message's reply is lost (its node dropped out); ``received`` is
    every reply the server got, with the message it answers."""

    def __init__(self, app, nodes: int):
        self.app, self.lost, self.received = app, (lambda message: False), []
        self.contexts = {101 + i: Context(run_id=1, node_id=101 + i, node_config={"partition-id": i},
                                          state=RecordDict(), run_config={}) for i in range(nodes)}

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for message in messages:
            try:
                reply = self.app(message, self.contexts[message.metadata.dst_node_id])
            except Exception as err:  # the runtime turns a ClientApp's exception into an error reply
                reply = Message(Error(0, str(err)), reply_to=message)
            if not self.lost(message):
                self.received.append((message, reply))
                replies.append(reply)
        return replies
