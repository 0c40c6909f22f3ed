#!/usr/bin/env bash
# fuzz.sh runs every fuzz target in the repository for N seconds each
# (default 5): scripts/fuzz.sh [N]. Targets are found by their declaration
# (func FuzzXxx in a _test.go file) and run one at a time, since go test
# fuzzes one target per invocation. It prints each target's executions and
# exits non-zero if any target failed; a failing input is kept by go in the
# package's testdata/fuzz/<Target>/ and becomes a regression case of the
# ordinary go test run once committed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2

secs=${1:-5}
if ! [[ "$secs" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [seconds per target, default 5]" >&2
  exit 2
fi

targets=$(grep -rn --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]*\(' . |
  sed -E 's|^\./([^:]*):[0-9]+:func (Fuzz[A-Za-z0-9_]*)\(.*|\1 \2|' | sort)
if [ -z "$targets" ]; then
  echo "fuzz.sh: no fuzz targets found" >&2
  exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=()
summary=()
while read -r file name; do
  pkg="./$(dirname "$file")"
  echo "== $name ($pkg, ${secs}s)"
  go test -run='^$' -fuzz="^${name}\$" -fuzztime="${secs}s" "$pkg" >"$log" 2>&1
  rc=$?
  # The last progress line carries the total executions.
  execs=$(grep -Eo 'execs: [0-9]+' "$log" | tail -n 1 | grep -Eo '[0-9]+')
  if [ "$rc" -ne 0 ]; then
    cat "$log"
    failed+=("$name ($pkg)")
    summary+=("FAIL  $name  $pkg  execs=${execs:-0 (still gathering baseline coverage)}")
  else
    tail -n 2 "$log"
    summary+=("ok    $name  $pkg  execs=${execs:-0 (still gathering baseline coverage)}")
  fi
done <<<"$targets"

echo
echo "== summary (${secs}s per target)"
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz.sh: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
  exit 1
fi
