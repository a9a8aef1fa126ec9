"""The hexmq services; each runs as its own process (``hexmq edge|partition|membership``)."""
