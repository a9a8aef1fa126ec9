"""The membership service: the cluster view that every local service routes by."""
