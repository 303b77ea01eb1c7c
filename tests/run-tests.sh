#!/usr/bin/env bash
# Runs every test binary of the workspace that `cargo test --no-run` built: unit tests and doc
# tests first, then the integration test binaries $VCP_TEST_JOBS (default 2) at a time.
#
# Why not `cargo test`: it runs test binaries one after another, and an integration binary
# spends most of its time waiting on a dev cluster (each binary starts its own and shares it
# between its tests), so two cores sit idle. Side by side they share the machine instead.
# Each binary runs as cargo would run it: in its package's directory, with CARGO_MANIFEST_DIR
# set. Its output goes to target/test-logs/<package>-<name>.log; a failing binary's log is
# printed, and the run fails if any binary failed.
#
# Usage: tests/run-tests.sh [cargo test args, e.g. --locked]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
jobs=${VCP_TEST_JOBS:-2}
logs="$repo/target/test-logs"
rm -rf "$logs" && mkdir -p "$logs"

# The binaries, from cargo's own account of what it built (and a no-op build if current).
plan="$logs/plan.tsv"
cargo test --workspace --no-run --message-format=json-render-diagnostics "$@" |
  python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    t = m["target"]
    kind = "integration" if t["kind"] == ["test"] else "unit"
    print("\t".join([kind, os.path.dirname(m["manifest_path"]), t["name"], m["executable"]]))
' >"$plan"

# Longest first (from docs/benchmarks.md, "CI wall time"), so the last to start are short.
# rotation: 510 s run alone (2026-11-27) since its phases wait for the replaced apiserver to stop.
# The real-node binaries (conformance about 320 s, real_node about 280 s) next: ranked last by
# default, they made the tail of the run.
order=(rotation conformance real_node upgrade fleet sync contract datastore provision burst access cli encryption backup snapshot
       isolation inventory kubelet resilience api tenant_audit lifecycle incluster chart kubelet_api
       devnode crash postgres host_cluster render_dry_run)
rank() {
  local i
  for i in "${!order[@]}"; do [[ ${order[$i]} == "$1" ]] && { echo "$i"; return; }; done
  echo 99
}

run_one() { # dir name exe -> exit status; output in the log
  local dir=$1 name=$2 exe=$3 pkg log t0 status
  pkg=$(basename "$dir")
  log="$logs/$pkg-$name.log"
  t0=$SECONDS
  set +e
  (cd "$dir" && CARGO_MANIFEST_DIR="$dir" "$exe") >"$log" 2>&1
  status=$?
  set -e
  if [[ $status == 0 ]]; then
    printf 'PASS %-28s %4ss  %s\n' "$pkg/$name" "$((SECONDS - t0))" "$(grep -E '^test result' "$log" | tail -1)"
  else
    printf 'FAIL %-28s %4ss  (log: %s)\n' "$pkg/$name" "$((SECONDS - t0))" "$log"
  fi
  return "$status"
}

# A failed binary's log, shortened: the test harness's own summary of what failed, else the
# log's end. awk, not `| head`: head closing the pipe early killed the writer with SIGPIPE,
# and pipefail turned a failed run into exit 141 before the list of failures was printed
# (CI, 2026-11-29). tests/dev/tests/scripts.rs runs this function.
failure_summary() { # log
  if grep -q '^failures:' "$1" 2>/dev/null; then
    awk '/^failures:/ { p = 1 } p && n++ < 300' "$1"
  else
    tail -60 "$1" 2>/dev/null || true
  fi
}

failed=()
echo "--- unit tests"
while IFS=$'\t' read -r kind dir name exe; do
  [[ $kind == unit ]] || continue
  run_one "$dir" "$name" "$exe" || failed+=("$(basename "$dir")-$name")
done <"$plan"

echo "--- doc tests"
if cargo test --workspace --doc "$@" >"$logs/doc-tests.log" 2>&1; then
  echo "PASS doc tests"
else
  echo "FAIL doc tests (log: $logs/doc-tests.log)"
  failed+=(doc-tests)
fi

echo "--- integration tests, $jobs at a time"
mapfile -t queue < <(while IFS=$'\t' read -r kind dir name exe; do
  [[ $kind == integration ]] && printf '%s\t%s\t%s\t%s\n' "$(rank "$name")" "$dir" "$name" "$exe"
done <"$plan" | sort -n -k1,1 | cut -f2-)
declare -A running=()
status_dir=$(mktemp -d)
for entry in "${queue[@]}"; do
  while (( $(jobs -rp | wc -l) >= jobs )); do wait -n || true; done
  IFS=$'\t' read -r dir name exe <<<"$entry"
  ( run_one "$dir" "$name" "$exe" || touch "$status_dir/$(basename "$dir")-$name" ) &
done
wait
for f in "$status_dir"/*; do [[ -e $f ]] && failed+=("$(basename "$f")"); done
rm -rf "$status_dir"

if (( ${#failed[@]} )); then
  for f in "${failed[@]}"; do
    echo
    echo "=== $f: failures"
    failure_summary "$logs/$f.log"
  done
  echo
  echo "failed: ${failed[*]}"
  exit 1
fi
echo "all test binaries passed"
