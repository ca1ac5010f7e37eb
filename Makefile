# Thin wrapper around CMake. `make` builds into build/, `make test` runs the
# suite, `make test-asan` runs it under AddressSanitizer + UBSan.
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all deps deps-fuzz test test-asan fuzz demo demo-mlp clean format bench bench-table

all: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

deps:
	@scripts/install-deps.sh --check >/dev/null 2>&1 || scripts/install-deps.sh

test: all
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTESSEL_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS)

# The libFuzzer harnesses of tests/fuzz (clang, ASan+UBSan, in build-fuzz/),
# each run for FUZZ_SECONDS (default 30) from its seed corpus; docs/fuzzing.md.
FUZZ_SECONDS ?= 30
fuzz: deps-fuzz
	FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) scripts/fuzz.sh $(FUZZ_TARGETS)

deps-fuzz:
	@scripts/install-deps.sh --fuzz --check >/dev/null 2>&1 || scripts/install-deps.sh --fuzz

# Trains the small CNN on Fashion-MNIST (Debian package dataset-fashion-mnist,
# installed by `deps`) into a fresh run directory under runs/: about 91.5 %
# test accuracy in about 45 s on 2 cores. `make demo-mlp` runs the MLP
# example instead (about 89.6 % in about 10 s).
demo: all
	@$(BUILD)/tessel train examples/fashion_cnn.yaml --out runs/demo-$$(date +%Y%m%d-%H%M%S)

demo-mlp: all
	@$(BUILD)/tessel train examples/fashion_mnist.yaml --out runs/demo-mlp-$$(date +%Y%m%d-%H%M%S)

bench: all
	$(BUILD)/bench_gemm
	$(BUILD)/bench_step --workload W1 --compare-torch
	$(BUILD)/bench_step --workload W3 --compare-torch --steps 5

# The W1 / W3 / gpt2-124m table of docs/benchmarks.md, side by side with PyTorch
# (several minutes; REFERENCE=path/to/torch_bench.py if not ../shared/reference).
bench-table: all
	scripts/bench-table.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) build-asan build-fuzz
