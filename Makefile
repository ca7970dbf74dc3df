# duet: the two set-up commands are `make train` and `make test`.
BUILD    ?= build
JOBS     ?= $(shell nproc 2>/dev/null || echo 2)
PACKAGES  = cmake make gcc libc6-dev flex bison libopenblas-openmp-dev libcjson-dev zlib1g-dev \
            dataset-fashion-mnist gzip bible-kjv clang libclang-rt-14-dev graphviz openmpi-bin libopenmpi-dev \
            python3-numpy gnuplot-nox
BENCH_PACKAGES = python3-torch python3-numpy
# NVRTC 12.9 and 11.8 for the sm_60 compile tests (make nvrtc; git-ignored)
NVRTC_DIR ?= .nvrtc

.PHONY: all deps build train test test-asan test-gpu fuzz bench clean data gpt nvrtc

all: build

deps:
	@sh tools/deps.sh $(PACKAGES)

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDUET_NVRTC_DIR=$(abspath $(NVRTC_DIR)) > /dev/null
	@cmake --build $(BUILD) -j$(JOBS)

# Trains the default model on real data (Fashion-MNIST) on the CPU.
train: build
	$(BUILD)/duet run models/fmnist_mlp.model

# The King James text for models/gpt_kjv.model (Debian package bible-kjv).
data: data/kjv.txt
data/kjv.txt:
	@sh tools/deps.sh bible-kjv
	sh tools/kjv.sh data/kjv.txt

# NVRTC of CUDA 12.9 and 11.8 (the P100's toolkits; CUDA 13 dropped sm_60)
# from NVIDIA's PyPI wheels, pinned by sha256: about 113 MB downloaded once
# into $(NVRTC_DIR) (git-ignored), for tests/test_nvrtc_sm60.c.
nvrtc:
	@python3 -m pip --version > /dev/null 2>&1 || sh tools/deps.sh python3-pip
	@sh tools/fetch-nvrtc.sh $(NVRTC_DIR)

# Trains the byte-level GPT of models/gpt_kjv.model (1,000 steps).
gpt: build data
	$(BUILD)/duet run models/gpt_kjv.model

# Before ctest: NVRTC 12.9 and 11.8 for the sm_60 compile tests
# (nvrtc_sm60_*); offline (or without pip) those tests are skipped.
test: build data
	@$(MAKE) --no-print-directory nvrtc || echo "duet: warning: NVRTC 12.9/11.8 not fetched: the nvrtc_sm60_* tests will be skipped"
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) -LE long
	@$(MAKE) --no-print-directory fuzz

# A bounded fuzz run (FUZZ_SECONDS, default 60) of the frontend, the verifier
# and the passes under ASan and UBSan (libFuzzer, clang): tests/fuzz/run.sh.
# A crashing input is left in $(BUILD)-fuzz/.
FUZZ_SECONDS ?= 60
fuzz: deps
	@CC=clang cmake -S . -B $(BUILD)-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDUET_FUZZ=ON > /dev/null
	@cmake --build $(BUILD)-fuzz -j$(JOBS) --target fuzz_frontend
	sh tests/fuzz/run.sh $(BUILD)-fuzz $(FUZZ_SECONDS)

# The GPU tests (ctest label gpu): skipped with a message without a GPU.
# On a GPU machine, tests/gpu/run.sh builds, runs these and the benchmark.
test-gpu: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

# The whole suite under AddressSanitizer and UndefinedBehaviorSanitizer.
test-asan: deps data
	@cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DDUET_SANITIZE=ON -DDUET_NVRTC_DIR=$(abspath $(NVRTC_DIR)) > /dev/null
	@cmake --build $(BUILD)-asan -j$(JOBS)
	cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j$(JOBS) -LE long

# Long accuracy checks (ctest label `long`): mixed precision against fp32 on
# fmnist_mlp (5 epochs) and gpt_kjv (DUET_LONG_GPT_STEPS, default 1000).
.PHONY: test-long
test-long: build data
	cd $(BUILD) && ctest --output-on-failure -L long

# Throughput against PyTorch on the same cores (not a test).
bench: build
	@sh tools/deps.sh $(BENCH_PACKAGES)
	sh bench/run.sh

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz

# gpt_kjv training throughput against PyTorch on the same cores (not a test).
.PHONY: bench-gpt
bench-gpt: build data
	@sh tools/deps.sh $(BENCH_PACKAGES)
	sh bench/run_gpt.sh

# Pipeline efficiency on the CPU: gpt_kjv on two virtual devices with one
# core each against one device with two cores (not a test).
.PHONY: bench-pipeline
bench-pipeline: build data
	sh bench/run_pipeline.sh

# Compile time against model size: elaboration, each pass, memplan and the
# IR reader for growing N (not a test; bench/compile_scaling.c). MAX_N caps N.
.PHONY: bench-compile
bench-compile: build
	@cmake --build $(BUILD) --target compile_scaling > /dev/null
	$(BUILD)/compile_scaling $(MAX_N)

# Data-parallel scaling on the CPU: gpt_kjv from 1 to 2 MPI ranks (1 thread
# each, the same global batch) against PyTorch DDP over gloo, rounds
# interleaved; duet's all-reduce time and the part hidden (not a test).
.PHONY: bench-dp
bench-dp: build data
	@sh tools/deps.sh $(BENCH_PACKAGES)
	sh bench/run_dp.sh
