# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Both create (once) and reuse .venv in the repo root.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed-stamp
TAPS := $(VENV)/bin/taps
PROMPT ?= Write a Python function that checks whether a number is prime.

.PHONY: demo test clean-venv

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(TAPS) models fetch smollm2-135m
	@echo "== plain autoregressive decoding (bfloat16, greedy) =="
	$(TAPS) generate --target smollm2-135m --method ar --max-new-tokens 96 --prompt "$(PROMPT)"
	@echo "== chain of 15 drafted tokens, oracle test drafter (accepts everything) =="
	$(TAPS) generate --target smollm2-135m --method chain --drafter oracle --max-new-tokens 96 --prompt "$(PROMPT)"
	@echo "== DDTree of 16 nodes, noisy test drafter (partly accepted) =="
	$(TAPS) generate --target smollm2-135m --method ddtree --drafter noisy --budget 16 --max-new-tokens 96 --prompt "$(PROMPT)"

test: $(STAMP)
	$(VENV)/bin/pytest -q

clean-venv:
	rm -rf $(VENV)
