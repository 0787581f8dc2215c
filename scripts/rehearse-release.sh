#!/usr/bin/env bash
# The release rehearsal (`npm run release:rehearse`, docs/decisions/0170): from a clean
# checkout of HEAD, build every Linux binary with zig, compile-check and clippy the darwin and
# Windows targets, pack the packages as the release publishes them, and test each Linux binary
# on a Node 24 of its own platform, installed from the packed tarballs into an empty app with
# no Rust on the PATH, against a throwaway redis-server.
#
#   scripts/rehearse-release.sh [TRIPLE...]        the rehearsal (default: every napi target)
#   scripts/rehearse-release.sh build TRIPLE...    build Linux binaries in this tree, checked
#   scripts/rehearse-release.sh check TRIPLE...    cargo clippy for a target without linking
#   scripts/rehearse-release.sh pack DIR           the packages, as published, into DIR
#   scripts/rehearse-release.sh test PLATFORM DIR  install DIR's tarballs for PLATFORM and
#                                                  run the release workflow's EXTERNAL_SUITES
#
# `build`, `pack` and `test` are the commands .github/workflows/release.yml runs too.
# Compiled dependencies are kept in $DOKEBI_REHEARSAL_TARGET_DIR (default: the cross-tools
# cache's target/), so a second rehearsal rebuilds only this crate; `rm -rf` it for a cold run.
# The report (one line per target) is printed at the end and kept in
# $DOKEBI_REHEARSAL_DIR/report.txt (default: a fresh folder under /tmp, kept on failure).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
tools="$here/cross-tools.sh"
CACHE="${DOKEBI_CROSS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/dokebi-cross}"
VERSION="$(node -p 'require(process.argv[1]).version' "$repo/package.json")"
LINUX_TESTED=(linux-x64-gnu linux-x64-musl linux-arm64-gnu linux-arm64-musl)
# Spawn a child node from process.execPath: under QEMU user mode (no binfmt_misc) the real
# arm64 binary cannot be exec'd, so these leave the arm64 runs (they run on x64 gnu and musl).
SPAWNS_NODE=(__test__/dispose.test.mjs __test__/shutdown.test.mjs __test__/tracing.test.mjs
  __test__/faults/mutex.test.mjs __test__/faults/shutdown.test.mjs)

die() {
  echo "rehearse-release.sh: $*" >&2
  exit 1
}
say() { printf '\n==== %s ====\n' "$*" >&2; }

# The napi platform name of a triple, as `napi build --platform` names the binary.
platform_of() {
  case "$1" in
    x86_64-unknown-linux-gnu) echo linux-x64-gnu ;;
    x86_64-unknown-linux-musl) echo linux-x64-musl ;;
    aarch64-unknown-linux-gnu) echo linux-arm64-gnu ;;
    aarch64-unknown-linux-musl) echo linux-arm64-musl ;;
    x86_64-apple-darwin) echo darwin-x64 ;;
    aarch64-apple-darwin) echo darwin-arm64 ;;
    x86_64-pc-windows-msvc) echo win32-x64-msvc ;;
    aarch64-pc-windows-msvc) echo win32-arm64-msvc ;;
    *) die "unknown target $1" ;;
  esac
}
all_targets() { node -p 'require(process.argv[1]).napi.targets.join("\n")' "$repo/package.json"; }

# The glibc floor every gnu binary is built for (zig links against that version's symbols).
# Node 24's own Linux binaries need 2.28; 2.17 is what the napi-rs template builds for.
GLIBC_FLOOR=2.17

# ---------------------------------------------------------------- build ----

