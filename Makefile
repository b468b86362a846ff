# Thin wrapper for the README's two commands; CMake and CTest do the work.
#   make demo   install dependencies, build, simulate the bundled example
#   make test   install dependencies, build with ASan+UBSan, run every test
BUILD      ?= build
TEST_BUILD ?= build-test
JOBS       ?= $(shell nproc)

.PHONY: all deps build demo test bench fuzz format clean

all: build

deps:
	@./scripts/deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DKGPU_BUILD_TESTS=OFF >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

demo: build
	@mkdir -p out
	./$(BUILD)/kgpu simulate --nodes examples/nodes.csv --pods examples/pods.csv --plot out/example.svg
	@echo "plot: out/example.svg"

test: deps
	cmake -S . -B $(TEST_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKGPU_SANITIZE=ON >/dev/null
	cmake --build $(TEST_BUILD) -j$(JOBS)
	cd $(TEST_BUILD) && ctest --output-on-failure -j$(JOBS)

bench: build
	./scripts/bench.sh

fuzz: deps
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DKGPU_FUZZ=ON >/dev/null
	cmake --build build-fuzz -j$(JOBS)
	@echo "fuzzers: build-fuzz/tests/fuzz/fuzz_* (run one with a corpus dir, e.g. tests/fuzz/corpus/trace)"

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(TEST_BUILD) build-fuzz out
