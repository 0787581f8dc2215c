#!/usr/bin/env node
// Runs first in `prepublishOnly` (docs/decisions/0101-prebuilt-binaries.md).
//
// `files` in package.json includes `lock-redis.*.node` so that a local `npm pack` carries the
// binary built on this machine and installs without Rust and without the platform packages.
// A *published* root package must carry none: each platform gets its binary from its
// `@dokebi/lock-redis-<platform>` optional dependency. `napi artifacts` copies every release
// artifact both into npm/<platform>/ and into the package root, so before publishing we
// remove the root copies — only those byte-identical to the artifact in npm/<platform>/.
// Anything else in the root (a local `npm run build`, a debug build) stops the publish:
// it is not the release artifact, and shipping it would be wrong.
//
//   node npm/prune-root-binaries.mjs [packageDir]   (default: the parent of this file)

import { readFileSync, readdirSync, rmSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const root = path.resolve(process.argv[2] ?? path.join(path.dirname(fileURLToPath(import.meta.url)), '..'))
const { napi } = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8'))
const prefix = `${napi.binaryName}.`

const stray = []
const pruned = []
for (const name of readdirSync(root)) {
  if (!name.startsWith(prefix) || !name.endsWith('.node')) continue
  const platform = name.slice(prefix.length, -'.node'.length) // e.g. linux-x64-gnu
  let artifact
  try {
    artifact = readFileSync(path.join(root, 'npm', platform, name))
  } catch {
    artifact = undefined
  }
  if (artifact && artifact.equals(readFileSync(path.join(root, name)))) {
    rmSync(path.join(root, name))
    pruned.push(name)
  } else {
    stray.push(name)
  }
}

if (stray.length > 0) {
  console.error(
    `prune-root-binaries: ${stray.join(', ')} in the package root ${stray.length === 1 ? 'is' : 'are'} not the release ` +
      `artifact in npm/<platform>/ (a local build?). A published @dokebi/lock-redis carries no binary of its own. ` +
      `Remove ${stray.length === 1 ? 'it' : 'them'}, put every release artifact in artifacts/ and run \`npm run artifacts\`, then publish again.`,
  )
  process.exit(1)
}
console.log(pruned.length ? `prune-root-binaries: removed root copies ${pruned.join(', ')}` : 'prune-root-binaries: no root binaries')
