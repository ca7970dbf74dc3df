#!/bin/sh
# tests/fuzz/seed_corpus.sh: refreshes the committed seed corpus of
# fuzz_frontend with plain copies of models/*.model, tests/models/*.model and
# tests/diagnostics/*.model, named by where they come from.  (The gradcheck_*
# seeds are the models of tests/test_gradcheck.c, extracted from it once.)
# usage: sh tests/fuzz/seed_corpus.sh   (from the repository root)
set -eu
out=tests/fuzz/corpus
mkdir -p "$out"
for f in models/*.model; do cp "$f" "$out/models_${f##*/}"; done
for f in tests/models/*.model; do cp "$f" "$out/tests_models_${f##*/}"; done
for f in tests/diagnostics/*.model; do cp "$f" "$out/diagnostics_${f##*/}"; done
ls "$out" | wc -l
