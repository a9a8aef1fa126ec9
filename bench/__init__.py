"""`make bench`: hexmq against Debian's mosquitto, on one machine, with our own load generator.

The orchestrator (``bench.cli``) starts the brokers and, per run, one or two load-generator
processes (``bench.worker``) that it drives over JSON lines on their stdin/stdout. Every phase
of a run is an absolute CLOCK_MONOTONIC time, shared by all processes on the machine, so the
publishers, the subscriber and the CPU sampler agree on the measurement window without talking
during it. See docs/benchmarks.md for the method and figures.
"""
