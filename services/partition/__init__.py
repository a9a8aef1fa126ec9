"""The partition service: sessions, subscriptions and queues in the node's own Redis."""
