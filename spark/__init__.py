"""Spark jobs over OpenTelemetry trace exports (the trace-analysis issue fills this in)."""
