# The two commands of the README, and a few more. CMake does the building;
# this file only strings the steps together.
#   make demo   install what is missing, build, run the demo fleet
#   make check  install, build with -Werror, run every test, then again under
#               ASan+UBSan and under TSan (what sanitizers find), and the
#               fuzz targets for FUZZ_SECONDS each (see check)
#   make check-long  the long fault/attack variants (MEMTALLY_LONG=1), longer fuzzing
#   make bench  Release build, run the benchmark suites, write bench/results/
#   make bench-fleet  a node that runs out of memory: the policies side by side,
#               their table in bench/results/fleet.md, bench/fleet.png (~13 min, root)
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps deps-build build demo check check-plain check-asan check-tsan check-fuzz fuzz check-long bench bench-fleet install clean \
	build-plain build-asan build-tsan build-fuzz test-plain test-plain-shared test-plain-alone test-asan-shared test-asan-alone \
	test-tsan-shared test-tsan-alone test-fuzz

all: build

deps:
	@bash scripts/deps.sh

# What building and the demo need, and nothing the tests alone run (Slurm,
# Prometheus, Celery, redis, ...).
deps-build:
	@bash scripts/deps.sh build

build: deps-build
	cmake -S . -B build -DMEMTALLY_WERROR=ON $(CMAKE_FLAGS)
	cmake --build build -j$(JOBS)

demo: build
	bash deploy/demo.sh build

# make check on a 2-core box in under 15 minutes, every suite run. Most tests
# wait on sockets and sleeps, so each pass runs its tests side by side
# (ctest -j$(CTEST_JOBS), more than the cores);
# what needs the machine to itself is labelled "alone" (RUN_SERIAL; see
# tests/integration/CMakeLists.txt) and runs after the rest, one at a time.
# The steps of check:
#   1. the plain tree builds;
#   2. its tests run, the shared ones then the alone ones, while beside
#      them the ASan, TSan and fuzz trees build and then the fuzz targets
#      run (two at a time, FUZZ_SECONDS each). The shared tests take the
#      load; while the alone ones run, the builds and fuzzers are at nice
#      19: they get only the CPU those tests leave (they mostly wait on the
#      clock), and a test that wakes takes the CPU back at once;
#   3. the ASan and the TSan passes' shared tests run at once, side by
#      side; then each pass's alone tests, one at a time.
# What the sanitized passes run: what a sanitizer can find there, in the
# code it instruments (memtallyd, the CLI, the unit-tested libraries; never
# the preload or the workers): every unit test, and memtallyd under every
# integration and deploy test but those labelled "timing" (their point is
# a duration, a rate or an instruction count), "slow" (long scenarios on a
# whole node or on the clock) or
# "preload" (what the preload counts in a runtime's heap or of a program's
# own mappings: memtallyd only relays it); no bench proofs (allocator and
# configuration proofs of the plain build). The fuzz targets run under
# ASan+UBSan in their own tree.
# So plain runs 128 tests, ASan 73, TSan 72 (see check-tsan), fuzz 7.
CTEST_JOBS ?= 6
SAN_EXCLUDE = fuzz|bench-proof|timing|slow|preload

# One shell for the steps of check that run beside each other: job control
# (set -m) gives the background its own process group, whose priority
# renice changes as the foreground moves on (lowering it needs root, as the
# tests do; without, it stays as it was).
check: SHELL := /bin/bash
check: deps
	$(MAKE) --no-print-directory build-plain
	@rm -f build/background.rc
	@echo "ASan, TSan and fuzz trees building, then fuzzing (log: build/background.log)"
	set -m; \
	{ $(MAKE) --no-print-directory build-asan build-tsan build-fuzz test-fuzz \
	    >build/background.log 2>&1; echo $$? >build/background.rc; } & bg=$$!; \
	$(MAKE) --no-print-directory test-plain-shared; rc=$$?; \
	renice -n 19 -g $$bg >/dev/null; \
	if [ $$rc = 0 ]; then $(MAKE) --no-print-directory test-plain-alone; rc=$$?; fi; \
	renice -n 0 -g $$bg >/dev/null 2>&1; wait $$bg; \
	if [ "$$(cat build/background.rc)" != 0 ]; then tail -100 build/background.log; exit 1; fi; \
	sed -n '/^Test project/,$$p' build/background.log; exit $$rc
	$(MAKE) --no-print-directory -j2 -O test-asan-shared test-tsan-shared
	$(MAKE) --no-print-directory test-asan-alone
	$(MAKE) --no-print-directory test-tsan-alone
	@echo "make check: all suites passed"

build-plain:
	cmake -S . -B build -DMEMTALLY_WERROR=ON $(CMAKE_FLAGS)
	cmake --build build -j$(JOBS)

build-asan:
	cmake -S . -B build-asan -DMEMTALLY_WERROR=ON -DMEMTALLY_SANITIZE=address,undefined $(CMAKE_FLAGS)
	cmake --build build-asan -j$(JOBS)

