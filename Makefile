# tokwatch developer targets. `make test` is the README's test command and what .ci/run calls.
PYTHON ?= python3

.PHONY: install demo test test-deps test-quick lint dashboards bench

install:
	$(PYTHON) -m pip install -e .

demo: install
	tokwatch demo

test-deps:
	bash scripts/install-test-deps.sh

test: test-deps
	$(PYTHON) -m pytest -q

test-quick:
	$(PYTHON) -m pytest -q -m "not llamacpp and not e2e and not timescale"

lint:
	ruff check exporter tests dashboards benchmarks scripts deploy
	mypy

dashboards:
	$(PYTHON) dashboards/generate.py
	$(PYTHON) deploy/kubernetes/generate.py  # the dashboards ConfigMap follows the JSON

bench:
	$(PYTHON) benchmarks/measurement_error.py
	$(PYTHON) benchmarks/bench_fidelity.py
	$(PYTHON) benchmarks/store.py
	$(PYTHON) benchmarks/request_path.py
