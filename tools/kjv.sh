#!/bin/sh
# Writes the King James text (Debian package bible-kjv) to the given file,
# one verse a line, with the verse references ("Ge1:1 ") stripped.
# usage: tools/kjv.sh data/kjv.txt
out=${1:?usage: tools/kjv.sh OUT}
mkdir -p "$(dirname "$out")" || exit 1
tmp="$out.tmp.$$"
bible -f "gen1:1-rev22:21" | sed 's/^[^ ]* //' > "$tmp" || { rm -f "$tmp"; exit 1; }
lines=$(wc -l < "$tmp")
[ "$lines" -eq 31102 ] || { echo "tools/kjv.sh: expected 31102 verses, got $lines" >&2; rm -f "$tmp"; exit 1; }
mv "$tmp" "$out"
echo "wrote $out ($(wc -c < "$out") bytes, $lines verses)"
