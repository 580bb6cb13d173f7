# shellcheck shell=bash
# tools/probes/racecheck_run.sh: sourced by racecheck_rates, racecheck_cases and racecheck_variants.
# racecheck_run LABEL INDEX LIMIT_S COMMAND...: runs COMMAND (compute-sanitizer --tool racecheck
# ...) with its output in a temporary log, cut after LIMIT_S seconds; appends
# "LABEL INDEX rc=.. Ns internal_error=yes|no [crash] <racecheck summary>" to $RACECHECK_RESULTS;
# keeps the log as internal_error_LABEL_INDEX.log when it shows racecheck's "Internal Sanitizer
# Error", as failed_LABEL_INDEX.log when the run failed otherwise (rc not 0; "crash" when the test
# printed a crash stack, TENSORPLAY_CRASH_STACK), and the first log of each LABEL as
# first_LABEL.log, in a folder that racecheck_pack_logs packs
# into $OUT/racecheck_logs.tgz at the end (the device tool brings back at most 8 files from $OUT).
# Returns 0 when the error showed, 1 otherwise.
RACECHECK_LOGS=$(mktemp -d)
racecheck_run() {
  local label=$1 index=$2 limit=$3 start rc secs err=no crash="" summary log
  shift 3
  log=$(mktemp)
  start=$(date +%s)
  timeout "$limit" "$@" >"$log" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  if grep -q "Internal Sanitizer Error" "$log"; then
    err=yes
    cp "$log" "$RACECHECK_LOGS/internal_error_${label}_${index}.log"
  elif ((rc != 0)); then
    cp "$log" "$RACECHECK_LOGS/failed_${label}_${index}.log"
  fi
  grep -q "tensorplay test: signal" "$log" && crash=" crash"
  [[ -f "$RACECHECK_LOGS/first_${label}.log" ]] || cp "$log" "$RACECHECK_LOGS/first_${label}.log"
  summary=$(grep -m1 "RACECHECK SUMMARY" "$log" | sed 's/^========= //')
  echo "$label $index rc=$rc ${secs}s internal_error=$err$crash ${summary:-no summary}" >>"$RACECHECK_RESULTS"
  rm -f "$log"
  [[ "$err" == yes ]]
}

# racecheck_pack_logs: the kept logs into $OUT/racecheck_logs.tgz; the results to stdout too.
racecheck_pack_logs() {
  tar -C "$RACECHECK_LOGS" -czf "$OUT/racecheck_logs.tgz" . && rm -rf "$RACECHECK_LOGS"
  cat "$RACECHECK_RESULTS"
}