# Builds one Linux target in the current tree with zig and checks the binary: the right
# machine, no initial-exec TLS on musl (decision 0169), and no glibc symbol newer than the
# floor. Prints "size glibc" on stdout.
build_one() {
  local triple="$1" platform file machine zigbin
  platform="$(platform_of "$triple")"
  file="lock-redis.$platform.node"
  zigbin="$(bash "$tools" zig)"
  bash "$tools" targets "$triple"
  rm -f "$file"
  local spelled="$triple"
  # cargo-zigbuild reads a glibc version after the triple; the binary keeps the plain name.
  [[ "$triple" == *-gnu ]] && spelled="$triple.$GLIBC_FLOOR"
  PATH="$zigbin:$PATH" npm run --silent build -- --target "$spelled" -x >&2
  [[ -f "$file" ]] || die "$triple: napi build wrote no $file"
  git diff --quiet -- index.js 2>/dev/null || die "$triple: the build rewrote index.js (napi build without --js binding.js?)"
  machine="$(readelf -h "$file" | sed -n 's/^ *Machine: *//p')"
  case "$triple" in
    x86_64-*) [[ "$machine" == *X86-64* ]] ;;
    aarch64-*) [[ "$machine" == *AArch64* ]] ;;
  esac || die "$triple: $file is for '$machine'"
  if [[ "$triple" == *-musl ]]; then
    # musl refuses to dlopen a library with initial-exec TLS (decision 0169).
    if readelf -d "$file" | grep -q STATIC_TLS || readelf -rW "$file" | grep -Eq 'R_(X86_64_TPOFF|AARCH64_TLS_TPREL)'; then
      die "$triple: $file uses initial-exec TLS, which a musl Node cannot load"
    fi
  fi
  local glibc=-
  if [[ "$triple" == *-gnu ]]; then
    glibc="$(readelf -VW "$file" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n1)"
    [[ "$(printf '%s\n%s\n' "$glibc" "$GLIBC_FLOOR" | sort -V | tail -n1)" == "$GLIBC_FLOOR" ]] ||
      die "$triple: $file needs GLIBC_$glibc, above the floor $GLIBC_FLOOR"
  fi
  echo "$(stat -c %s "$file") $glibc"
}

# clippy (which compiles, without linking) for a target zig cannot link here.
check_one() {
  local triple="$1" zigbin
  zigbin="$(bash "$tools" zig)"
  bash "$tools" targets "$triple"
  # cargo-zigbuild supplies a C compiler for ring's and mimalloc's build scripts; for MSVC
  # targets it has none, and zig ships no MSVC headers. Their C is compiled by zig for the
  # same CPU's windows-gnu (MinGW headers; the same Windows C calling convention) only so that
  # the build scripts finish: clippy links nothing, and the Rust is checked for the MSVC target.
  if [[ "$triple" == *-msvc ]]; then
    local cc="$CACHE/zig-cc-$triple" ar="$CACHE/zig-lib"
    # cc-rs adds --target=<rust triple>, which zig does not parse (its own -target replaces it),
    # and archives with lib.exe's flags: zig lib is llvm-lib.
    # mimalloc builds as C++ on MSVC targets, so C++ too.
    local lang
    for lang in cc c++; do
      printf '#!/bin/sh\nfor a; do shift; case "$a" in --target=*) ;; *) set -- "$@" "$a" ;; esac; done\nexec "%s/python3" -m ziglang %s -target %s "$@"\n' \
        "$zigbin" "$lang" "${triple%%-*}-windows-gnu" >"$cc-$lang"
    done
    printf '#!/bin/sh\nexec "%s/python3" -m ziglang lib "$@"\n' "$zigbin" >"$ar"
    chmod +x "$cc-cc" "$cc-c++" "$ar"
    local var="${triple//-/_}"
    env "CC_$var=$cc-cc" "CXX_$var=$cc-c++" "AR_$var=$ar" PATH="$zigbin:$PATH" \
      cargo clippy --locked --target "$triple" --all-targets -- -D warnings >&2
  else
    PATH="$zigbin:$PATH" cargo-zigbuild clippy --locked --target "$triple" --all-targets -- -D warnings >&2
  fi
}

# ----------------------------------------------------------------- pack ----

# The packages as the release publishes them: each built binary in artifacts/bindings-<triple>/
# (placeholders for targets not built here, which are never packed), then the publish job's
# own `npm run artifacts` and prepublishOnly (without publishing), then npm pack of the root
# and of each platform package that has a real binary. Also packs fast-check and its
# dependency from node_modules: the properties suite imports it.
pack_all() {
  local out="$1" triple platform built=()
  mkdir -p "$out"
  rm -rf artifacts
  while read -r triple; do
    platform="$(platform_of "$triple")"
    mkdir -p "artifacts/bindings-$triple"
    if [[ -f "lock-redis.$platform.node" ]]; then
      mv "lock-redis.$platform.node" "artifacts/bindings-$triple/"
      built+=("$platform")
    else
      echo "placeholder: $platform was not built here" >"artifacts/bindings-$triple/lock-redis.$platform.node"
    fi
  done < <(all_targets)
  [[ -f binding.js ]] || die "binding.js is missing: build a target first"
  npm run --silent artifacts >&2
  npm run --silent prepublishOnly -- --skip-optional-publish --no-gh-release >&2
  npm pack --silent --pack-destination "$out" >/dev/null
  for platform in "${built[@]}"; do
    (cd "npm/$platform" && npm pack --silent --pack-destination "$out" >/dev/null)
  done
  mkdir -p "$out/deps"
  local dep
  for dep in fast-check pure-rand; do
    # tar, not npm pack: pure-rand's devEngines name pnpm, and npm pack refuses to run.
    tar -czf "$out/deps/$dep-$(node -p 'require(process.argv[1]).version' "$PWD/node_modules/$dep/package.json").tgz" \
      -C "$(cd "node_modules/$dep" && pwd -P)/.." --transform "s,^$dep,package," "$dep"
  done
  ls "$out" >&2
}

