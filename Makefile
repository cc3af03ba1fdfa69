# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The demo's default input: the real MIMIC-III demo beside this checkout (synthetic data without it).
MIMIC_DIR ?= ../shared/mimic-iii-demo
DEMO_OUT  ?= out/demo
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` / `make test-quick` (0: one process, no xdist). loadscope keeps
# a module's tests on one worker, so its module fixtures (servers, exports, job runs) are built once.
PYTEST_WORKERS ?= 2
PYTEST_XDIST := -n $(PYTEST_WORKERS) $(if $(filter 0,$(PYTEST_WORKERS)),,--dist loadscope)

.PHONY: install demo test test-quick bench fuzz notebook clean gpu-install gpu-train

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-test.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt -r requirements-test.txt -c constraints.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

# The whole path: bag -> train -> evaluate -> serve one patient, on the MIMIC-III release in
# MIMIC_DIR, or on a small synthetic release when there is none (it says so). Each step prints
# the command that does it by hand. Re-running resumes training from its last checkpoint.
demo: install
	$(BIN)/python scripts/demo.py --mimic-dir $(MIMIC_DIR) --out $(DEMO_OUT)

# pytest exits 5 when it collects nothing; that must fail CI, so say it plainly.
test: install
	@$(BIN)/python -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; fi; exit $$rc

# The edit-test loop: everything but the tests marked slow (server processes, full training runs,
# the notebook); `make test` and CI run them all.
test-quick: install
	@$(BIN)/python -m pytest -m "not slow" $(PYTEST_XDIST) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; fi; exit $$rc

# schemathesis with all checks against a real ehr-serve (a fixture export) on 127.0.0.1.
fuzz: install
	PYTHONPATH=. $(BIN)/python tests/serving/fuzz_api.py

# examples/quickstart.ipynb run top to bottom on the current code and stored with its outputs (tables,
# plots), so a code host shows them; working files in out/quickstart. Several minutes on 2 cores.
notebook: install
	$(BIN)/python scripts/run_notebook.py

# A GPU machine: the CUDA build of the same TensorFlow version (pyproject extra `gpu`), then the
# Table-7 rank-1 run on the medium synthetic release, reporting steps/s and the test metrics.
gpu-install: install
	$(BIN)/python -m pip install -q -c constraints.txt "tensorflow[and-cuda]==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("tensorflow"))')"

gpu-train: gpu-install
	$(BIN)/python bench/train_speed/gpu_train.py --out runs/gpu_table7

# Each script prints a table and rewrites its own section of docs/benchmarks.md.
bench: install
	$(BIN)/python bench/data_jobs/csv_reader.py
	$(BIN)/python bench/data_jobs/pipeline.py
	$(BIN)/python bench/train_speed/train_step.py
	$(BIN)/python bench/service/service_latency.py

clean:
	rm -rf $(VENV) out .pytest_cache
