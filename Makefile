# The README's commands. Each does the whole set-up on a fresh machine and is
# quick the second time (stamp files record what is done).
SHELL := /bin/bash
PY := .venv/bin/python
PIP := .venv/bin/pip
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SWORD_PKGS := sword-text-sparv sword-text-kjv sword-text-web
APERTIUM_PKGS := apertium apertium-eng-spa
# headless Chromium and its WebDriver for the browser test of seq2seq-serve's page
BROWSER_PKGS := chromium chromium-driver
ARGS ?=

.PHONY: install system python test test-slow reproduce corpus lint clean joeynmt-env

install: system python

# Debian SWORD modules (public-domain Bibles), the Apertium rule-based baseline (the
# reference row of `make reproduce`) and Chromium with chromium-driver (the browser test
# of seq2seq-serve). Skipped with a clear message where apt is missing; set SWORD_PATH to
# a folder holding mods.d/ and modules/ instead, and the report then skips the Apertium
# row and the tests skip the browser test.
system: .stamp-system
.stamp-system: Makefile
	@if command -v apt-get >/dev/null 2>&1; then \
	  if ! dpkg -s $(SWORD_PKGS) $(APERTIUM_PKGS) $(BROWSER_PKGS) >/dev/null 2>&1; then \
	    $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $(SWORD_PKGS) && \
	    { $(SUDO) apt-get install -y -qq $(APERTIUM_PKGS) || \
	      echo "could not install $(APERTIUM_PKGS): the reproduction report skips the Apertium row"; } && \
	    { $(SUDO) apt-get install -y -qq $(BROWSER_PKGS) || \
	      echo "could not install $(BROWSER_PKGS): the browser test of seq2seq-serve is skipped"; }; \
	  fi; \
	else \
	  echo "apt-get not found: install the SWORD modules spaRV1909eb, engKJV2006eb and engWEB2015eb"; \
	  echo "(e.g. from https://crosswire.org/sword/modules/) and export SWORD_PATH=<folder with mods.d/>"; \
	  echo "and, for the Apertium row of the report, apertium with its spa-eng pair (https://apertium.org)"; \
	  echo "and, for the browser test of seq2seq-serve, Chromium with its chromedriver on PATH"; \
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

# The README's main job: corpus, three arms, evaluation, report.md (see configs/reproduce.yaml).
reproduce: install
	.venv/bin/seq2seq-reproduce $(ARGS)

lint: install
	.venv/bin/ruff check seq2seq tests scripts

clean:
	rm -rf .stamp-* .venv

# JoeyNMT 2.3.0 for scripts/benchmark.py, in its own environment: never a dependency of
# seq2seq. sentencepiece 0.2.1 and importlib_metadata are what it needs to run with torch 2.13.
joeynmt-env: .venv-joey/.installed
.venv-joey/.installed:
	python3 -m venv .venv-joey
	.venv-joey/bin/pip install -q torch==2.13.0 joeynmt==2.3.0 sentencepiece==0.2.1 importlib_metadata
	@touch $@
