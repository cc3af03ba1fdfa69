# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The demo's default input: the real MIMIC-III demo beside this checkout.
MIMIC_DIR ?= ../shared/mimic-iii-demo
DEMO_OUT  ?= out/demo
PYTEST_ARGS ?=

.PHONY: install demo test bench clean

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt -c constraints.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

demo: install
	$(BIN)/ehr-pipeline demo --mimic-dir $(MIMIC_DIR) --out $(DEMO_OUT)

# pytest exits 5 when it collects nothing; that must fail CI, so say it plainly.
test: install
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; fi; exit $$rc

bench: install
	$(BIN)/python bench/reader.py

clean:
	rm -rf $(VENV) out .pytest_cache
