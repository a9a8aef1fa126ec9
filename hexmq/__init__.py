"""hexmq: code shared by every hexmq service.

- ``hexmq.api``: generated gRPC/protobuf modules (``make proto``; never edited by hand).
- ``hexmq.mqtt``: the sans-IO MQTT 3.1.1/5.0 codec.
- ``hexmq.topics``: topic validation and the subscription trie.
- ``hexmq.hashring``: partition keys and replica placement.
- ``hexmq.membership``: what the services need of membership: the agent's client (the view
  watch, the leave) and what a view says (``master_of`` a partition, partition health).
- ``hexmq.cli``: only ``python -m hexmq.cli``, which runs the ``hexmq`` command. The command
  and the local-cluster tooling are the package ``hexmq_cli``, which nothing here imports.
- ``hexmq.netaddr``, ``hexmq.service``: address parsing and process scaffolding for services.
"""

__version__ = "0.1.0"
