# tests/golden_lib.sh: sourced by the diagnostics runners (run_diagnostics.sh,
# run_ir_diagnostics.sh) for UPDATE_GOLDEN=1.
#
# golden_acceptable NAME RC OUTPUT_FILE GOLDEN_FILE
#   succeeds when the output of a run that exited RC may become the golden:
#   what the test expects is a successful run (exit 0) or a user diagnostic
#   (exit 1 with a `file:line:col: error: ` line or `duet: error: `), and an
#   existing golden says which of the two (it holds `: error: ` or not).  A
#   crash (a signal, an abort), a sanitizer report, an internal error or any
#   other exit status is never written.  Prints why when it refuses.
golden_acceptable() {
  ga_name=$1 ga_rc=$2 ga_out=$3 ga_golden=$4
  case $ga_rc in
    0) ga_kind=ok ;;
    1) if grep -q ': error: ' "$ga_out"; then ga_kind=diagnostic; else
         echo "FAIL $ga_name: not updated: exit 1 without a diagnostic (no \`: error: \` line)"; head -20 "$ga_out"
         return 1
       fi ;;
    *) echo "FAIL $ga_name: not updated: exit $ga_rc (a crash or a usage error, not a result to record)"
       head -20 "$ga_out"
       return 1 ;;
  esac
  if grep -q -e 'internal error' -e 'Sanitizer' -e 'runtime error:' "$ga_out"; then
    echo "FAIL $ga_name: not updated: the output holds an internal error or a sanitizer report (exit $ga_rc)"
    head -20 "$ga_out"
    return 1
  fi
  if [ -f "$ga_golden" ]; then
    if grep -q ': error: ' "$ga_golden"; then ga_want=diagnostic; else ga_want=ok; fi
    if [ "$ga_kind" != "$ga_want" ]; then
      echo "FAIL $ga_name: not updated: the golden expects $( [ "$ga_want" = ok ] && echo 'a successful run' || echo 'a diagnostic'), the run gave $( [ "$ga_kind" = ok ] && echo 'success' || echo 'a diagnostic') (exit $ga_rc); delete $ga_golden to record the other kind"
      head -20 "$ga_out"
      return 1
    fi
  fi
  return 0
}
