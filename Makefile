# attn-course: two commands on a fresh machine.
#   make book   builds the website (executing every chapter) into _build/html
#   make test   runs every test: the package against PyTorch, then every chapter with nbval
# Both create .venv and install requirements.txt into it the first time (and again when it changes).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help setup test test-package test-chapters book student clean sync execute

help:
	@echo "make book    build the website into _build/html (executes every chapter)"
	@echo "make test    run the package tests and every chapter under nbval"
	@echo "make sync    rewrite each chapter's first cell from _config.yml (after changing the repository URL)"
	@echo "make execute CHAPTER=chapters/02_simple_self_attention.ipynb   re-execute one chapter in place"
	@echo "make clean   remove _build (keeps .venv)"

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# A torch wheel that pip can already see on this machine (its find-links) saves a large
	@# download; where there is none this step fails quietly and the next one uses the index.
	-$(PY) -m pip install --quiet --no-index --no-deps "torch>=2.2" 2>/dev/null
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

setup: $(STAMP)

test: setup
	$(PY) -m pytest tests chapters --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
		-p no:cacheprovider --durations=12 $(PYTEST_ARGS)

test-package: setup
	$(PY) -m pytest tests -p no:cacheprovider $(PYTEST_ARGS)

test-chapters: setup
	$(PY) -m pytest chapters --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider $(PYTEST_ARGS)

book: setup
	$(VENV)/bin/jupyter-book build . -W --keep-going
	@echo "The website is in _build/html (open _build/html/index.html)."

sync: setup
	$(PY) tools/sync_setup_cells.py

execute: setup
	$(PY) tools/execute.py $(CHAPTER)

clean:
	rm -rf _build