build-tsan:
	cmake -S . -B build-tsan -DMEMTALLY_WERROR=ON -DMEMTALLY_SANITIZE=thread $(CMAKE_FLAGS)
	cmake --build build-tsan -j$(JOBS)

test-plain: test-plain-shared
	$(MAKE) --no-print-directory test-plain-alone

test-plain-shared:
	cd build && ctest -j$(CTEST_JOBS) -LE alone --output-on-failure --timeout 600

test-plain-alone:
	cd build && ctest -L alone --output-on-failure --timeout 600

test-asan-shared:
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest -j$(CTEST_JOBS) -LE '$(SAN_EXCLUDE)|alone' --output-on-failure --timeout 900

test-asan-alone:
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest -LE '$(SAN_EXCLUDE)' -L alone --output-on-failure --timeout 900

test-tsan-shared:
	cd build-tsan && ctest -j$(CTEST_JOBS) -LE '$(SAN_EXCLUDE)|alone' --output-on-failure --timeout 900

test-tsan-alone:
	cd build-tsan && ctest -LE '$(SAN_EXCLUDE)' -L alone --output-on-failure --timeout 900

check-plain: build-plain
	$(MAKE) --no-print-directory test-plain

check-asan: build-asan
	$(MAKE) --no-print-directory test-asan-shared
	$(MAKE) --no-print-directory test-asan-alone

# Under TSan runs: every unit test (compiled against the Criterion stand-in
# in tests/support/tsan/: Criterion itself aborts under TSan, #274), every
# integration test but the "timing", "slow" and "preload" ones (see check;
# memtallyd and the CLI TSan-built; the test workers and the preload
# library never sanitized, as under ASan: they run under the malloc
# interposer, which TSan would fight for malloc), and the deploy tests that
# run without packaging (systemd, kubernetes, man). Not under TSan: fuzz
# targets (libFuzzer needs ASan), test_early_signal (TSan loses a signal
# sent the instant the socket appears, now and then; see
# tests/integration/CMakeLists.txt), bench proofs, deploy/package, deploy/demo
# and install/consumer (not registered in sanitized builds). A TSan report
# makes the reporting process exit 66: the unit test, or memtallyd's exit
# status, which the integration harness checks.
check-tsan: build-tsan
	$(MAKE) --no-print-directory test-tsan-shared
	$(MAKE) --no-print-directory test-tsan-alone

# libFuzzer needs clang; each target runs for FUZZ_SECONDS over its corpus.
FUZZ_SECONDS ?= 20
# Two targets at a time on two cores: each still gets a core for its
# FUZZ_SECONDS.
check-fuzz: build-fuzz
	$(MAKE) --no-print-directory test-fuzz

build-fuzz:
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -DMEMTALLY_FUZZ_SECONDS=$(FUZZ_SECONDS) $(CMAKE_FLAGS)
	cmake --build build-fuzz -j$(JOBS) --target fuzz_frame fuzz_segment fuzz_dispatch fuzz_size fuzz_config fuzz_slots fuzz_procfs

test-fuzz:
	cd build-fuzz && ctest -j$(JOBS) --output-on-failure -L fuzz

# Fuzz for as long as asked: make fuzz FUZZ_SECONDS=3600 (two targets at a
# time; inputs that add coverage stay in build-fuzz/tests/fuzz/work/<target>/corpus,
# a crashing input lands in .../<target>/artifacts/).
fuzz: deps
	$(MAKE) check-fuzz FUZZ_SECONDS=$(FUZZ_SECONDS)

# The long variants of the hostile-peer and fault tests (10,000 SIGKILL
# cycles, heavier attacks) and the fuzz targets for FUZZ_LONG_SECONDS each.
FUZZ_LONG_SECONDS ?= 600
check-long: deps
	cmake -S . -B build -DMEMTALLY_WERROR=ON $(CMAKE_FLAGS)
	cmake --build build -j$(JOBS)
	cd build && MEMTALLY_LONG=1 ctest --output-on-failure --timeout 7200 \
	    -R 'integration/test_(faults|hostile_peers|churn)'
	$(MAKE) check-fuzz FUZZ_SECONDS=$(FUZZ_LONG_SECONDS)

bench: deps
	cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build build-release -j$(JOBS)
	cmake --build build-release --target bench

# A memory cgroup as the node (root; exits 77 where none can be made), the
# same reproducible fleet under each policy. Measures policies, not nanoseconds: the
# ordinary build is enough.
bench-fleet: deps
	cmake -S . -B build -DMEMTALLY_WERROR=ON $(CMAKE_FLAGS)
	cmake --build build -j$(JOBS) --target memtallyd memtally_cli memtally_preload memtally_glibc mt_worker memtally_pb2
	MEMTALLY_PB2_DIR=$(CURDIR)/build/python /usr/bin/python3 bench/fleet.py --build build \
	    --results bench/results/fleet.md --plot bench/fleet.png

install: build
	cmake --install build

clean:
	rm -rf build build-asan build-tsan build-fuzz build-release
