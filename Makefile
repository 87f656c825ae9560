# The two quick-start commands (see README). Both run scripts/setup.sh first; it is idempotent.
SIM_INVENTORY ?= inventory.sim.yaml
VENV_BIN := .venv/bin

.PHONY: setup demo test unit

setup:
	./scripts/setup.sh

demo: setup
	$(VENV_BIN)/sparkdeploy sim up --nodes 2
	$(VENV_BIN)/sparkdeploy up --nodes 2 --inventory $(SIM_INVENTORY)
	$(VENV_BIN)/sparkdeploy health --inventory $(SIM_INVENTORY)

test: setup
	$(VENV_BIN)/python -m pytest -n 2 --dist loadscope

unit:
	$(VENV_BIN)/python -m pytest -n 2 -m "not cluster and not engine and not slow"
