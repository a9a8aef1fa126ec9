# syntax=docker/dockerfile:1
# hexmq: one image for every service of a node, chosen by command:
#   docker run hexmq:0.1.0 edge|partition|membership [OPTIONS]   (options also as HEXMQ_* variables)
# Stages: build (the virtual environment; nothing of it but /opt/hexmq reaches the image),
# traces (the Spark trace-analysis job on apache/spark, `--target traces`, used by
# deploy/compose under the traces profile), and hexmq, the default and final stage.
# docs/deploy.md describes the image; tests/integration/test_image.py checks the final stage.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- build ---------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY hexmq ./hexmq
COPY services ./services
COPY hexmq_cli ./hexmq_cli
COPY spark ./spark
# CA certificates (PEM) pip trusts beside its own bundle, for a build host behind a
# TLS-inspecting proxy: --build-arg EXTRA_CA_CERTS="$(cat /usr/local/share/ca-certificates/*.crt)"
# (compose: HEXMQ_BUILD_CA_CERTS). Only public certificates: build arguments stay in the history.
ARG EXTRA_CA_CERTS=""
# Every dependency comes as a wheel (grpcio, hiredis, uvloop ...): no compiler needed. The
# versions are the ones constraints.txt pins, as for `make venv`.
RUN python -m venv /opt/hexmq \
    && printf '%s\n' "$EXTRA_CA_CERTS" > /tmp/extra-ca.pem \
    && cat "$(/opt/hexmq/bin/python -c 'from pip._vendor import certifi; print(certifi.where())')" \
        /tmp/extra-ca.pem > /tmp/ca.pem \
    && PIP_CERT=/tmp/ca.pem /opt/hexmq/bin/pip install --no-cache-dir -c constraints.txt . \
    && rm /tmp/extra-ca.pem /tmp/ca.pem \
    && /opt/hexmq/bin/pip uninstall --yes pip \
    && /opt/hexmq/bin/python -m compileall -q /opt/hexmq/lib

# ---- traces: the Spark job over the Collector's trace files ----------------------------------
FROM apache/spark:4.3.0-python3 AS traces
USER 0
COPY constraints.txt /tmp/constraints.txt
# The report's charts need matplotlib, which the Spark image lacks; --target keeps it apart
# from the image's own Python packages.
RUN python3 -m pip install --no-cache-dir --target /opt/hexmq/pylib \
        -c /tmp/constraints.txt matplotlib==3.11.2 \
    && rm /tmp/constraints.txt \
    && mkdir -p /report \
    && chown 10001:10001 /report
COPY spark /opt/hexmq/spark
# Hadoop asks the OS for the user's name, which uid 10001 does not have here: name it.
ENV PYTHONPATH=/opt/hexmq/pylib \
    HADOOP_USER_NAME=hexmq \
    SPARK_USER=hexmq
WORKDIR /opt/hexmq
USER 10001:10001

# ---- hexmq: the services (final stage) -----------------------------------------------------
FROM ${PYTHON_IMAGE} AS hexmq
ARG HEXMQ_UID=10001
RUN groupadd --system --gid "${HEXMQ_UID}" hexmq \
    && useradd --system --uid "${HEXMQ_UID}" --gid hexmq --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin hexmq
COPY --from=build /opt/hexmq /opt/hexmq
# HEXMQ_METRICS_LISTEN: every service serves /metrics, /healthz and /readyz on 9100, which the
# HEALTHCHECK asks (the same command for every role: each answers with its own readiness).
# Its 15 s timeout holds on a loaded small host (every container's probe at once: 5-6 s seen).
ENV PATH=/opt/hexmq/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HEXMQ_METRICS_LISTEN=0.0.0.0:9100
USER 10001:10001
# MQTT, MQTT over WebSocket, membership gRPC, partition gRPC, metrics/health HTTP, edge gRPC health
EXPOSE 1883 8083 7000 7001 9100 9090
HEALTHCHECK --interval=5s --timeout=15s --start-period=60s --retries=3 \
    CMD ["hexmq", "health"]
ENTRYPOINT ["hexmq"]
CMD ["--help"]
