# Two commands on a fresh machine: `make demo` and `make test`. Both bootstrap what they need.
SHELL := /bin/bash
PY := .venv/bin/python
export PYSPARK_PYTHON := $(abspath .venv/bin/python)

.PHONY: bootstrap demo demo-s3 demo-cluster ui test torture torture-s3 lint unit bench bench-cluster stream clean

bootstrap:  ## Debian packages if missing, .venv with the package installed (idempotent)
	@bash scripts/bootstrap.sh

demo: bootstrap  ## the zero-configuration demo: stream, materialise, reconcile, summary
	$(PY) -m cdc_platform demo

demo-s3: bootstrap  ## the same demo with the landing zone and the lake on a private SeaweedFS (S3, Iceberg REST catalog)
	$(PY) -m cdc_platform demo --s3

demo-cluster: bootstrap  ## the S3 demo with the lake's Spark work on a private Spark standalone cluster (2 workers)
	$(PY) -m cdc_platform demo --spark-cluster

UI_PORT ?= 3000
ui: bootstrap  ## Dagster UI (dagster dev) on the demo config and its services; Ctrl-C stops all
	$(PY) -m cdc_platform ui --port $(UI_PORT)

test: bootstrap lint  ## unit, integration and the `dagster job execute` run (not the torture)
	$(PY) -m pytest -q -p no:cacheprovider -m "not torture and not torture_s3" cdc_platform_tests

torture: bootstrap  ## acceptance: every type/name/feature cell, kill -9s and a failover, two sources in one config (~10 min)
	$(PY) -m pytest -q -p no:cacheprovider -m torture cdc_platform_tests/torture

torture-s3: bootstrap  ## the torture's kill -9s and failover with landing zone and lake on SeaweedFS
	$(PY) -m pytest -q -p no:cacheprovider -m torture_s3 cdc_platform_tests/torture/test_torture_s3.py

lint: bootstrap
	.venv/bin/ruff check cdc_platform cdc_platform_tests bench

bench: bootstrap  ## performance ratios against bare baselines (printed, not asserted)
	$(PY) -m bench

bench-cluster: bootstrap  ## the lake's Spark work on local[2] vs a standalone cluster of 2 workers (printed)
	$(PY) -m bench --only cluster --no-s3

stream: bootstrap  ## run the capture engine in the foreground on $$CDC_PLATFORM_CONFIG (SOURCE=name picks one of several sources)
	$(PY) -m cdc_platform stream $(if $(SOURCE),--source $(SOURCE))

clean:  ## remove demo state (.cdc/); keeps the virtualenv
	rm -rf .cdc
