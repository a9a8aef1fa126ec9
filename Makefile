# hexmq developer entry points. `make run` and `make test` set up everything they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PROTOS := $(shell find protos -name '*.proto' | sort)
RUN_DIR ?= .hexmq/run
NODES  ?= 3
RF     ?= 2
PYTEST_ARGS ?=
# make test's workers (pytest-xdist, a test file per worker): the suite mostly waits on real
# processes, so three workers on two cores take about half the time of one. TEST_WORKERS=0 runs
# it in this process, one test at a time. Files go out longest first, by the durations recorded
# in tests/file_durations.json (`make test-durations` records them again; tests/conftest.py).
TEST_WORKERS ?= 3
TEST_SELECTION := -m "not fault and not soak and not interop and not deploy" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

COMPOSE_DIR := deploy/compose
COMPOSE := $(BIN)/docker-compose --profile observability --profile traces

.PHONY: system-deps venv proto proto-check lint typecheck deploy-check test test-durations test-unit test-fault test-colocated test-interop test-deploy bench bench-moderate bench-transport bench-failover bench-rebalance bench-memory bench-retained bench-attacks run clean

# redis-server and the mosquitto tools come from the system's packages (apt on Debian).
# (A no-op when they are installed, so every target that needs them can depend on it.)
system-deps:
	@scripts/system-deps.sh

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# The only way generated code is made. Protos live under a path equal to their package
# (protos/hexmq/api/...), so generated imports resolve unedited.
proto: $(STAMP)
	rm -rf hexmq/api
	$(BIN)/python -m grpc_tools.protoc -I protos \
	  --python_out=. --grpc_python_out=. \
	  --plugin=protoc-gen-mypy=$(BIN)/protoc-gen-mypy --mypy_out=. \
	  --plugin=protoc-gen-mypy_grpc=$(BIN)/protoc-gen-mypy_grpc --mypy_grpc_out=. \
	  $(PROTOS)
	find hexmq/api -type d -exec touch {}/__init__.py \;

# CI: regenerate and fail if the committed code differs.
proto-check: proto
	git add -N hexmq/api
	git diff --exit-code -- hexmq/api

lint: $(STAMP)
	$(BIN)/ruff check hexmq services hexmq_cli spark tests bench
	$(BIN)/ruff format --check hexmq services hexmq_cli spark tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

