"""Trace analysis for hexmq: a PySpark job over OTLP JSON trace files (docs/traces.md).

schema.py holds the input/output schemas and the span contract, transforms.py the pure
DataFrame -> DataFrame steps, report.py the HTML/PNG report, job.py the command line
(`python -m spark.hexmq_traces INPUT --out DIR`), synth.py a generator of synthetic traces.
"""
