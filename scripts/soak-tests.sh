#!/usr/bin/env bash
# A stability run: the suites of `npm test` run N times in a row, to find tests that fail
# only sometimes (a tight timing bound, a race). A failure seen once here is evidence, not
# noise: the suite must pass on a busy 2-core machine.
#
#   scripts/soak-tests.sh N [--hog] [--rust-only | --node-only] [--filter PATTERN]
#
#   N               rounds (each: `cargo test --no-default-features --no-fail-fast`, then
#                   `node --test --test-concurrency=1 '__test__/**/*.test.mjs'`)
#   --hog           beside a busy loop that takes one core for the whole run (stopped on exit)
#   --rust-only     only the cargo tests
#   --node-only     only the node:test suites
#   --filter P      only tests whose name matches P (cargo's name filter; node's
#                   --test-name-pattern, a regular expression)
#
# The node suites load the addons built last and this script does not build them: run
# `npm run build` and `npm run build:chaos-mutants` first (as `npm test` does). Each failure
# is printed with its round and test name as it is found, then one line per round and the
# tally; the full output of every round stays in target/soak/<start time>/. Exits 1 if any
# round failed.
set -uo pipefail

usage() {
  sed -n '6,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

rounds=''
hog=0
rust=1
node=1
filter=''
while (($#)); do
  case "$1" in
    --hog) hog=1 ;;
    --rust-only) node=0 ;;
    --node-only) rust=0 ;;
    --filter)
      (($# >= 2)) || usage
      filter="$2"
      shift
      ;;
    --filter=*) filter="${1#--filter=}" ;;
    -h | --help) usage ;;
    *)
      if [[ -z "$rounds" && "$1" =~ ^[1-9][0-9]*$ ]]; then
        rounds="$1"
      else
        echo "soak-tests: unknown argument: $1" >&2
        usage
      fi
      ;;
  esac
  shift
done
[[ -n "$rounds" ]] || usage
((rust || node)) || {
  echo 'soak-tests: --rust-only and --node-only together leave nothing to run' >&2
  exit 2
}