# ----------------------------------------------------------------- test ----

# A PATH with the given folders and the system's, minus any folder holding Rust's tools.
user_path() {
  local d out=()
  for d in "$@" /usr/local/bin /usr/bin /bin; do
    [[ -e "$d/cargo" || -e "$d/rustc" || -e "$d/rustup" ]] && continue
    out+=("$d")
  done
  (
    IFS=:
    echo "${out[*]}"
  )
}

# An empty app with package.json naming the root tarball, the test's own dependencies and every
# packed Linux platform package as an optional dependency: npm installs the one whose
# os/cpu/libc match --cpu/--libc (given as $3 $4), as it would pick it from the registry.
install_app() {
  local app="$1" pack="$2" cpu="$3" libc="$4"
  mkdir -p "$app"
  node - "$app" "$pack" "$VERSION" <<'EOF'
const fs = require('node:fs'), path = require('node:path')
const [app, pack, version] = process.argv.slice(2)
const file = (f) => `file:${path.join(pack, f)}`
const tarballs = fs.readdirSync(pack)
const optionalDependencies = {}
for (const t of tarballs) {
  const m = /^dokebi-lock-redis-(linux-.+)-(\d+\.\d+\.\d+)\.tgz$/.exec(t)
  if (m) optionalDependencies[`@dokebi/lock-redis-${m[1]}`] = file(t)
}
const dependencies = { '@dokebi/lock-redis': file(`dokebi-lock-redis-${version}.tgz`) }
for (const t of fs.readdirSync(path.join(pack, 'deps'))) {
  dependencies[t.replace(/-\d+\.\d+\.\d+\.tgz$/, '')] = file(path.join('deps', t))
}
fs.writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: 'rehearsal-app', version: '1.0.0', private: true, dependencies, optionalDependencies }, null, 2))
EOF
  (cd "$app" && PATH="$(user_path "$(dirname "$(command -v node)")")" \
    npm install --os linux --cpu "$cpu" --libc "$libc" --offline --no-audit --no-fund --loglevel=error >&2)
}

free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }

external_suites() {
  node -e 'const y=require("yaml");const fs=require("fs");console.log(y.parse(fs.readFileSync(".github/workflows/release.yml","utf8")).env.EXTERNAL_SUITES.trim())' | tr -s ' \n' '\n'
}

