"""Trust inside the cluster (docs/security.md): who a process is, and who may call it.

- `identity`: a certificate names one node and one role (edge, partition, membership,
  operator) in a SPIFFE-style URI SAN; how a servicer reads the caller's identity.
- `certs`: the cluster CA and the certificates it issues (made with `cryptography`).
- `grpc_tls`: a process's TLS settings for the cluster's gRPC links (the `--cluster-*`
  options), credentials that pick up renewed files without a restart, and the choice between
  TLS and plain text for each peer.
- `guard`: what each RPC requires of its caller, refused with PERMISSION_DENIED otherwise.
"""