if ((node)); then
  missing=()
  compgen -G 'lock-redis.*.node' >/dev/null || missing+=('lock-redis.<platform>.node (npm run build)')
  compgen -G 'target/chaos-mutants/lock-redis.*.node' >/dev/null ||
    missing+=('target/chaos-mutants/lock-redis.<platform>.node (npm run build:chaos-mutants)')
  if ((${#missing[@]})); then
    echo 'soak-tests: the node suites need the addon built first; missing:' >&2
    printf '  %s\n' "${missing[@]}" >&2
    echo '(or run only the Rust tests: --rust-only)' >&2
    exit 2
  fi
fi

unset REDIS_URL # the suites would use that server instead of their own throwaway ones

logs="target/soak/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$logs" || exit 2

hog_pid=''
stop_hog() {
  if [[ -n "$hog_pid" ]]; then
    kill "$hog_pid" 2>/dev/null
    wait "$hog_pid" 2>/dev/null
    hog_pid=''
  fi
}
trap stop_hog EXIT
trap 'stop_hog; exit 130' INT
trap 'stop_hog; exit 143' TERM
if ((hog)); then
  # One core busy for the whole run: what a CI neighbour or a second build does to timing.
  yes >/dev/null &
  hog_pid=$!
fi

# Prints "<round> rust  <binary> <test>" for every `test <name> ... FAILED` line of cargo's
# output, naming the test binary from the `Running` line before it. A binary that fails
# without a failed test (a crash, a build error) is printed as such.
rust_failures() {
  awk -v round="$1" '
    /^ *Running / { bin = ($2 == "unittests") ? $3 : $2; sub(/^.*\//, "", bin); next }
    /^test .* \.\.\. FAILED$/ { name = $2; print "round " round "  rust  " bin "  " name; n++; next }
    /^error: test failed, to rerun pass/ { crashed++ }
    /^error(\[E[0-9]+\])?: / && !/^error: test failed/ && !/^error: [0-9]+ targets? failed/ {
      if (!build) { print "round " round "  rust  (build) " $0; build = 1; n++ }
    }
    END { if (!n && crashed) print "round " round "  rust  (a test binary failed without a failed test: see the log)" }
  ' "$2"
}

# Prints "<round> node  <test>" for every failed test of the TAP output, with the file and
# line of its `location:` field. Only the leaves: a failed describe block (or file) whose
# subtests failed only repeats them, but one that failed itself (a hook, a crash) is kept,
# and stands for the subtests it cancelled (failureType cancelledByParent).
node_failures() {
  awk -v round="$1" '
    function flush() {
      if (pending != "") print "round " round "  node  " pending (loc != "" ? "  (" loc ")" : "")
      pending = ""; loc = ""
    }
    /^ *(not )?ok [0-9]+ - / {
      flush()
      d = int((match($0, /[^ ]/) - 1) / 4)
      kid = sub_failed[d + 1]
      for (k in sub_failed) if (k + 0 > d) delete sub_failed[k]
      if ($0 !~ /^ *not ok / || $0 ~ / # TODO/) next
      was = sub_failed[d]; sub_failed[d] = 1
      if (!kid) { pending = $0; sub(/^ *not ok [0-9]+ - /, "", pending); pdepth = d; pwas = was }
      next
    }
    /^ *failureType: .cancelledByParent./ && pending != "" {
      sub_failed[pdepth] = pwas; pending = ""; loc = ""
      next
    }
    /^ *location: / && pending != "" && loc == "" {
      loc = $0; sub(/^ *location: */, "", loc); gsub(/\047/, "", loc); sub(/^.*\/__test__\//, "__test__/", loc)
      next
    }
    END { flush() }
  ' "$2"
}

started_all=$SECONDS
summary=()
failed_rounds=0
for ((round = 1; round <= rounds; round++)); do
  printf '\n==== round %d of %d%s ====\n' "$round" "$rounds" "$( ((hog)) && echo ' (beside a CPU hog)')"
  started=$SECONDS
  failures=()
  if ((rust)); then
    log="$logs/round-$round-rust.log"
    cargo_args=(test --no-default-features --no-fail-fast)
    [[ -n "$filter" ]] && cargo_args+=(-- "$filter")
    cargo "${cargo_args[@]}" >"$log" 2>&1
    rc=$?
    mapfile -t found < <(rust_failures "$round" "$log")
    if ((rc != 0 && ${#found[@]} == 0)); then
      found=("round $round  rust  (cargo exited $rc without a failed test: see $log)")
    fi
    if ((${#found[@]})); then
      printf '%s\n' "${found[@]}"
      failures+=("${found[@]}")
    fi
  fi
  if ((node)); then
    log="$logs/round-$round-node.log"
    node_args=(--test --test-concurrency=1 --test-reporter=tap)
    [[ -n "$filter" ]] && node_args+=("--test-name-pattern=$filter")
    node "${node_args[@]}" '__test__/**/*.test.mjs' >"$log" 2>&1
    rc=$?
    mapfile -t found < <(node_failures "$round" "$log")
    if ((rc != 0 && ${#found[@]} == 0)); then
      found=("round $round  node  (node --test exited $rc without a failed test: see $log)")
    fi
    if ((${#found[@]})); then
      printf '%s\n' "${found[@]}"
      failures+=("${found[@]}")
    fi
  fi
  took=$((SECONDS - started))
  if ((${#failures[@]})); then
    failed_rounds=$((failed_rounds + 1))
    summary+=("round $round: FAILED ($((${#failures[@]})) failure(s), ${took}s)")
  else
    summary+=("round $round: passed (${took}s)")
  fi
  echo "${summary[-1]}"
done

printf '\n==== soak: %s ====\n' "$logs"
printf '%s\n' "${summary[@]}"
echo "$rounds rounds, $failed_rounds failed ($((SECONDS - started_all))s$( ((hog)) && echo ', beside a CPU hog'))"
((failed_rounds == 0))
