# shellcheck shell=bash
# tools/probes/racecheck_run.sh: sourced by racecheck_rates and racecheck_cases.
# racecheck_run LABEL INDEX LIMIT_S COMMAND...: runs COMMAND (compute-sanitizer --tool racecheck
# ...) with its output in a temporary log, cut after LIMIT_S seconds; appends
# "LABEL INDEX rc=.. Ns internal_error=yes|no <racecheck summary>" to $RACECHECK_RESULTS; keeps
# the log as $OUT/internal_error_LABEL_INDEX.log when it shows racecheck's "Internal Sanitizer
# Error", and the first log of each LABEL as $OUT/first_LABEL.log. Returns 0 when the error
# showed, 1 otherwise.
racecheck_run() {
  local label=$1 index=$2 limit=$3 start rc secs err=no summary log
  shift 3
  log=$(mktemp)
  start=$(date +%s)
  timeout "$limit" "$@" >"$log" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  if grep -q "Internal Sanitizer Error" "$log"; then
    err=yes
    cp "$log" "$OUT/internal_error_${label}_${index}.log"
  fi
  [[ -f "$OUT/first_${label}.log" ]] || cp "$log" "$OUT/first_${label}.log"
  summary=$(grep -m1 "RACECHECK SUMMARY" "$log" | sed 's/^========= //')
  echo "$label $index rc=$rc ${secs}s internal_error=$err ${summary:-no summary}" >>"$RACECHECK_RESULTS"
  rm -f "$log"
  [[ "$err" == yes ]]
}
