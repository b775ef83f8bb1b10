# Two entry points: `make demo` and `make test`. Each bootstraps .venv from this repo's own
# files (pyproject.toml) on a fresh machine; nothing needs installing by hand.
#
# TORCH_SPEC picks the torch build installed before the project. The default is the CPU
# build this project's CI uses (pip takes it from local disk in seconds). GPU users either
# install into an environment that already has CUDA torch (`pip install -e .`, torch is
# unpinned there) or run e.g. `make TORCH_SPEC='torch==2.11.0' test`; TORCH_SPEC= (empty)
# leaves torch to the resolver.

PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS     ?= test
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (logical: one per CPU thread; 0: one process). --dist loadfile keeps a
# file's tests in one worker, so module fixtures (test_install's bare venv) are built once; each worker
# runs one torch thread per core it gets (tests/conftest.py). On 2 cores: 7.2 minutes, against 12.6 in
# one process (docs/LOG.md, session twenty).
TEST_WORKERS ?= logical
# 1: the report's values page must be checked in a headless browser (the test fails without one);
# 0: that test is skipped where chromium is absent (`make REQUIRE_BROWSER=0 test`).
REQUIRE_BROWSER ?= 1

BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell echo '$(TORCH_SPEC) $(EXTRAS)' | cksum | cut -d' ' -f1)

.PHONY: demo test install browser bench docs-figures clean

install: $(STAMP)

# With the test extra, LLaMA-Factory's wheel too: tests load ROLL exports with its own value-head
# loader. It pins transformers<=5.6 and trl<=0.24 (this project runs transformers 5.24 and TRL
# 1.12), so it is installed without its dependencies and only that loader is used (docs/install.md).
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(if $(TORCH_SPEC),"$(TORCH_SPEC)")
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[$(EXTRAS)]"
	$(if $(findstring test,$(EXTRAS)),$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps \
	  "llamafactory==0.9.5")
	rm -f $(VENV)/.installed-* && touch $@

demo: $(STAMP)
	$(BIN)/critic-pretrain rollouts check builtin:sample
	$(BIN)/critic-pretrain demo

test: $(STAMP) browser
	$(BIN)/ruff check critic_pretrain rollouts tests bench examples docs
	TORCH_SPEC="$(TORCH_SPEC)" CRITIC_PRETRAIN_REQUIRE_BROWSER=$(REQUIRE_BROWSER) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Debian's chromium for tests/test_values_page.py (the report's values.html in a headless browser),
# installed with apt-get when absent: as root, else through `sudo -n` (never a password prompt). A
# failed install does not stop `make test`: the browser test then fails and says why (or is skipped
# with REQUIRE_BROWSER=0).
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif [ "$(REQUIRE_BROWSER)" = 0 ]; then echo "browser: no chromium, its test will be skipped"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	  echo "browser: no chromium and no apt-get: install chromium, or run make REQUIRE_BROWSER=0 test" >&2; \
	else \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo -n); echo "browser: installing Debian's chromium with apt-get"; \
	  $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends chromium fonts-dejavu-core >/dev/null \
	  || echo "browser: apt-get could not install chromium" >&2; \
	fi

bench: $(STAMP)
	$(BIN)/python bench/targets.py
	$(BIN)/python bench/reader_memory.py

# The demo's numbers and plots in docs/warm.md, from a fresh demo run (a few minutes on 2 cores).
docs-figures: $(STAMP)
	$(BIN)/python docs/make_figures.py --retrain

clean:
	rm -rf $(VENV) runs .pytest_cache
