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
# a C compiler: decoding and training build their fused kernels with it on first use (seq2seq/native)
NATIVE_PKGS := gcc
ARGS ?=

.PHONY: install system python test test-slow reproduce corpus lint clean joeynmt-env onmt-env \
	gpu-bundle

install: system python

# Debian SWORD modules (public-domain Bibles), the Apertium rule-based baseline (the
# reference row of `make reproduce`), Chromium with chromium-driver (the browser test
# of seq2seq-serve) and gcc (decoding's C kernels). Skipped with a clear message where
# apt is missing; set SWORD_PATH to a folder holding mods.d/ and modules/ instead, and
# the report then skips the Apertium row, the tests skip the browser test, and decoding
# runs without its C kernels unless a C compiler is on PATH.
system: .stamp-system
.stamp-system: Makefile
	@if command -v apt-get >/dev/null 2>&1; then \
	  if ! dpkg -s $(SWORD_PKGS) $(APERTIUM_PKGS) $(BROWSER_PKGS) $(NATIVE_PKGS) >/dev/null 2>&1; then \
	    $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $(SWORD_PKGS) && \
	    { $(SUDO) apt-get install -y -qq $(APERTIUM_PKGS) || \
	      echo "could not install $(APERTIUM_PKGS): the reproduction report skips the Apertium row"; } && \
	    { $(SUDO) apt-get install -y -qq $(BROWSER_PKGS) || \
	      echo "could not install $(BROWSER_PKGS): the browser test of seq2seq-serve is skipped"; } && \
	    { $(SUDO) apt-get install -y -qq $(NATIVE_PKGS) || \
	      echo "could not install $(NATIVE_PKGS): decoding uses torch ops instead of its C kernels"; }; \
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

# OpenNMT-py 3.5.1 for scripts/benchmark.py --onmt-arms, in its own environment. Its metadata
# pins torch<2.3 (a CUDA build from PyPI), so it goes in with --no-deps beside the CPU torch
# 2.13.0, followed by what onmt_train/onmt_translate import: onmt.transforms imports every
# transform module at start-up (spacy, pyahocorasick, fasttext, regex, rapidfuzz), the
# vocabularies are pyonmttok's. Left out: ctranslate2 (optional import), tensorboard (only
# with -tensorboard), flask and waitress (onmt_server). Checkpoints need
# TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 with torch >= 2.6: scripts/bench_onmt.py sets it.
onmt-env: .venv-onmt/.installed
.venv-onmt/.installed:
	python3 -m venv .venv-onmt
	.venv-onmt/bin/pip install -q torch==2.13.0
	.venv-onmt/bin/pip install -q --no-deps OpenNMT-py==3.5.1
	.venv-onmt/bin/pip install -q configargparse==1.9.0 pyonmttok==1.38.1 PyYAML==6.0.4 \
	  sacrebleu==2.6.0 rapidfuzz==3.14.6 pyahocorasick==2.3.1 regex==2026.11.19 numpy==2.4.6 \
	  spacy==3.8.18 fasttext-wheel==0.9.2
	.venv-onmt/bin/python -W ignore -c "import torch, onmt.bin.train, onmt.bin.translate; \
	  assert torch.version.cuda is None, 'a CUDA build of torch came in'"
	@touch $@

# What scripts/gpu_check.sh needs on a GPU machine whose image has torch with CUDA (and numpy,
# pyarrow, sentencepiece, sacrebleu, tensorboard, ...) but reaches no package index: the wheels
# of the rest, for its Python 3.12, in .gpu/whl. The corpus travels as data/bible_es_en
# (make corpus first). antlr4-python3-runtime 4.9.3 exists only as a source archive, so its
# (pure-Python) wheel is built here.
GPU_PY := 3.12
GPU_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64
GPU_WHEELS := hydra-core==1.3.8 omegaconf==2.3.1 datasets==5.2.0 dill==0.4.1 \
  multiprocess==0.70.19 fsspec==2026.9.0 joeynmt==2.3.0 subword-nmt==0.3.8 mock==5.2.0 \
  importlib_metadata==10.2.0 lazy-importer==0.1.0
gpu-bundle: .gpu/.bundled
.gpu/.bundled: Makefile | python
	rm -rf .gpu/whl && mkdir -p .gpu/whl
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_PY) \
	  --implementation cp $(GPU_PLATFORMS) -d .gpu/whl $(GPU_WHEELS)
	$(PY) -m pip wheel -q --no-deps -w .gpu/whl antlr4-python3-runtime==4.9.3
	@du -sh .gpu/whl
	@touch $@
