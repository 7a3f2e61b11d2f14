# Two commands do everything on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
TORCH := torch==2.13.0
# the installer of the project and its dependencies (the recipe below says why)
UV := uv==0.13.9
# llama.cpp's build: cpu here; the GPU node's image build runs `make -C CHECKOUT install
# LLAMA_VARIANT=cuda` (tasks/gcp/image_build.sh), the same steps with CUDA for the L4
LLAMA_VARIANT ?= cpu

.PHONY: install run test test-fast mutation lint bench clean-state docs

# `make` alone, or `make install`: everything `make run` and `make test` need, in .venv.
install: $(STAMP)

# convert.py, llama_build.py and llama_cpp.py: their install steps run in existing environments too.
$(STAMP): pyproject.toml tasks/training/convert.py tasks/engine/llama_build.py tasks/engine/llama_cpp.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip $(UV)
	# llama.cpp before the project, so the installer never compiles it with -march=native nor
	# takes an old wheel from a cache: tasks/engine/llama_build.py holds the flags (the x86-64
	# baseline, AVX2/FMA/F16C), compiles the vendored llama.cpp once — its libraries and
	# llama-server — and keeps the wheel in ~/.cache/slm-nightly, keyed by pin and flags (~7 min
	# once per machine on 2 cores; seconds after that, fresh clones included).
	$(PY) -m tasks.engine.llama_build build --variant $(LLAMA_VARIANT)
	$(PY) -m tasks.engine.llama_build install --variant $(LLAMA_VARIANT)
	# The project, its dependencies and torch (pinned here: pyproject has a lower bound only, the
	# GPU node trains on its engine's torch; PyPI's default build, +cu130 with its CUDA libraries,
	# 4.7 GB installed: a CPU-only build is not on PyPI), by uv: its cache (~/.cache/uv) keeps
	# each wheel it downloaded whatever the index's caching headers say, where pip's HTTP cache
	# keeps nothing on this project's machines, so a fresh clone installs in ~1 min (pip: ~140 s,
	# torch's 3 GB downloaded again each time). As pip does: the machine's trusted certificates
	# (uv's default is a list of its own), and every module compiled to bytecode now — a process
	# that cannot write its .pyc (PYTHONDONTWRITEBYTECODE, as on these machines, or a service
	# user) would otherwise compile torch, transformers and Prefect anew at each start.
	$(VENV)/bin/uv pip install --quiet --system-certs --compile-bytecode --python $(PY) \
		-e '.[dev]' $(TORCH)
	# llama.cpp's own converters (HF → GGUF, PEFT LoRA → GGUF) from the installed
	# llama-cpp-python's source distribution, into $(VENV)/share/slm-nightly (a few seconds).
	$(PY) -m tasks.training.convert install
	# The installed library evaluates a prompt of a few hundred tokens in a child process, and
	# so does llama-server: a build this CPU cannot run fails here, with the signal, the library
	# and its flags.
	$(PY) -m tasks.engine.llama_build check
	# The GPU node (the cuda variant): its NVIDIA driver runs PyTorch's CUDA, or the image build
	# stops here naming the fix (tasks/engine/cuda_driver.py)
	test $(LLAMA_VARIANT) != cuda || $(PY) -m tasks.engine.cuda_driver
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/slm-nightly run --profile local --summary .slm-nightly/last-summary.json

# Both tiers on every core (pytest-xdist, one worker per core and one more; `TEST_WORKERS=N` to
# change it): the tests wait on their servers and children, so one worker per core left the
# cores idle. Measured on 2 cores, 2026-12-06, the parallel part: 2 workers kept the cores 70 %
# busy and took 1,516 s; 3 kept them 93 % busy and took 1,398 s, one test of it hanging 300 s
# on a slot bug the third worker found (tasks/shared/slots.py _Lease). On 2026-12-04, before
# each worker's processes ran on one OpenMP thread (tests/conftest.py), a third was slower.
# each worker has its own servers (FalkorDB, Prefect, llama-server, the GCS emulator), ports
# (tasks/shared/processes.py reserves them machine-wide), PREFECT_HOME and temporary folders; a module
# stays on one worker (--dist loadfile), so a night it shares among its tests runs once; the
# longest modules go first (tests/conftest.py HEAVY, kept in that order: --no-loadscope-reorder). Then the
# serial group alone: tests whose point is timing on an otherwise idle machine (a busy core,
# sub-second deadlines), marked `serial` (Ctrl-C and SIGTERM on a busy run stay in the parallel
# part: a SIGTERM lost there was a bug, tasks/extraction/calls.py _signals_kept). The 25 slowest tests
# close each part's log.
# The first line resolves the tests' Neo4j (Java 17 and Maven; once per machine, ~45 s:
# tasks/graph/neo4j_local.py); each worker starts its own when a test needs it.
# One file: `$(PY) -m pytest tests/integration/test_engine.py`; one test: add `::NAME`; the
# serial group: `$(PY) -m pytest -m serial tests`.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: lint
	$(PY) -m tasks.graph.neo4j_local
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial" --durations=25 tests/unit tests/integration
	$(PY) -m pytest -m serial --durations=25 tests/unit tests/integration

# The unit tier alone on every core (~40 s on 2 cores): no servers, no models, no serial group.
test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not serial" tests/unit

