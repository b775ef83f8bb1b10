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

BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell echo '$(TORCH_SPEC) $(EXTRAS)' | cksum | cut -d' ' -f1)

.PHONY: demo test install bench docs-figures clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(if $(TORCH_SPEC),"$(TORCH_SPEC)")
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[$(EXTRAS)]"
	rm -f $(VENV)/.installed-* && touch $@

demo: $(STAMP)
	$(BIN)/critic-pretrain rollouts check builtin:sample
	$(BIN)/critic-pretrain demo

test: $(STAMP)
	$(BIN)/ruff check critic_pretrain rollouts tests bench examples docs
	TORCH_SPEC="$(TORCH_SPEC)" $(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/targets.py
	$(BIN)/python bench/reader_memory.py

# The demo's numbers and plots in docs/warm.md, from a fresh demo run (a few minutes on 2 cores).
docs-figures: $(STAMP)
	$(BIN)/python docs/make_figures.py --retrain

clean:
	rm -rf $(VENV) runs .pytest_cache
