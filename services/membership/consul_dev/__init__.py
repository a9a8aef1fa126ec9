"""`hexmq consul-dev`: an embedded server for the subset of Consul's HTTP API the agents use.

`state` is the deterministic core (KV, sessions, agent services and TTL checks; the clock is
passed in, changes are recorded for the adapter), `http` the aiohttp adapter, `main` the
command. Semantics follow Consul's code and docs; docs/operations.md lists what is left out.
"""
