# The commands of the README: `make demo` (main job: the app), `make test` (the fast tier) and `make test-all`
# (the fast tier and the integration tier; .ci/run runs it).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
SHAPES := datasets/shapes/dataset_shapes.json

.PHONY: demo test test-all test-integration bench dataset venv clean browser-deps wheel

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@touch $@

$(SHAPES): | venv
	$(PY) -m captioner.scenes.shapes --out datasets/shapes

dataset: $(SHAPES)

# The main job: the web app with the bundled checkpoints on http://127.0.0.1:7860 (no download, telemetry off).
demo: venv $(SHAPES)
	$(PY) app.py --host 127.0.0.1 --port 7860

# Two tiers of tests (pytest.ini says which marker is which). -rs: every skipped test says why (the browser test
# without chromium, for one).
# test: the fast tier, pytest.ini's default selection (not integration, not slow): under 3 minutes on 2 cores.
# test-all: both tiers in one pytest run. test-integration: the integration tier alone.
INTEGRATION := integration or slow

test: venv
	$(PY) -m pytest -q -rs

test-all: venv
	$(PY) -m pytest -q -rs -m "$(INTEGRATION) or not ($(INTEGRATION))"

test-integration: venv
	$(PY) -m pytest -q -rs -m "$(INTEGRATION)"

bench: venv $(SHAPES)
	$(PY) -m bench.run_all

clean:
	rm -rf $(VENV) .pytest_cache build dist captioner.egg-info

# The installable package (pyproject.toml) as dist/captioner-*.whl, built offline with the locked setuptools.
wheel: venv
	$(PY) -m pip wheel --no-deps --no-build-isolation --wheel-dir dist .

# Debian's chromium for tests/test_browser.py (playwright drives it; never `playwright install`). Tests never
# install it themselves: without it the browser test is skipped and says so. .ci/run calls this first.
browser-deps:
	@test -x /usr/bin/chromium || (apt-get update && apt-get install -y chromium)
