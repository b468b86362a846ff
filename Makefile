# Convenience targets. The README's two commands are scripts/demo.sh and
# scripts/test.sh (they need no make on a fresh machine); these call them.
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

demo:
	BUILD=$(BUILD) ./scripts/demo.sh

test:
	TEST_BUILD=$(TEST_BUILD) ./scripts/test.sh

bench: build
	./scripts/bench.sh

fuzz: deps
	@command -v clang >/dev/null || { echo "make fuzz needs clang: apt-get install clang"; exit 1; }
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DKGPU_FUZZ=ON >/dev/null
	cmake --build build-fuzz -j$(JOBS)
	@echo "fuzzers in build-fuzz/tests/fuzz/; run one on a scratch copy of its corpus, e.g.:"
	@echo "  cp -r tests/fuzz/corpus/trace /tmp/c && build-fuzz/tests/fuzz/fuzz_trace -max_total_time=60 /tmp/c"

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(TEST_BUILD) build-fuzz out
