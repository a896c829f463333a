# tokwatch developer targets. `make test` is the README's test command and what .ci/run calls.
PYTHON ?= python3

.PHONY: install demo test test-deps test-quick test-pythons lint dashboards bench

install:
	$(PYTHON) -m pip install -e .

demo: install
	tokwatch demo

test-deps:
	bash scripts/install-test-deps.sh

# Both lanes run on pytest-xdist, `auto` meaning one worker more than the cores (tests/conftest.py: the suite
# mostly waits); a group of tests that shares one server runs in one worker.
# README ("Tests") says what each lane runs and how long it takes.
TEST_WORKERS ?= auto
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadgroup
QUICK_LANE = -m "not slow and not e2e and not llamacpp and not timescale and not grafana_schema"

test: test-deps
	$(PYTHON) -m pytest -q $(PYTEST_PARALLEL)

test-quick:
	$(PYTHON) -m pytest -q $(PYTEST_PARALLEL) $(QUICK_LANE)

# The quick lane on the other Python versions pyproject.toml supports, each in its own venv under .venvs/.
test-pythons:
	bash scripts/test-pythons.sh 3.12 3.13

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
