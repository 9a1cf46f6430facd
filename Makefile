# Everything a fresh machine needs: `make demo` and `make test`. Nothing global is installed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The runtime install (what `demo` and `try` run), then the [test] extra on top of it
# (pytest, hypothesis, mypy, ruff, playwright: what only `make test` and its tiers need).
RUN_STAMP := $(VENV)/.runtime-stamp
STAMP     := $(VENV)/.installed-stamp

.PHONY: demo try test unit integration e2e lint typecheck bench soak venv clean test-packages \
	test-py313 test-eventsourcing mutation

# Debian packages the real-server tests need; installed by `make test` when run as root
# (CI is), and only those missing. Without them (not root) those tests skip, except under
# CI=true, where nothing may skip. postgresql-15: when nothing answers at
# SENDLEDGER_TEST_PG_URL the test session starts a private cluster from its binaries
# (tests/conftest.py); its own service is kept from starting. systemd: `systemd-analyze
# verify` on the shipped unit and on the one `sendledger init` writes. curl: the line
# `sendledger try` prints is run as printed (tests/e2e/test_try.py).
# locales: the de_DE.UTF-8 locale the script makes, for a private server speaking German
# (tests/integration/test_pg_refusals.py).
TEST_PACKAGES := chromium fonts-liberation postfix dovecot-imapd dovecot-lmtpd postgresql-15 \
	systemd curl locales

# Bytecode caches are written, as an installed package has them: where the environment
# turns them off (PYTHONDONTWRITEBYTECODE, as this project's CI machines do), every process a
# test starts compiled our sources again (a CLI-heavy e2e file spent 29% more CPU).
unexport PYTHONDONTWRITEBYTECODE

# Packages are installed by uv (put in the venv by pip): the same versions pip resolves, but
# on a clean machine the runtime and test install took pip 90 s of CPU and uv 10 s (pip's
# resolver, then unpacking and compiling every module one at a time). UV_NATIVE_TLS: the
# system's certificates, as pip uses them (a machine may sit behind a TLS-inspecting proxy).
export UV_NATIVE_TLS := 1
UV := $(BIN)/uv pip install --quiet --python $(BIN)/python

$(BIN)/uv:
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check 'uv>=0.5'

$(RUN_STAMP): pyproject.toml | $(BIN)/uv
	$(UV) -e .
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml $(RUN_STAMP)
	$(UV) -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(RUN_STAMP)
	$(BIN)/sendledger demo

try: $(RUN_STAMP)
	$(BIN)/sendledger try

test-packages:
	@if [ -n "$(strip $(TEST_PACKAGES))" ] && [ "$$(id -u)" = 0 ]; then \
		bash scripts/install-test-packages.sh $(TEST_PACKAGES); fi

# The message writer's pure tests on Python 3.13 (when installed) beside the static checks
# (each uses one core: mypy's one run over src, tests, bench and scripts, 13 s of CPU from
# a cold cache where src alone took 6 s, while the 25 s of 3.13 tests run), the store's private
# uses of eventsourcing against its newest release, then the whole suite. Under CI=true the
# PostgreSQL tests must run: they use SENDLEDGER_TEST_PG_URL when a server answers there,
# else one private cluster for the session.
# pytest ends with its 25 slowest tests: where the next cut of the 10-minute budget lies.
# Three workers on two cores: much of the suite waits (a server's timeout, a daemon's stop,
# a PostgreSQL outage), and two workers left the cores idle meanwhile; each tier ran
# 25-30% faster with three (docs/development.md "What `make test` costs").
PYTEST_WORKERS ?= 3
test: $(STAMP) test-packages
	$(MAKE) --no-print-directory -j2 --output-sync=target test-py313 lint typecheck
	$(MAKE) --no-print-directory test-eventsourcing
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -q -p no:cacheprovider \
		--durations=25 tests

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

integration: $(STAMP)
	$(BIN)/python -m pytest -q tests/integration

e2e: $(STAMP)
	$(BIN)/python -m pytest -q tests/e2e