# Installs PLATFORM's packages from the tarballs in $2 into an empty app, runs the release
# workflow's EXTERNAL_SUITES there on PLATFORM's Node 24 with no Rust on the PATH, then checks
# that an app installed for the other libc fails to load with the error that names the
# platform. Prints "passed/total suites".
test_one() {
  local platform="$1" pack="$2" nodebin cpu libc other
  cpu="$(cut -d- -f2 <<<"$platform")"
  case "$platform" in *-gnu) libc=glibc other=musl ;; *) libc=musl other=glibc ;; esac
  nodebin="$(bash "$tools" node "$platform")"
  local work
  work="$(mktemp -d "${TMPDIR:-/tmp}/dokebi-rehearsal-$platform.XXXXXX")"
  local app="$work/app" pkg="$work/app/node_modules/@dokebi/lock-redis"
  install_app "$app" "$pack" "$cpu" "$libc"
  local installed
  installed="$(cd "$app/node_modules/@dokebi" && echo lock-redis-*)"
  [[ "$installed" == "lock-redis-$platform" ]] || die "$platform: npm installed '$installed', not lock-redis-$platform"
  # The suites run from inside the installed package (they load '../index.js'); the fault
  # suites seed Redis with the addon's Lua scripts, which the package embeds, not ships.
  cp -r "$repo/__test__" "$pkg/__test__"
  mkdir -p "$pkg/src/scripts"
  cp "$repo"/src/scripts/*.lua "$pkg/src/scripts/"

  local port redis_pid
  port="$(free_port)"
  mkdir -p "$work/redis"
  # setpriv: the kernel kills the server when this shell dies, however it dies.
  setpriv --pdeathsig KILL redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$work/redis" --logfile "$work/redis/redis.log" >/dev/null &
  redis_pid=$!
  # shellcheck disable=SC2064 # expand now: this run's server and folder
  trap "kill $redis_pid 2>/dev/null; wait $redis_pid 2>/dev/null; rm -rf '$work' || true" EXIT
  local waited=0
  until redis-cli -p "$port" ping >/dev/null 2>&1; do
    ((waited++ < 100)) || die "$platform: redis-server did not answer within 10 s"
    sleep 0.1
  done

  local path suites=() s
  path="$(user_path "$nodebin")"
  # A musl node on this glibc machine: napi-rs's loader reads /usr/bin/ldd to tell musl from
  # glibc, so it runs in a private mount namespace where that is musl's (scripts/cross-tools.sh).
  local ns=()
  if [[ "$libc" == musl && -x "$nodebin/../ldd" ]] && grep -q GLIBC /usr/bin/ldd 2>/dev/null; then
    ns=(unshare --mount sh -c 'mount --bind "$0" /usr/bin/ldd && exec "$@"' "$(cd "$nodebin/.." && pwd)/ldd")
  fi
  env -i HOME="$HOME" PATH="$path" sh -c 'command -v cargo || command -v rustc' >/dev/null && die "$platform: Rust is on the test PATH"
  # DOKEBI_REHEARSAL_SUITES (space-separated) narrows the run, to chase one failure.
  if [[ -n "${DOKEBI_REHEARSAL_SUITES:-}" ]]; then
    read -ra suites <<<"$DOKEBI_REHEARSAL_SUITES"
  else
    mapfile -t suites < <(cd "$repo" && external_suites)
  fi
  local runner=(node --test --test-concurrency=1 --test-timeout=300000)
  local emulated=false
  [[ "$(uname -m)" == x86_64 && "$cpu" == arm64 ]] && emulated=true
  if $emulated; then
    local keep=()
    for s in "${suites[@]}"; do [[ " ${SPAWNS_NODE[*]} " == *" $s "* ]] || keep+=("$s"); done
    suites=("${keep[@]}")
    # One file per process, in that process: node --test would spawn process.execPath per file.
    runner=(node --test --test-isolation=none --test-timeout=300000)
  fi
  local passed=0 failed=()
  if $emulated; then
    for s in "${suites[@]}"; do
      if (cd "$pkg" && env -i HOME="$HOME" PATH="$path" REDIS_URL="redis://127.0.0.1:$port" "${ns[@]}" "${runner[@]}" "$s" | tee -a "$work/out" >&2); then
        passed=$((passed + 1))
      else failed+=("$s"); fi
    done
  else
    if (cd "$pkg" && env -i HOME="$HOME" PATH="$path" REDIS_URL="redis://127.0.0.1:$port" "${ns[@]}" "${runner[@]}" "${suites[@]}" | tee -a "$work/out" >&2); then
      passed=${#suites[@]}
    else failed+=("(see the output above)"); fi
  fi

  # The wrong libc: an app installed for the other libc (node_modules copied between a glibc
  # and an Alpine image) must fail to load with the error naming this platform.
  local wrong="$work/wrong"
  install_app "$wrong" "$pack" "$cpu" "$other"
  local probe message
  probe='try { require("@dokebi/lock-redis"); console.log("LOADED") } catch (e) { console.log(e.message) }'
  message="$(cd "$wrong" && env -i HOME="$HOME" PATH="$path" "${ns[@]}" node -e "$probe")"
  [[ "$message" == *"no native binding could be loaded for $platform "* ]] ||
    die "$platform: an app installed for $other loaded or failed unclearly: $message"
  # The wrong machine: another architecture's binary fails in the loader, not later.
  local foreign
  foreign="$(find "$pack" -maxdepth 1 -name "dokebi-lock-redis-linux-*-$( [[ $libc == glibc ]] && echo gnu || echo musl)-*.tgz" ! -name "*$platform*" | head -n1)"
  if [[ -n "$foreign" ]]; then
    tar -xzf "$foreign" -C "$work" package/
    message="$(env -i HOME="$HOME" PATH="$path" "${ns[@]}" node -e 'try { require(process.argv[1]); console.log("LOADED") } catch (e) { console.log(e.code + ": " + e.message) }' "$(echo "$work"/package/*.node)")"
    [[ "$message" == ERR_DLOPEN_FAILED:* ]] || die "$platform: $(basename "$foreign")'s binary did not fail in the loader: $message"
    echo "$platform: wrong machine: ${message%%$'\n'*}" >&2
  fi

  ((${#failed[@]} == 0)) || die "$platform: failed: ${failed[*]}"
  # node:test's own totals, summed over the runs.
  local counts
  counts="$(awk '/^ℹ (pass|fail|skipped) /{n[$2]+=$3} END{printf "%d passed, %d failed, %d skipped", n["pass"], n["fail"], n["skipped"]}' "$work/out")"
  if $emulated; then
    echo "$passed/${#suites[@]} suites (QEMU: not the ${#SPAWNS_NODE[@]} that spawn a child node); tests: $counts"
  else
    echo "$passed/${#suites[@]} suites; tests: $counts"
  fi
}

# ------------------------------------------------------------ rehearsal ----

rehearse() {
  local targets=("$@")
  ((${#targets[@]})) || mapfile -t targets < <(all_targets)
  local dir="${DOKEBI_REHEARSAL_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/dokebi-rehearsal.XXXXXX")}"
  mkdir -p "$dir"
  local src="$dir/src" report="$dir/report.txt"
  say "clean checkout of $(git -C "$repo" rev-parse --short HEAD) in $src"
  [[ -z "$(git -C "$repo" status --porcelain --untracked-files=no)" ]] ||
    echo "rehearse-release.sh: uncommitted changes are not rehearsed (HEAD is)" >&2
  rm -rf "$src"
  mkdir -p "$src"
  git -C "$repo" archive HEAD | tar -x -C "$src"
  (cd "$src" && git init -q && git add -A && git -c user.name=rehearsal -c user.email=rehearsal@localhost commit -qm HEAD) # for the index.js guard
  if [[ -d "$repo/node_modules" ]] && cmp -s "$repo/package-lock.json" "$src/package-lock.json"; then
    ln -s "$(cd "$repo/node_modules" && pwd -P)" "$src/node_modules" # same lock: the same tree
  else
    (cd "$src" && npm ci --no-audit --no-fund >&2)
  fi
  export CARGO_TARGET_DIR="${DOKEBI_REHEARSAL_TARGET_DIR:-$CACHE/target}"
  cd "$src"
  : >"$report"
  local triple platform result started status=0
  for triple in "${targets[@]}"; do
    platform="$(platform_of "$triple")"
    started=$SECONDS
    case "$triple" in
      *-linux-*)
        say "build $triple"
        if result="$(build_one "$triple")"; then
          printf '%-28s built   %9s bytes  glibc %-5s  %4ss\n' "$triple" ${result% *} "${result#* }" $((SECONDS - started)) >>"$report"
        else
          printf '%-28s FAILED to build\n' "$triple" >>"$report"
          status=1
        fi
        ;;
      *)
        say "clippy $triple"
        if check_one "$triple"; then
          printf '%-28s clippy-clean (not linked: no SDK here)  %4ss\n' "$triple" $((SECONDS - started)) >>"$report"
        else
          printf '%-28s FAILED clippy\n' "$triple" >>"$report"
          status=1
        fi
        ;;
    esac
  done
  say "pack"
  pack_all "$dir/pack"
  for platform in "${LINUX_TESTED[@]}"; do
    [[ -f "$dir/pack/dokebi-lock-redis-$platform-$VERSION.tgz" ]] || continue
    say "test $platform"
    started=$SECONDS
    if result="$(test_one "$platform" "$dir/pack")"; then
      printf '%-28s tested on Node 24 %s: %s  %4ss\n' "$platform" "$platform" "$result" $((SECONDS - started)) >>"$report"
    else
      printf '%-28s FAILED its tests on Node 24 %s\n' "$platform" "$platform" >>"$report"
      status=1
    fi
  done
  say "report ($report)"
  cat "$report"
  return $status
}

case "${1:-}" in
  build)
    shift
    for t; do
      r="$(build_one "$t")"
      echo "$t: $r"
    done
    ;;
  check)
    shift
    for t; do check_one "$t"; done
    ;;
  pack)
    [[ $# -eq 2 ]] || die "usage: $0 pack DIR"
    pack_all "$2"
    ;;
  test)
    [[ $# -eq 3 ]] || die "usage: $0 test PLATFORM DIR"
    (test_one "$2" "$(cd "$3" && pwd)") # a subshell: its EXIT trap stops its server
    ;;
  *) rehearse "$@" ;;
esac
