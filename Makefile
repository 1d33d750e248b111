# The two commands of the README, and a few more. CMake does the building;
# this file only strings the steps together.
#   make demo   install what is missing, build, run the demo fleet
#   make check  install, build with -Werror, run every test, then again under
#               ASan+UBSan, then again under TSan (see check-tsan), then the
#               fuzz targets for FUZZ_SECONDS each
#   make check-long  the long fault/attack variants (MEMTALLY_LONG=1), longer fuzzing
#   make bench  Release build, run the benchmark suites, write bench/RESULTS.md
#   make bench-fleet  a node that runs out of memory: the policies side by side,
#               their table in bench/RESULTS.md, bench/fleet.png (~7 min, root)
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps deps-build build demo check check-plain check-asan check-tsan check-fuzz fuzz check-long bench bench-fleet install clean

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

check: deps check-plain check-asan check-tsan check-fuzz
	@echo "make check: all suites passed"

check-plain:
	cmake -S . -B build -DMEMTALLY_WERROR=ON $(CMAKE_FLAGS)
	cmake --build build -j$(JOBS)
	cd build && ctest --output-on-failure --timeout 600

check-asan:
	cmake -S . -B build-asan -DMEMTALLY_WERROR=ON -DMEMTALLY_SANITIZE=address,undefined $(CMAKE_FLAGS)
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure --timeout 900 -LE 'fuzz|bench-proof'

# Under TSan runs: every unit test (compiled against the Criterion stand-in
# in tests/support/tsan/: Criterion itself aborts under TSan, #274), every
# integration test (memtallyd and the CLI TSan-built; the test workers and
# the preload library never sanitized, as under ASan: they run under the
# malloc interposer, which TSan would fight for malloc), and the deploy tests
# that run without packaging (systemd, kubernetes, man). Not under TSan:
# fuzz targets (libFuzzer needs ASan), bench proofs, deploy/package,
# deploy/demo and install/consumer (not registered in sanitized builds).
# A TSan report makes the reporting process exit 66: the unit test, or
# memtallyd's exit status, which the integration harness checks. ~2 min.
check-tsan:
	cmake -S . -B build-tsan -DMEMTALLY_WERROR=ON -DMEMTALLY_SANITIZE=thread $(CMAKE_FLAGS)
	cmake --build build-tsan -j$(JOBS)
	cd build-tsan && ctest --output-on-failure --timeout 900 -LE 'fuzz|bench-proof'

# libFuzzer needs clang; each target runs for FUZZ_SECONDS over its corpus.
FUZZ_SECONDS ?= 20
check-fuzz:
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -DMEMTALLY_FUZZ_SECONDS=$(FUZZ_SECONDS) $(CMAKE_FLAGS)
	cmake --build build-fuzz -j$(JOBS) --target fuzz_frame fuzz_segment fuzz_dispatch fuzz_size fuzz_config fuzz_slots
	cd build-fuzz && ctest --output-on-failure -L fuzz

# Fuzz for as long as asked: make fuzz FUZZ_SECONDS=3600 (each target in
# turn; inputs that add coverage stay in build-fuzz/tests/fuzz/work/<target>/corpus,
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
	cmake --build build -j$(JOBS) --target memtallyd memtally_cli memtally_preload memtally_glibc mt_fleet memtally_pb2
	MEMTALLY_PB2_DIR=$(CURDIR)/build/python /usr/bin/python3 bench/fleet.py --build build \
	    --results bench/RESULTS.md --plot bench/fleet.png

install: build
	cmake --install build

clean:
	rm -rf build build-asan build-tsan build-fuzz build-release
