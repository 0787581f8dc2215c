#!/bin/sh
# Where the addon's threads and the JS thread spend their CPU at N pairs in flight (issue 37,
# item 1): `perf record -e cpu-clock` (a software clock, so it works where the VM exposes no
# hardware counters) of benchmarks/callgrind-pairs.mjs against a throwaway redis-server, then
# each thread's samples summed by benchmarks/profile-categories.mjs. Symbols need a build that
# keeps them, loaded through DOKEBI_BENCH_PACKAGE:
#
#   CARGO_TARGET_DIR=/tmp/symtarget CARGO_PROFILE_RELEASE_STRIP=none CARGO_PROFILE_RELEASE_DEBUG=1 \
#     npx napi build --platform --release --output-dir /tmp/symbuild --js binding.js --dts binding.d.ts
#   cp index.js /tmp/symbuild/
#   DOKEBI_BENCH_PACKAGE=/tmp/symbuild sh benchmarks/profile-pairs.sh [pairs=300000] [inflight=64] [out]
set -eu
PAIRS=${1:-300000}
INFLIGHT=${2:-64}
here=$(cd "$(dirname "$0")" && pwd)
out=${3:-$(mktemp -d)}
mkdir -p "$out"
work=$(mktemp -d)
. "$here/throwaway-redis.sh"
start_throwaway_redis "$work"
# Run from the scratch folder: --perf-basic-prof also leaves V8 isolate logs in the cwd.
(cd "$work" && perf record -q -e cpu-clock -F 15000 -o "$work/perf.data" -- \
  node --perf-basic-prof "$here/callgrind-pairs.mjs" --url "redis://127.0.0.1:$port" --pairs "$PAIRS" --inflight "$INFLIGHT" >/dev/null 2>&1)
# The addon's runtime threads are named dokebi-lock-redis (15 characters kept: dokebi-lock-red).
for comm in MainThread dokebi-lock-red; do
  perf report -i "$work/perf.data" --no-children -g none --comm "$comm" --sort dso,sym --stdio --percent-limit 0 2>/dev/null \
    | grep -v '^#' | grep -v '^$' > "$out/symbols-$comm.txt"
  echo "== $comm: share of the thread's samples by category (%)"
  node "$here/profile-categories.mjs" < "$out/symbols-$comm.txt" | tee "$out/categories-$comm.json"
done
echo "per-symbol listings in $out"
