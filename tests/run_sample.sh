#!/bin/sh
# duet sample: a tiny GPT trained for a few steps on a licence text; the
# output starts with the prompt, has exactly --tokens more bytes, and is the
# same for the same seed; the tiny LLaMA (rope, grouped-query attention:
# its decoding program) likewise; non-language models are refused.
# usage: run_sample.sh path/to/duet   (from the repository root)
DUET=${1:?usage: run_sample.sh path/to/duet}
d=${TMPDIR:-/tmp}/duet-sample.$$
mkdir -p "$d" || exit 1
trap 'rm -rf "$d"' EXIT
pass=0 fail=0
ok() { echo "ok $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
G=tests/models/gpt_tiny.model
"$DUET" run $G --data /usr/share/common-licenses/GPL-3 --steps 60 --no-eval --quiet --save "$d/ck.st" > /dev/null || bad train
"$DUET" sample $G --checkpoint "$d/ck.st" --prompt "The GNU" --tokens 50 --seed 3 > "$d/a.txt" 2>&1 || { bad sample; cat "$d/a.txt"; }
"$DUET" sample $G --checkpoint "$d/ck.st" --prompt "The GNU" --tokens 50 --seed 3 > "$d/b.txt" 2>&1
"$DUET" sample $G --checkpoint "$d/ck.st" --prompt "The GNU" --tokens 50 --seed 4 > "$d/c.txt" 2>&1
[ "$(head -c 7 "$d/a.txt")" = "The GNU" ] && ok starts_with_prompt || bad starts_with_prompt
[ "$(wc -c < "$d/a.txt")" -eq 58 ] && ok length || { bad length; wc -c < "$d/a.txt"; }
cmp -s "$d/a.txt" "$d/b.txt" && ok same_seed_same_text || bad same_seed_same_text
cmp -s "$d/a.txt" "$d/c.txt" && bad other_seed_other_text || ok other_seed_other_text
"$DUET" sample $G --checkpoint "$d/ck.st" --prompt "ab" --tokens 5 --temperature 0 > "$d/g1.txt" &&
"$DUET" sample $G --checkpoint "$d/ck.st" --prompt "ab" --tokens 5 --temperature 0 --seed 9 > "$d/g2.txt" &&
cmp -s "$d/g1.txt" "$d/g2.txt" && ok greedy_ignores_seed || bad greedy_ignores_seed
L=tests/models/llama_tiny.model
"$DUET" run $L --data /usr/share/common-licenses/GPL-3 --steps 30 --no-eval --quiet --save "$d/l.st" > /dev/null || bad llama_train
"$DUET" sample $L --checkpoint "$d/l.st" --prompt "The GNU" --tokens 30 --seed 3 > "$d/l1.txt" 2>&1 || { bad llama_sample; cat "$d/l1.txt"; }
"$DUET" sample $L --checkpoint "$d/l.st" --prompt "The GNU" --tokens 30 --seed 3 > "$d/l2.txt" 2>&1
[ "$(head -c 7 "$d/l1.txt")" = "The GNU" ] && [ "$(wc -c < "$d/l1.txt")" -eq 38 ] && ok llama_prompt_and_length ||
  { bad llama_prompt_and_length; wc -c < "$d/l1.txt"; }
cmp -s "$d/l1.txt" "$d/l2.txt" && ok llama_same_seed_same_text || bad llama_same_seed_same_text
"$DUET" run models/fmnist_mlp.model --steps 1 --no-eval --quiet --save "$d/f.st" > /dev/null
out=$("$DUET" sample models/fmnist_mlp.model --checkpoint "$d/f.st" 2>&1)
[ "$out" = "duet: error: model \`fmnist_mlp\` is not a byte-level language model compiled for generation" ] \
  && ok refuses_classifier || { bad refuses_classifier; echo "$out"; }
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
