# attn-course: two commands on a fresh machine.
#   make book   builds the website (executing every chapter) into _build/html
#   make test   runs every test in one pytest run (the package against PyTorch, every chapter with
#               nbval, the website in a real browser, a chapter on a simulated Colab, the student
#               versions) and, in the same run, every chapter again under nbval on a second numerical
#               path (scalar CPU kernels, one thread; `make test-other-cpu` runs that alone), so that a chapter whose
#               compared outputs hold only on the CPU that executed it fails here, not on a student's
#               machine or in CI. The browser test builds its own copy of the site into _build/site-test
#               from the committed, executed notebooks WITHOUT executing them again
#               (ATTN_COURSE_EXECUTE=off), since nbval already runs every chapter in the same run;
#               `make test-site` runs it against the _build/html that `make book` built instead.
# Both create .venv and install requirements.txt into it the first time (and again when it changes).
# The website serves MathJax and the ipywidgets scripts itself: `make vendor` (run by `make book`)
# fetches them from npm into _vendor/ (falling back to public CDNs, with a message, without npm).
# It also fetches onnxruntime-web (chapter 07's in-browser translator) and axe-core (the browser
# test's accessibility checks). The book build trains chapter 07's translator once and exports it
# to ONNX, cached in _build/translator/ (ATTN_COURSE_TRANSLATOR=off skips it: the panel then says so).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Between parallel regions, OpenMP threads spin before they sleep. Spinning without end makes small
# models crawl when the CPU is shared (20 times slower at a load of 8), never spinning
# (OMP_WAIT_POLICY=PASSIVE) makes them twice as slow on an idle CPU (chapter 07's training: 85 s
# instead of 35 s). A short spin keeps the idle speed and most of the shared-CPU one (measured on
# 2 cores: idle 10 s vs 9 s spinning and 20 s passive; three at once 40 s vs 68 s and 12 s).
# The results are the same bits either way; only the waiting changes.
export GOMP_SPINCOUNT ?= 10000

NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
# Two test files at a time (pytest-xdist, --dist loadfile: each file runs whole on one worker, so each
# chapter still runs top to bottom in one kernel, its cells in order; a worker takes the next file
# when it is nearly done with its own). One file at a time leaves a core idle most of the time
# (one-thread test modules, the site's build, pip in the Colab test, small models that gain little
# from a second thread, and the second pass's one-thread chapters). JOBS=1: one file at a time.
JOBS ?= 2
PARALLEL := $(if $(filter-out 1,$(JOBS)),-n $(JOBS) --dist loadfile)
# With two workers, each chapter's kernel gets one thread: two kernels of two threads each on 2 cores
# made training cells five times slower (chapter 05's 19 s cell took 98 s, chapter 09's took 217 s;
# pass 1 13 min). One thread is how the chapters are executed and recorded; the kernels of the two
# passes still differ (this CPU's SIMD kernels, then the scalar ones). Another thread count:
# `make test-chapters` (one file at a time, PyTorch's default threads).
PASS1_THREADS := $(if $(filter-out 1,$(JOBS)),OMP_NUM_THREADS=1)
# The second numerical path: PyTorch's scalar kernels (every CPU has them; AVX2 and AVX-512 machines
# round differently from them, and from each other) on one thread (another summation order).
OTHER_CPU := ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1

.PHONY: help setup test test-other-cpu test-package test-chapters test-site book vendor student student-check nbgrader clean distclean sync execute test-newest-torch release readme

