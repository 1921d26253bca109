# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build installs from local files here in about a minute; an unpinned torch pulls a multi-GB
# CUDA build. GPU users: `make TORCH_SPEC=torch install` (pyproject keeps a range, not a pin).
TORCH_SPEC ?= torch==2.13.0

.PHONY: install install-dev demo test quick checks test-gpu gpu-kit gpu-check soak lint typecheck layers unit bench clean protos

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(PY)
	@echo "installing $(TORCH_SPEC) and spotmorph's dependencies into $(VENV) (about a minute, once)"
	$(PY) -m pip install -q "$(TORCH_SPEC)" numpy
	$(PY) -m pip install -q -e .
	touch $@

# One resolver run for torch, spotmorph and the tools (CI starts here: two runs cost it about 20 s more).
$(VENV)/.installed-dev: pyproject.toml | $(PY)
	@echo "installing $(TORCH_SPEC), spotmorph and the test and lint tools into $(VENV) (a minute or two, once)"
	$(PY) -m pip install -q "$(TORCH_SPEC)" numpy -e '.[dev]'
	touch $(VENV)/.installed
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& echo "installing Debian's chromium for the dashboard's browser tests (seconds)" \
		&& DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q -o Acquire::http::Timeout=30 --no-install-recommends chromium >/dev/null; } \
		|| echo "no chromium (not root, or no apt): the dashboard's browser tests will skip"
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] \
		&& command -v apt-get >/dev/null && echo "installing Debian's postgresql for the PostgreSQL store's tests (a minute)" \
		&& DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q -o Acquire::http::Timeout=30 --no-install-recommends postgresql >/dev/null; } \
		|| echo "no PostgreSQL (not root, or no apt): the PostgreSQL tests will skip"
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: install
	$(VENV)/bin/spotmorph demo

lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install-dev
	$(VENV)/bin/mypy

layers: install-dev
	$(VENV)/bin/lint-imports

# Two workers; tests that share a session fixture run on one of them (tests/conftest.py). The project's bytecode
# is compiled once first: with PYTHONDONTWRITEBYTECODE (CI sets it) every agent, trainer and CLI process the
# suite starts would otherwise compile the modules it imports again (0.3 CPU-s a process for the daemons alone).
unit: install-dev
	$(PY) -m compileall -q -j 2 controller worker_agent morphing scheduler spotmorph protos bench tests >/dev/null
	$(VENV)/bin/pytest -q -n 2 --dist loadgroup tests

# The static checks run beside the tests, one after another on one job slot, so their minute and a half (mypy,
# lint-imports: one core each) overlaps the suite's quarter hour instead of adding to it. Their few lines may
# land between the suite's progress dots; either failing fails `make test`, once both have ended.
test: install-dev
	$(MAKE) --no-print-directory -j 2 unit checks

checks: lint typecheck layers

# The quick loop while editing: every test not marked slow (pure cores, property tests; about a minute).
quick: install-dev
	$(VENV)/bin/pytest -q -n 2 -m "not slow" tests

# Only the tests marked `gpu`: on a machine with CUDA (install the CUDA build: make TORCH_SPEC=torch ...).
test-gpu: install-dev
	$(VENV)/bin/pytest -q -m gpu -rs tests

# The GPU check's wheels for a bare GPU machine without registries (Python 3.12, x86-64; bench/gpu-kit.txt),
# then on that machine: bench/gpu_check.sh OUT_DIR (or make gpu-check), which installs them offline.
gpu-kit: install
	rm -rf .whl && $(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux2014_x86_64 -d .whl -r bench/gpu-kit.txt

gpu-check:
	bench/gpu_check.sh gpu-check

# The long variants (marked `soak`), which the default run skips.
soak: install-dev
	$(VENV)/bin/pytest -q -m soak -rs tests

bench: install-dev
	$(PY) bench/run_all.py

# Regenerate the gRPC stubs next to protos/spotmorph/v1/*.proto; tests fail when they drift.
protos: install-dev
	$(PY) -m protos.generate

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
