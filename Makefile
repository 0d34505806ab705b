# The two setup commands (see README):
#   make demo  - a virtual environment with the core only, then the example pipeline on the in_memory default
#   make test  - everything (Ray and Monarch included), then the whole test matrix
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
# torch 2.13.0 is the one version served here as a local CPU build; it must be installed before torchmonarch.
TORCH := torch==2.13.0

.PHONY: demo test install-core install-all system-packages lint docs bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

install-core: $(PY)
	$(PIP) -e lib/fray numpy

install-all: $(PY)
	$(PIP) $(TORCH)
	$(PIP) -e 'lib/fray[test,progress,docs]' -e backends/ray -e backends/monarch ruff mypy

demo: install-core
	$(PY) examples/pipeline.py

# The multi-host tests run real sshd and Slurm daemons in network namespaces (iproute2, util-linux), and the live
# page's browser test drives Debian's Chromium (Playwright never downloads a browser); as root with apt-get, what
# is missing is installed. Elsewhere those tests skip, naming what they lack.
SYSTEM_PACKAGES := iproute2 util-linux openssh-server openssh-client slurm-wlm munge chromium chromium-driver

system-packages:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	  if [ -n "$$missing" ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  fi; \
	else echo "make: not root or no apt-get: tests needing $(SYSTEM_PACKAGES) will skip, naming why"; fi

# The lint gate runs first: ruff (rules and format) and mypy --strict (pyproject.toml) on all three distributions.
test: lint system-packages
	$(PY) tests/run_parallel.py

lint: install-all
	$(VENV)/bin/ruff check lib backends tests examples benchmarks
	$(VENV)/bin/ruff format --check lib backends tests examples benchmarks
	$(VENV)/bin/mypy lib/fray/src backends/ray/src backends/monarch/src

# The user documentation and the API reference (from docstrings); warnings are errors.
docs: install-all
	$(PY) -m mkdocs build --strict

bench: install-all
	$(PY) benchmarks/bench_in_memory.py
	$(PY) benchmarks/bench_ray.py
	$(PY) benchmarks/bench_monarch.py
	$(PY) benchmarks/bench_groups.py

clean:
	rm -rf $(VENV)