help:
	@echo "make book    build the website into _build/html (executes every chapter)"
	@echo "make test    run every test: package, chapters (nbval), website in chromium, Colab simulation, student versions,"
	@echo "             and every chapter again on another numerical path (make test-other-cpu alone); two test files at a time"
	@echo "             (JOBS=1: one at a time)"
	@echo "make student write _build/student/ (chapters without solutions) and _build/solutions/ (+ zips) for instructors"
	@echo "make student-check   make student, then run every student notebook top to bottom"
	@echo "make nbgrader        write an nbgrader course into _build/nbgrader (nbgrader_config.py, source/chNN/);"
	@echo "             CHAPTERS=02,03 for some chapters only; NBGRADER_ARGS='--points 2 --assignment week1' (see instructor.md)"
	@echo "make test-site       browser test of the site that \`make book\` built (_build/html)"
	@echo "make test-newest-torch   the package tests and every chapter under nbval with the newest torch on PyPI, in"
	@echo "             .venv-newest (Python 3.12 where there is one; a CUDA build, about 2.6 GB to download; not part of make test)"
	@echo "make vendor  fetch MathJax and the ipywidgets scripts from npm into _vendor/ (make book does it)"
	@echo "make sync    rewrite each chapter's first cell from _config.yml (after changing the repository URL)"
	@echo "make readme  rewrite README.md's chapter table from the chapters' headers (tools/readme_table.py; --check in make test)"
	@echo "make release VERSION=X.Y.Z   set the version, rewrite the first cells, commit and tag vX.Y.Z (RELEASING.md)"
	@echo "make execute CHAPTER=chapters/02_simple_self_attention.ipynb   re-execute one chapter in place, and"
	@echo "             check that its compared outputs are the same on the other numerical path"
	@echo "make clean   remove _build (keeps .venv and _vendor); make distclean removes those too"

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# A torch wheel that pip can already see on this machine (its find-links) saves a large
	@# download; where there is none this step fails quietly and the next one uses the index.
	-$(PY) -m pip install --quiet --no-index --no-deps "torch>=2.2" 2>/dev/null
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

setup: $(STAMP)

# One pytest session runs both numerical paths: tests/make_test_plugin.py collects every chapter a second time
# (chapters/NN_x.ipynb@scalar-kernels, its kernel started with $(OTHER_CPU)) and hands out the files longest
# first (--no-loadscope-reorder keeps that order), so that neither worker waits idle at the end of a pass.
ORDER := -p tests.make_test_plugin --no-loadscope-reorder

test: setup
	$(PASS1_THREADS) $(PY) -m pytest chapters tests $(NBVAL) --nbval-other-cpu $(ORDER) $(PARALLEL) -p no:cacheprovider --durations=12 $(PYTEST_ARGS)

test-other-cpu: setup
	@echo "Every chapter on the scalar CPU kernels with one thread ($(OTHER_CPU)):"
	$(OTHER_CPU) $(PY) -m pytest chapters $(NBVAL) $(ORDER) $(PARALLEL) -p no:cacheprovider $(PYTEST_ARGS)

# Not part of `make test`: a separate .venv-newest with PyPI's newest torch (a CUDA build of about
# 2.6 GB) and the newest of everything else, then the package tests and the chapters under nbval.
# It prints what it installed. tools/newest_torch.py says how it picks Python and lifts a pip cap.
test-newest-torch:
	$(PYTHON) tools/newest_torch.py $(PYTEST_ARGS)

test-package: setup
	$(PY) -m pytest tests -p no:cacheprovider $(PYTEST_ARGS)

test-chapters: setup
	$(PY) -m pytest chapters $(NBVAL) -p no:cacheprovider $(PYTEST_ARGS)

vendor: setup
	@# Exit status 3 means "no registry reachable: the site will use the CDNs"; the build goes on.
	$(PY) tools/vendor_assets.py || test $$? -eq 3

book: vendor
	$(VENV)/bin/jupyter-book build . -W --keep-going
	@echo "The website is in _build/html (open _build/html/index.html, or serve it: python -m http.server -d _build/html)."

test-site: setup
	ATTN_COURSE_SITE=_build/html ATTN_COURSE_SCREENSHOTS=full $(PY) -m pytest tests/test_site.py -p no:cacheprovider $(PYTEST_ARGS)

# `make student` and `make nbgrader` need Python 3.9+ and nothing else (no .venv, no torch, no
# Jupyter): tools/make_student.py reads and writes the notebooks as JSON. Only running notebooks
# (`make student-check`, `--grade`) needs the course's environment.
CHAPTERS ?=
NBGRADER_ARGS ?=
student:
	$(PYTHON) tools/make_student.py $(if $(CHAPTERS),--chapters $(CHAPTERS))

nbgrader:
	$(PYTHON) tools/make_student.py --nbgrader $(if $(CHAPTERS),--chapters $(CHAPTERS)) $(NBGRADER_ARGS)

student-check: setup
	$(PY) tools/make_student.py --check

sync: setup
	$(PY) tools/sync_setup_cells.py

# Plain python3, like `make student`: the table is made from the notebooks' JSON.
readme:
	$(PYTHON) tools/readme_table.py

release: setup
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=X.Y.Z (see RELEASING.md)"; exit 2; }
	$(PY) tools/release.py $(VERSION)

execute: setup
	$(PY) tools/execute.py $(CHAPTER)

clean:
	rm -rf _build

distclean: clean
	rm -rf _vendor $(VENV)