# The deployment files, checked every way that runs without a Docker engine: the Compose v2
# binary (rejects unknown keys, undefined dependencies; also with node 4's file, with the
# co-located nodes' file and with the stand-ins of make test-deploy), the compose-spec JSON
# schema (also on compose.yaml + compose.node4.yaml and compose.yaml + compose.colocated.yaml
# as Compose merges them), hadolint, haproxy -c, and the checks of what no
# tool checks (tests/unit/test_deploy_files.py: one image build, a healthcheck with a timeout
# that holds on a loaded host for every long-running service, stop grace periods, HAProxy's
# resolvers and open files; HAProxy started with the file's config under 1024 open files). Then
# every Kubernetes overlay, without a cluster: rendered by `kubectl kustomize`, validated
# against the Kubernetes JSON schemas of the oldest and newest versions it is for (strict:
# unknown fields fail), and compared with what `hexmq cluster up` runs for the same cluster
# (tests/support/kubernetes_equivalence.py: the same processes, the same options, but where it
# says why not).
K8S_OVERLAYS := $(sort $(wildcard deploy/kubernetes/overlays/*))
K8S_VERSIONS := 1.27.0 1.37.0
deploy-check: $(STAMP) system-deps
	$(COMPOSE) -f $(COMPOSE_DIR)/compose.yaml config -q
	$(COMPOSE) -f $(COMPOSE_DIR)/compose.yaml -f $(COMPOSE_DIR)/compose.node4.yaml config -q
	$(BIN)/check-jsonschema --builtin-schema vendor.compose-spec $(COMPOSE_DIR)/compose.yaml
	@merged=$$(mktemp --suffix=.yaml) && trap 'rm -f "$$merged"' EXIT && \
	  $(COMPOSE) -f $(COMPOSE_DIR)/compose.yaml -f $(COMPOSE_DIR)/compose.node4.yaml config > "$$merged" && \
	  echo "check-jsonschema: compose.yaml + compose.node4.yaml, merged" && \
	  $(BIN)/check-jsonschema --builtin-schema vendor.compose-spec "$$merged"
	$(COMPOSE) -f $(COMPOSE_DIR)/compose.yaml -f $(COMPOSE_DIR)/compose.colocated.yaml config -q
	@merged=$$(mktemp --suffix=.yaml) && trap 'rm -f "$$merged"' EXIT && \
	  $(COMPOSE) -f $(COMPOSE_DIR)/compose.yaml -f $(COMPOSE_DIR)/compose.colocated.yaml config > "$$merged" && \
	  echo "check-jsonschema: compose.yaml + compose.colocated.yaml, merged" && \
	  $(BIN)/check-jsonschema --builtin-schema vendor.compose-spec "$$merged"
	$(COMPOSE) -f $(COMPOSE_DIR)/compose.yaml -f $(COMPOSE_DIR)/compose.standin.yaml config -q
	$(BIN)/hadolint Dockerfile
	haproxy -c -q -f $(COMPOSE_DIR)/haproxy/haproxy.cfg
	$(BIN)/pytest -q -p no:xdist tests/unit/test_deploy_files.py \
	  tests/unit/test_compose.py::test_haproxy_starts_with_the_files_config_under_a_low_open_file_limit
	@rendered=$$(mktemp --suffix=.yaml) && trap 'rm -f "$$rendered"' EXIT && \
	  for overlay in $(K8S_OVERLAYS); do \
	    $(BIN)/kubectl kustomize $$overlay > "$$rendered" || exit 1; \
	    for version in $(K8S_VERSIONS); do \
	      echo "kubernetes-validate: $$overlay, Kubernetes $$version"; \
	      $(BIN)/kubernetes-validate --strict --quiet -k $$version "$$rendered" || exit 1; \
	    done; \
	  done
	$(BIN)/python -m tests.support.kubernetes_equivalence $(K8S_OVERLAYS)
	@echo "deploy-check: compose, schema, Dockerfile, HAProxy config and Kubernetes overlays are valid"

test: $(STAMP) system-deps
	$(BIN)/pytest $(TEST_SELECTION) $(PYTEST_ARGS)

# make test, recording how long each file took into the file that orders the next runs.
test-durations: $(STAMP) system-deps
	$(BIN)/pytest $(TEST_SELECTION) --record-file-durations tests/file_durations.json $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

# Long runs: the fault suite's fixed, seeded schedules (docs/faults.md) and the other fault
# and soak tests. FAULT_RUNS=N instead runs N random fault schedules from seed FAULT_SEED
# (default: one drawn at random; each run's seed is in its test id and result).
FAULT_RUNS ?=
FAULT_SEED ?=
test-fault: $(STAMP) system-deps
ifeq ($(strip $(FAULT_RUNS)),)
	$(BIN)/pytest -m "fault or soak" -k "not random_schedule" $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-colocated
else
	FAULT_RUNS=$(FAULT_RUNS) FAULT_SEED=$(FAULT_SEED) \
	  $(BIN)/pytest tests/faults/test_schedules.py -m fault -k random_schedule $(PYTEST_ARGS)
endif

# The conformance suite on co-located nodes, `hexmq cluster up`'s default (make test runs its
# clusters with a process per service; a test that needs one says so): part of make test-fault.
test-colocated: $(STAMP) system-deps
	HEXMQ_TEST_PACKING=colocated $(BIN)/pytest tests/conformance $(TEST_SELECTION) $(PYTEST_ARGS)

# The Eclipse Paho interoperability suite (vendored in tests/third_party/paho_testing), 5.0 and
# 3.1.1, on one node and through a round-robin balancer over three: minutes of its own sleeps.
test-interop: $(STAMP) system-deps
	$(BIN)/pytest -m interop $(PYTEST_ARGS)

# deploy/compose for real: the image built from the Dockerfile and the topology run by Compose
# v2 with the machine's container engine (Docker, or podman from scripts/deploy-deps.sh), with
# stand-in base images made from Debian packages where no registry answers
# (scripts/deploy-images.sh, compose.standin.yaml). Root or sudo for podman. Not in make test
# (docs/deploy.md, "Running it for real": before every release). DEPLOY_RESULTS: a JSON file
# for the figures it measures.
DEPLOY_RESULTS ?=
test-deploy: $(STAMP) system-deps
	scripts/deploy-deps.sh
	HEXMQ_DEPLOY_RESULTS=$(DEPLOY_RESULTS) $(BIN)/pytest -m deploy tests/deploy -s -p no:xdist $(PYTEST_ARGS)

# Throughput and latency beside mosquitto (BENCH_ARGS), the moderate-load suite (fixed rates,
# deliveries per CPU-second, memory per connection; MODERATE_ARGS), then the failover benchmark
# (FAILOVER_ARGS) and the rebalance benchmark (REBALANCE_ARGS), the cost of one stream message
# by transport (TRANSPORT_ARGS), a SUBSCRIBE's retained messages as the store grows
# (RETAINED_ARGS). The first two run each hexmq both as separate processes and co-located
# (hexmq-colo); BENCH_BASELINE=/path/to/checkout/.venv/bin/python adds that checkout's hexmq
# beside them (hexmq-base), a before/after comparison in the same run.
BENCH_BASELINE ?=
BASELINE_ARG = $(if $(BENCH_BASELINE),--baseline $(BENCH_BASELINE))
bench: $(STAMP) system-deps
	$(BIN)/python -m bench $(BASELINE_ARG) $(BENCH_ARGS)
	$(BIN)/python -m bench.moderate $(BASELINE_ARG) $(MODERATE_ARGS)
	$(BIN)/python -m bench.transport $(TRANSPORT_ARGS)
	$(BIN)/python -m bench.failover $(FAILOVER_ARGS)
	$(BIN)/python -m bench.rebalance $(REBALANCE_ARGS)
	$(BIN)/python -m bench.retained $(RETAINED_ARGS)

# A SUBSCRIBE's retained messages with 1,000 ... 1,000,000 stored: the index in process, and a
# real node's partition CPU per SUBSCRIBE (RETAINED_ARGS).
bench-retained: $(STAMP) system-deps
	$(BIN)/python -m bench.retained $(RETAINED_ARGS)

# Hostile and careless clients against a 3-node RF 3 cluster: its memory and another client's
# round trip during each attack (ATTACKS_ARGS; issue 25).
bench-attacks: $(STAMP) system-deps
	$(BIN)/python -m bench.attacks $(ATTACKS_ARGS)

# hexmq at fixed moderate rates beside mosquitto: latency, deliveries per CPU-second, memory.
bench-moderate: $(STAMP) system-deps
	$(BIN)/python -m bench.moderate $(BASELINE_ARG) $(MODERATE_ARGS)

# CPU per stream message and round trip: grpc.aio against the event loop's own floor (TRANSPORT_ARGS).
bench-transport: $(STAMP)
	$(BIN)/python -m bench.transport $(TRANSPORT_ARGS)

# What a node's death costs: ack gap, view change, sessions resumable, RF restored, lost (0).
bench-failover: $(STAMP) system-deps
	$(BIN)/python -m bench.failover $(FAILOVER_ARGS)

# What a join and a leave cost: time to move sessions and queued messages, client throughput.
bench-rebalance: $(STAMP) system-deps
	$(BIN)/python -m bench.rebalance $(REBALANCE_ARGS)

# Edge memory per 1,000 idle connections, beside mosquitto (MEMORY_ARGS).
bench-memory: $(STAMP) system-deps
	$(BIN)/python -m bench.memory $(MEMORY_ARGS)

# A local cluster in the foreground on the embedded defaults, until Ctrl-C.
run: $(STAMP) system-deps
	$(BIN)/hexmq cluster run --nodes $(NODES) --rf $(RF) --dir $(RUN_DIR)

clean:
	rm -rf $(VENV) .hexmq .pytest_cache .mypy_cache .ruff_cache
