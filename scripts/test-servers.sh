#!/usr/bin/env bash
# The server matrix (`npm run test:servers`): the suites that talk to Redis, run once per
# server of scripts/servers.sh, each with that server's `redis-server` first on PATH (the
# tests spawn throwaway servers from PATH).
#
#   scripts/test-servers.sh [NAME...]    default: every server (scripts/servers.sh list)
#
# Per server: `cargo test --no-default-features` (the Rust core against throwaway servers,
# Sentinels and a Cluster) and the node:test suites of `__test__/` and `__test__/faults/`
# (the package as users call it). Left out because the server plays no part in them:
# packaging, Jest and the type tests, and lint; `npm test` runs those once.
# The node suites load the addon built last (`npm run build` or `build:debug`); it is built
# here only when there is none.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
if (($# == 0)); then
  mapfile -t all < <(scripts/servers.sh list)
  set -- "${all[@]}"
fi
unset REDIS_URL # the suites would use that server instead of their own

if ! compgen -G 'lock-redis.*.node' >/dev/null; then
  npm run build || exit 1
fi

failed=()
summary=()
for name; do
  bin="$(scripts/servers.sh bin "$name")" || {
    failed+=("$name (fetch)")
    continue
  }
  version="$(PATH="$bin:$PATH" redis-server --version)"
  printf '\n==== %s: %s ====\n' "$name" "$version"
  started=$SECONDS
  ok=1
  PATH="$bin:$PATH" cargo test --no-default-features --no-fail-fast || ok=0
  PATH="$bin:$PATH" node --test --test-concurrency=1 '__test__/*.test.mjs' '__test__/faults/*.test.mjs' || ok=0
  took=$((SECONDS - started))
  if ((ok)); then
    summary+=("passed  $name  ${took}s  $version")
  else
    summary+=("FAILED  $name  ${took}s  $version")
    failed+=("$name")
  fi
done

printf '\n==== server matrix ====\n'
printf '%s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "failed on: ${failed[*]}" >&2
  exit 1
fi
