"""`hexmq consul-dev`: an embedded server for the subset of Consul's HTTP API the agents use.

The deterministic core: `state` (ConsulState: the clock passed in, changes and notices
recorded for the adapter), built of `kv` (entries, tombstones, lock-delays), `catalog` (the one
node, its services and TTL checks, health indexes) and `model` (records, errors, watches, Go
durations); `decode` reads requests as Consul does. Around it: `http` (the aiohttp adapter),
`watches` (blocked queries), `datafile` (--data-dir) and `main` (the command). Semantics follow
Consul's code and docs; docs/operations.md says where this server differs.
"""