# The message writer's pure tests on Python 3.13 too, when it is installed (`make test` runs
# it first): a throw-away venv outside the repo, the sources on PYTHONPATH. The standard
# library's email package differs between 3.11.7 and 3.13; our writer must not.
PY313     ?= /root/.pyenv/versions/3.13.0/bin/python3
PY313_ENV ?= /tmp/sendledger-py313
MIME_TESTS := tests/unit/test_hostile_text.py tests/unit/test_wire_check.py tests/unit/test_header_encoding.py \
	tests/unit/test_mime.py tests/unit/test_mime_direct.py
test-py313: | $(BIN)/uv
	@if [ -x "$(PY313)" ]; then \
		[ -x $(PY313_ENV)/bin/python ] || $(PY313) -m venv $(PY313_ENV); \
		$(BIN)/uv pip install --quiet --python $(PY313_ENV)/bin/python \
			hypothesis pytest idna imapclient cryptography && \
		PYTHONPATH=src $(PY313_ENV)/bin/python -m pytest -q -p no:cacheprovider $(MIME_TESTS); \
	else echo "test-py313: no Python at $(PY313), skipped"; fi

# The store's use of eventsourcing's private API (ledger/stores/private_api.py) against the
# newest eventsourcing release, whatever the pin installs (`make test` runs it after
# test-py313): uv puts the release in a folder outside the repo, which goes first on
# PYTHONPATH; the rest comes from the venv. ES_SPEC="--prerelease allow eventsourcing" (or
# "eventsourcing==X") tries another.
ES_SPEC   ?= eventsourcing
ES_NEWEST ?= /tmp/sendledger-eventsourcing-newest
test-eventsourcing: $(STAMP)
	$(UV) --no-deps --upgrade --target $(ES_NEWEST) $(ES_SPEC)
	@PYTHONPATH=$(ES_NEWEST) $(BIN)/python -c "import importlib.metadata as m; \
		print('test-eventsourcing: eventsourcing', m.version('eventsourcing'))"
	PYTHONPATH=$(ES_NEWEST):src $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/integration/test_private_api.py

lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts

# One mypy run over every folder of Python, so that the modules they share are checked once
# (and cached once, in .mypy_cache).
typecheck: $(STAMP)
	$(BIN)/mypy --strict src tests bench scripts

# The bench extra (django-post_office, Django, aiosmtpd) is for bench/smtp_senders.py only,
# so `make test` never installs it.
bench: $(STAMP)
	$(UV) -e '.[bench]'
	$(BIN)/python bench/intake.py
	$(BIN)/python bench/pipeline.py
	$(BIN)/python bench/mailboxes.py
	$(BIN)/python bench/daemons.py
	$(BIN)/python bench/daemons.py --quota --kill
	$(BIN)/python bench/history.py $(HISTORY_ARGS)
	$(BIN)/python bench/render.py
	$(BIN)/python bench/claim_steps.py
	$(BIN)/python bench/smtp_senders.py
	$(BIN)/python bench/smtp_senders.py --kill --n 1000
	$(BIN)/python bench/smtp_senders.py --rtt 5 --unpipelined --only loop,post-office,sendledger --no-postgres --n 1000

# Not part of `make test`: 10,000 jobs, 20% faults, two daemons on PostgreSQL killed -9 in
# turn every 20 s, an operator at the CLI and the API, until all settle (bench/soak.py;
# SOAK_ARGS="--jobs 1000" for a short one, "--mode drafts" or "--mode graph"; see
# docs/performance.md "The chaos soak").
soak: $(STAMP)
	$(BIN)/python bench/soak.py $(SOAK_ARGS)

# Not part of `make test` or CI (it is long: each mutant runs the fast tests that reach it):
# mutmut on the safety modules (`[tool.mutmut]` in pyproject.toml), then the score per
# module (scripts/mutation_scores.py). MUTANTS="ledger.wire_check*" runs some of them;
# results of unchanged functions are kept in mutants/ between runs.
mutation: $(STAMP)
	$(BIN)/mutmut run $(MUTANTS) > mutants.log 2>&1 || (tail -c 2000 mutants.log; exit 1)
	$(BIN)/python scripts/mutation_scores.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build src/*.egg-info \
		mutants mutants.log
