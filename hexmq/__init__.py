"""hexmq: code shared by every hexmq service.

- ``hexmq.api``: generated gRPC/protobuf modules (``make proto``; never edited by hand).
- ``hexmq.mqtt``: the sans-IO MQTT 3.1.1/5.0 codec.
- ``hexmq.topics``: topic validation and the subscription trie.
- ``hexmq.hashring``: partition keys and replica placement.
- ``hexmq.cli`` / ``hexmq.localcluster``: the ``hexmq`` command and local clusters.
"""

__version__ = "0.1.0"