# Mutation testing of the pure core, judged by the unit tier alone (mutmut; its settings are
# pyproject.toml's [tool.mutmut]): plants one small bug at a time in the functions below and
# counts the bugs some test catches. Fails under 92 % killed (equivalent mutants, listed with
# their reasons in tests/unit/mutation_score.py, left out); `$(VENV)/bin/mutmut show NAME`
# prints a survivor. mutmut's own output goes to mutants.log. CPU-heavy: about 30 minutes on
# 2 quiet cores (3,900 mutants).
# Issue 24: the graph schema, the prompt's version, what build_batch keeps, the eval's scores.
MUTATE_QUALITY := tasks.graph.ontology.* tasks.extraction.prompt.x_document_version__* \
	tasks.extraction.prompt.x_deterministic_version__* tasks.extraction.prompt.x_extraction_version__* \
	tasks.extraction.answers.x__from_llm__* tasks.extraction.answers.x__surname_aliases__* \
	tasks.extraction.answers.x__join__* tasks.extraction.answers.x_grounded__* \
	tasks.extraction.answers.x__ground_form__* tasks.extraction.answers.x__deterministic__* \
	tasks.extraction.rows.* tasks.evaluation.metrics.*
# Issue 25: the night's capacity figures and phase 1's request pacing.
MUTATE_PACE := tasks.extraction.capacity.* tasks.extraction.pacing.*
# Issue 37: the rows a graph store refuses before any Cypher, and batches cut by bytes.
MUTATE_GRAPH := tasks.graph.store.x_value_bytes__* tasks.graph.store.x_sized_batches__* \
	tasks.graph.store.x__property_problem__* tasks.graph.store.x_check_row__*
# Issue 39: the node's host-RAM estimate, the image build's plan and labels.
MUTATE_NODE := tasks.compute.host_memory.* tasks.gcp.image.x__label__* \
	tasks.gcp.image.x_labels__* tasks.gcp.image.x*ImageBuild* tasks.gcp.image.x_image_build__*
MUTATE := tasks.extraction.plan.x_plan__* tasks.extraction.schema.x_map_*__* \
	tasks.extraction.schema.x__relabel__* tasks.extraction.resolve.* \
	tasks.corpus.scorecard.x__row_rules__* tasks.corpus.scorecard.x__ties__* \
	tasks.corpus.scorecard.x__empty_turn__* tasks.corpus.scorecard.x*ScorecardConfig*_token_bounds* \
	tasks.corpus.scorecard.x__compose__* tasks.corpus.scorecard.x__key__* \
	tasks.corpus.scorecard.x__normalized__* tasks.corpus.scorecard.x__pair_text__* \
	tasks.corpus.scorecard.x_near_duplicates__* tasks.corpus.scorecard.x__near_from_signatures__* \
	tasks.corpus.scorecard.x_jaccards__* tasks.corpus.scorecard.x__jaccard__* \
	tasks.corpus.scorecard.x__shingles__* tasks.corpus.scorecard.x__distinct__* \
	tasks.training.registry.x_gate__* tasks.training.registry.x*ArtifactStore*promote__* \
	tasks.training.reconcile.x_verdict__* tasks.training.reconcile.x_reconcile__* \
	tasks.compute.gce.placement.* tasks.engine.llama_build.x_pin__* tasks.engine.llama_build.x_flags__* \
	tasks.engine.llama_build.x_build_key__* tasks.engine.llama_build.x_cache_root__* \
	tasks.engine.llama_build.x_entry_dir__* tasks.engine.llama_build.x_cached_wheel__* \
	tasks.engine.llama_cpp.x_features__* tasks.engine.llama_build.x__record_line__* \
	tasks.engine.llama_build.x_add_to_wheel__* tasks.compute.kv_budget.* \
	tasks.shared.environment.x_differences__* tasks.shared.environment.x_digest__* tasks.shared.environment.x__name__* \
	tasks.shared.code_version.x_code_files__* tasks.shared.code_version.x_code_version__* \
	tasks.shared.code_version.x_code_folder__* $(MUTATE_QUALITY) $(MUTATE_PACE) $(MUTATE_GRAPH) \
	$(MUTATE_NODE)
mutation: $(STAMP)
	rm -rf mutants
	nice $(VENV)/bin/mutmut run --max-children 2 $(MUTATE) > mutants.log 2>&1 \
		|| { tail -n 20 mutants.log; exit 1; }
	$(PY) tests/unit/mutation_score.py --min 92 $(MUTATE)

# mypy's cache lives in the build cache (tasks/engine/llama_build.py cache_root), outside the
# checkout: mypy checks each cached file by its hash, so a fresh clone reuses it (a cold run, most
# of it the libraries' types: ~60 s on 2 cores; warm: ~3 s).
lint: $(STAMP)
	$(VENV)/bin/ruff check flows tasks blocks tests bench examples
	$(VENV)/bin/mypy --cache-dir "$$($(PY) -c 'from tasks.engine.llama_build import cache_root; \
		print(cache_root() / "mypy")')" --ignore-missing-imports flows tasks blocks

# Every bench, one after the other; says which ran, which it skipped (and why: no GPU, say), and
# fails only when one failed. `make bench BENCH="scorecard_1m rerun_unchanged"` runs those only.
bench: $(STAMP)
	$(PY) bench/run_all.py $(BENCH)

# docs/reference.md from the code (CLI, profile keys, recipe keys); tests/unit/test_docs.py
# fails when it is stale.
docs: $(STAMP)
	$(PY) docs/generate.py

clean-state:
	rm -rf .slm-nightly
