// The run's only source of randomness: every choice of the nemesis and of every worker comes
// from a stream derived from --seed, so a seed names the schedule of choices. (Timing on a
// shared machine still varies, so a seed replays the choices, not the exact interleaving.)

/** sfc32 seeded through splitmix32: small, fast, and good enough to pick faults and keys. */
export function rng(seed, ...stream) {
  let h = (Number(seed) >>> 0) ^ 0x9e3779b9;
  const mix = () => {
    h = (h + 0x9e3779b9) | 0;
    let z = h;
    z = Math.imul(z ^ (z >>> 16), 0x21f0aaad);
    z = Math.imul(z ^ (z >>> 15), 0x735a2d97);
    return (z ^ (z >>> 15)) >>> 0;
  };
  for (const s of stream) h ^= Math.imul(Number(s) + 1, 0x85ebca6b);
  let a = mix(), b = mix(), c = mix(), d = mix();
  const next = () => {
    const t = (((a + b) | 0) + d) | 0;
    d = (d + 1) | 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) | 0;
    c = (c << 21) | (c >>> 11);
    c = (c + t) | 0;
    return (t >>> 0) / 4294967296;
  };
  for (let i = 0; i < 12; i++) next();
  return {
    next,
    /** An integer in [lo, hi]. */
    int: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)),
    pick: (items) => items[Math.floor(next() * items.length)],
    chance: (p) => next() < p,
    /** A key of `weights` ({ name: weight }) drawn in proportion to its weight. */
    weighted(weights) {
      const entries = Object.entries(weights).filter(([, w]) => w > 0);
      let x = next() * entries.reduce((s, [, w]) => s + w, 0);
      for (const [name, w] of entries) if ((x -= w) < 0) return name;
      return entries.at(-1)[0];
    },
    shuffle(items) {
      const out = [...items];
      for (let i = out.length - 1; i > 0; i--) {
        const j = Math.floor(next() * (i + 1));
        [out[i], out[j]] = [out[j], out[i]];
      }
      return out;
    },
  };
}

/** Milliseconds on CLOCK_MONOTONIC, which every process on one Linux host shares (decision 0056). */
export const now = () => Number(process.hrtime.bigint()) / 1e6;
