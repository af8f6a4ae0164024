# The README's commands. Each does the whole set-up on a fresh machine and is
# quick the second time (stamp files record what is done).
SHELL := /bin/bash
PY := .venv/bin/python
PIP := .venv/bin/pip
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SWORD_PKGS := sword-text-sparv sword-text-kjv sword-text-web
ARGS ?=

.PHONY: install system python test test-slow reproduce corpus lint clean

install: system python

# Debian SWORD modules (public-domain Bibles). Skipped with a clear message where
# apt is missing; set SWORD_PATH to a folder holding mods.d/ and modules/ instead.
system: .stamp-system
.stamp-system:
	@if command -v apt-get >/dev/null 2>&1; then \
	  if ! dpkg -s $(SWORD_PKGS) >/dev/null 2>&1; then \
	    $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $(SWORD_PKGS); \
	  fi; \
	else \
	  echo "apt-get not found: install the SWORD modules spaRV1909eb, engKJV2006eb and engWEB2015eb"; \
	  echo "(e.g. from https://crosswire.org/sword/modules/) and export SWORD_PATH=<folder with mods.d/>"; \
	fi
	@touch $@

python: .stamp-python
.stamp-python: pyproject.toml
	@[ -x $(PY) ] || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	# the local CPU wheel first: a bare `torch` requirement pulls a CUDA build of several GB
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	@touch $@

test: install
	$(PY) -m pytest $(ARGS)

test-slow: install
	$(PY) -m pytest -m slow $(ARGS)

corpus: install
	.venv/bin/seq2seq-data $(ARGS)

reproduce: install
	.venv/bin/seq2seq-data $(ARGS)

lint: install
	.venv/bin/ruff check seq2seq tests scripts

clean:
	rm -rf .stamp-* .venv
