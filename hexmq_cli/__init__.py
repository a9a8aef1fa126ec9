"""The `hexmq` command and the local-cluster tooling, apart from the services and their shared
package.

- ``hexmq_cli.cli``: the ``hexmq`` command (``python -m hexmq_cli`` runs it too).
- ``hexmq_cli.localcluster`` with ``hexmq_cli.localmembers`` (adding and removing nodes) and
  ``hexmq_cli.localsecure`` (securing a running cluster): ``hexmq cluster``.
- ``hexmq_cli.clusterstate``: where a local cluster's ports, state and config files are;
  ``hexmq_cli.procs``: processes spawned and signalled safely; ``hexmq_cli.localsecurity``: its
  certificates, Redis passwords and Consul token; ``hexmq_cli.linkstatus``: its links as the
  services' metrics report them.
- ``hexmq_cli.certs_cli``, ``hexmq_cli.secrets_cli``, ``hexmq_cli.healthprobe``: ``hexmq
  certs``, ``hexmq secrets``, ``hexmq health``.

This package may import everything: ``hexmq`` and the services (it runs their subcommands).
Nothing imports it but itself, tests and benchmarks (tests/unit/test_service_imports.py).
"""
