# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Both create (once) and reuse .venv in the repo root.
# `make test` is the fast set (a few minutes on 2 cores); `make test-slow` the real-model and long
# statistical checks marked `slow` (CI runs both).
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed-stamp
TAPS := $(VENV)/bin/taps
PROMPT ?= Write a Python function that checks whether a number is prime.

.PHONY: demo test test-slow clean-venv install-check install-vllm test-vllm install-torchao

$(STAMP): pyproject.toml constraints.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(TAPS) models fetch smollm2-135m
	@echo "== measure this machine's verification latency (cost-aware tree sizes use it) =="
	$(TAPS) profile --target smollm2-135m --sizes 0,1,3,7,11,15 --contexts 256 --repeats 3
	@echo "== one answer with the shipped drafter (SmolLM2 grown from itself; chain of 7) =="
	$(TAPS) generate --target smollm2-135m --method chain --max-new-tokens 64 --prompt "$(PROMPT)"
	@echo "== quick benchmark: 3 HumanEval prompts, 64 tokens, greedy, this CPU's default dtype (rerun: reuses runs/demo.jsonl) =="
	$(TAPS) bench --target smollm2-135m --methods ar,chain,ddtree,taps --budgets 7 --datasets humaneval \
		--limit 3 --max-new-tokens 64 --out runs/demo.jsonl

test: $(STAMP)
	$(VENV)/bin/pytest -q

# pytest exits 5 when it collects no test: no slow test is not a failure
test-slow: $(STAMP)
	$(VENV)/bin/pytest -q -m slow || test $$? -eq 5

clean-venv:
	rm -rf $(VENV)

# Issue 19: a fresh venv with another transformers release of the declared range (default 5.22.2),
# then taps without constraints.txt: it must keep that release, pass `pip check` and decode exactly.
install-check:
	scripts/check_install.sh $(TRANSFORMERS)

# Issue 25: torchao with its CPU kernels, built from source into .venv: --target-quant w4a8 on AMX where taps.vnni
# cannot run (docs/commands.md). TORCHAO= another source: a local checkout or a wheel built before.
install-torchao: $(STAMP)
	scripts/install_torchao.sh $(VENV) $(TORCHAO)

# Issue 24: vLLM's CPU build in a venv of its own (.venv-vllm; it pins torch and transformers to its
# releases), with taps installed editable beside it; then the tests of taps inside vLLM (docs/vllm.md).
VLLM_VENV ?= .venv-vllm
install-vllm:
	scripts/install_vllm.sh $(VLLM_VENV)

# -m 'not slow' lifts pyproject's default 'not vllm'
test-vllm:
	$(VLLM_VENV)/bin/pytest -q -m 'not slow' tests/test_vllm.py tests/test_vllm_proposer.py tests/test_vllm_serve.py \
		tests/test_vllm_dflash.py tests/test_vllm_gendata.py
