#!/bin/sh
# tests/diagnostics/gen_deep.sh: writes the deeply nested inputs
#   deep_parens.model   loss = mean(((( ... x ... ))))   10,000 parentheses
#   deep_neg.model      loss = mean(-(-(-( ... x ))))    10,000 negations
# Run it in tests/diagnostics; the generated files are committed.
set -eu
N=10000
gen() { # file open close
  awk -v n="$N" -v op="$2" -v cl="$3" -v name="${1%.model}" 'BEGIN {
    printf "model %s\ninput x: f32[4, 8]\nloss = mean(", name
    for (i = 0; i < n; i++) printf "%s", op
    printf "x"
    for (i = 0; i < n; i++) printf "%s", cl
    printf ")\n"
  }' >"$1"
}
gen deep_parens.model "(" ")"
gen deep_neg.model "-(" ")"
