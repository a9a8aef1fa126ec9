#!/usr/bin/env bash
# Make the Secrets hexmq's Kubernetes manifests mount, and print them as manifests for
# `kubectl apply -n NAMESPACE -f -` (docs/kubernetes.md, "Secrets"):
#
#   hexmq-membership-tls  ca.crt, and <node>.crt/.key for each node: spiffe://hexmq/membership/<node>
#   hexmq-partition-tls   ca.crt, and <node>.crt/.key for each node: spiffe://hexmq/partition/<node>
#   hexmq-edge-tls        ca.crt, and <edge>.crt/.key for each edge: spiffe://hexmq/edge/<edge>;
#                         with --colocated also <node>.crt/.key for each node's own edge
#                         (spiffe://hexmq/edge/<node>, which a co-located node pod reads)
#   hexmq-redis           <node>.password (the partition service's) and <node>.acl (Redis's)
#   hexmq-consul          token: the Consul ACL token the agents send (and consul-dev takes)
#
# Node ids are the node pods' names (hexmq-node-0 ...), edge ids the edge pods' (hexmq-edge-0
# ...). Everything is made by `hexmq secrets init` and `hexmq certs issue` in DIR, which keeps
# what exists: run it again with more --nodes or --edges and the new ones are issued by the same
# CA, the others unchanged. DIR holds the CA's key (tls/ca.key): keep it off the cluster.
#
# usage: make-secrets.sh --nodes N --edges M [--colocated] [--dir DIR]
#                        [--consul-token-file FILE] [--trust-domain DOMAIN]
#   --colocated          the nodes' own edges' certificates too (components/colocated);
#                        --edges may then be 0 (no pool of standalone edges)
#   --consul-token-file  the agents' token for an external Consul (docs/deploy.md has its
#                        policy); default: DIR/consul.token, made here (what consul-dev takes)
# Environment: HEXMQ (default: hexmq), KUBECTL (default: kubectl); nothing else is needed, no
# cluster either: the manifests are made with `kubectl create secret --dry-run=client`.
set -euo pipefail

usage() { sed -n '/^# usage:/,/^# Environment/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

nodes= edges= dir=hexmq-secrets token_file= trust_domain=hexmq colocated=
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=${2:?}; shift 2 ;;
    --edges) edges=${2:?}; shift 2 ;;
    --colocated) colocated=1; shift ;;
    --dir) dir=${2:?}; shift 2 ;;
    --consul-token-file) token_file=${2:?}; shift 2 ;;
    --trust-domain) trust_domain=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done
case "$nodes" in ''|*[!0-9]*) usage ;; esac
case "$edges" in ''|*[!0-9]*) usage ;; esac
[ "$nodes" -ge 1 ] && { [ "$edges" -ge 1 ] || [ "$colocated" ]; } || usage

read -r -a hexmq <<< "${HEXMQ:-hexmq}"
kubectl=${KUBECTL:-kubectl}
node_ids=() edge_ids=()
for ((i = 0; i < nodes; i++)); do node_ids+=("hexmq-node-$i"); done
for ((i = 0; i < edges; i++)); do edge_ids+=("hexmq-edge-$i"); done

# Every node's certificates (all three roles), its Redis password and ACL file, the Consul token.
(IFS=,; "${hexmq[@]}" secrets init --dir "$dir" --nodes "${node_ids[*]}" \
  --trust-domain "$trust_domain") >&2
for edge in "${edge_ids[@]}"; do
  if [ ! -f "$dir/tls/$edge/edge.crt" ]; then
    "${hexmq[@]}" certs issue --dir "$dir/tls" --role edge --node "$edge" \
      --trust-domain "$trust_domain" >&2
  fi
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -m 0700 -p "$stage"/{membership,partition,edge,redis,consul}
for role in membership partition edge; do
  cp "$dir/tls/ca.crt" "$stage/$role/ca.crt"
done
for node in "${node_ids[@]}"; do
  for role in membership partition; do
    cp "$dir/tls/$node/$role.crt" "$stage/$role/$node.crt"
    cp "$dir/tls/$node/$role.key" "$stage/$role/$node.key"
  done
  if [ "$colocated" ]; then
    cp "$dir/tls/$node/edge.crt" "$stage/edge/$node.crt"
    cp "$dir/tls/$node/edge.key" "$stage/edge/$node.key"
  fi
  cp "$dir/redis/$node.password" "$stage/redis/$node.password"
  cp "$dir/redis/$node.acl" "$stage/redis/$node.acl"
done
for edge in "${edge_ids[@]}"; do
  cp "$dir/tls/$edge/edge.crt" "$stage/edge/$edge.crt"
  cp "$dir/tls/$edge/edge.key" "$stage/edge/$edge.key"
done
cp "${token_file:-$dir/consul.token}" "$stage/consul/token"

first=1
for pair in membership:hexmq-membership-tls partition:hexmq-partition-tls edge:hexmq-edge-tls \
            redis:hexmq-redis consul:hexmq-consul; do
  [ "$first" ] || echo ---
  first=
  "$kubectl" create secret generic "${pair#*:}" --from-file="$stage/${pair%%:*}" \
    --dry-run=client -o yaml
done
