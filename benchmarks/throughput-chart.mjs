// The SVG chart of benchmarks/throughput.bench.mjs: grouped bars of pairs/s per library at
// each in-flight level (whiskers: min–max over the repetitions), with the ceiling lines.
// A hand-written SVG string, no chart dependency.

const COLORS = { dokebi: '#2563eb', redlock: '#d97706', semaphore: '#059669', 'js-driver': '#9333ea' };
const esc = (s) => String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
const k = (x) => (x >= 10_000 ? `${(x / 1000).toFixed(0)}k` : x >= 1000 ? `${(x / 1000).toFixed(1)}k` : `${Math.round(x)}`);

function niceMax(x) {
  const p = 10 ** Math.floor(Math.log10(x));
  for (const m of [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (m * p >= x) return m * p;
  return 10 * p;
}

/**
 * @param {object} o
 * @param {string} o.title
 * @param {string|string[]} o.subtitle one line or several
 * @param {number[]} o.levels in-flight levels, one group each
 * @param {{library: string, label: string, values: {median: number, min: number, max: number}[]}[]} o.series
 * @param {{label: string, value: number, dash?: string, color?: string, groups?: number[]}[]} o.lines
 *   horizontal lines; `groups` limits a line to those group indexes
 */
export function chartSvg({ title, subtitle, levels, series, lines }) {
  const W = 860;
  const H = 500;
  const m = { top: 78, right: 250, bottom: 76, left: 70 };
  const pw = W - m.left - m.right;
  const ph = H - m.top - m.bottom;
  const all = [
    ...series.flatMap((s) => s.values.flatMap((v) => (v ? [v.max ?? v.median] : []))),
    ...lines.map((l) => l.value),
  ].filter((x) => Number.isFinite(x));
  const ymax = niceMax(Math.max(1, ...all) * 1.08);
  const y = (v) => m.top + ph - (v / ymax) * ph;
  const groupW = pw / levels.length;
  const barW = Math.min(56, (groupW * 0.7) / series.length);
  const out = [];
  out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif" font-size="12">`);
  out.push(`<rect width="${W}" height="${H}" fill="#ffffff"/>`);
  out.push(`<text x="${m.left}" y="24" font-size="16" font-weight="600" fill="#111">${esc(title)}</text>`);
  [].concat(subtitle).forEach((line, i) => out.push(`<text x="${m.left}" y="${42 + i * 15}" fill="#555" font-size="11">${esc(line)}</text>`));

  // Grid and y axis.
  const ticks = 5;
  for (let i = 0; i <= ticks; i++) {
    const v = (ymax / ticks) * i;
    out.push(`<line x1="${m.left}" x2="${m.left + pw}" y1="${y(v).toFixed(1)}" y2="${y(v).toFixed(1)}" stroke="${i ? '#e5e7eb' : '#9ca3af'}"/>`);
    out.push(`<text x="${m.left - 8}" y="${(y(v) + 4).toFixed(1)}" text-anchor="end" fill="#444">${k(v)}</text>`);
  }
  out.push(`<text transform="translate(18 ${m.top + ph / 2}) rotate(-90)" text-anchor="middle" fill="#333">acquire+release pairs per second</text>`);

  // Bars.
  levels.forEach((level, g) => {
    const gx = m.left + g * groupW + (groupW - barW * series.length) / 2;
    series.forEach((s, i) => {
      const v = s.values[g];
      if (!v || !Number.isFinite(v.median)) return;
      const x = gx + i * barW;
      const top = y(v.median);
      out.push(`<rect x="${(x + 2).toFixed(1)}" y="${top.toFixed(1)}" width="${(barW - 4).toFixed(1)}" height="${(m.top + ph - top).toFixed(1)}" fill="${COLORS[s.library] ?? '#6b7280'}"><title>${esc(`${s.label}, ${level} in flight: ${Math.round(v.median)} pairs/s (reps ${Math.round(v.min)}–${Math.round(v.max)})`)}</title></rect>`);
      if (Number.isFinite(v.min) && Number.isFinite(v.max) && v.max > v.min) {
        const cx = (x + barW / 2).toFixed(1);
        out.push(`<line x1="${cx}" x2="${cx}" y1="${y(v.max).toFixed(1)}" y2="${y(v.min).toFixed(1)}" stroke="#111" stroke-width="1"/>`);
        for (const w of [v.min, v.max]) out.push(`<line x1="${(x + barW / 2 - 4).toFixed(1)}" x2="${(x + barW / 2 + 4).toFixed(1)}" y1="${y(w).toFixed(1)}" y2="${y(w).toFixed(1)}" stroke="#111"/>`);
      }
      out.push(`<text x="${(x + barW / 2).toFixed(1)}" y="${(Math.min(top, y(v.max ?? v.median)) - 5).toFixed(1)}" text-anchor="middle" font-size="11" fill="#111">${k(v.median)}</text>`);
    });
    out.push(`<text x="${(m.left + g * groupW + groupW / 2).toFixed(1)}" y="${m.top + ph + 20}" text-anchor="middle" fill="#111">${level} in flight</text>`);
  });

  // Ceiling lines. Full-width ones are labelled in the right margin (pushed apart when
  // close); lines limited to some groups go into the second legend row.
  const labels = [];
  for (const l of lines) {
    if (!Number.isFinite(l.value)) continue;
    const yy = y(l.value);
    const color = l.color ?? '#dc2626';
    const gs = l.groups ?? levels.map((_, i) => i);
    for (const g of gs) {
      out.push(`<line x1="${(m.left + g * groupW + 4).toFixed(1)}" x2="${(m.left + (g + 1) * groupW - 4).toFixed(1)}" y1="${yy.toFixed(1)}" y2="${yy.toFixed(1)}" stroke="${color}" stroke-width="1.5" stroke-dasharray="${l.dash ?? '6 4'}"/>`);
    }
    if (!l.groups) labels.push({ y: yy, l, color });
  }
  labels.sort((a, b) => a.y - b.y);
  let last = -Infinity;
  for (const lab of labels) {
    const ly = Math.max(lab.y + 4, last + 14);
    last = ly;
    out.push(`<line x1="${(m.left + pw).toFixed(1)}" x2="${(m.left + pw + 8).toFixed(1)}" y1="${lab.y.toFixed(1)}" y2="${(ly - 4).toFixed(1)}" stroke="${lab.color}" stroke-width="0.8"/>`);
    out.push(`<text x="${m.left + pw + 12}" y="${ly.toFixed(1)}" fill="${lab.color}" font-size="11">${esc(`${lab.l.label} ${k(lab.l.value)}`)}</text>`);
  }

  // Legend.
  series.forEach((s, i) => {
    const lx = m.left + i * 170;
    const ly = H - 38;
    out.push(`<rect x="${lx}" y="${ly - 10}" width="12" height="12" fill="${COLORS[s.library] ?? '#6b7280'}"/>`);
    out.push(`<text x="${lx + 18}" y="${ly}" fill="#111">${esc(s.label)}</text>`);
  });
  const partial = lines.filter((l) => l.groups && Number.isFinite(l.value));
  if (partial.length) {
    const ly = H - 16;
    const color = partial[0].color ?? '#6b7280';
    out.push(`<line x1="${m.left}" x2="${m.left + 22}" y1="${ly - 4}" y2="${ly - 4}" stroke="${color}" stroke-width="1.5" stroke-dasharray="${partial[0].dash ?? '6 4'}"/>`);
    out.push(`<text x="${m.left + 28}" y="${ly}" fill="#333" font-size="11">${esc(partial.map((l) => `${l.label} ${k(l.value)}`).join('; '))}</text>`);
  }
  out.push(`<text x="${W - 8}" y="${H - 8}" text-anchor="end" font-size="10" fill="#777">whiskers: min–max of the repetitions</text>`);
  out.push('</svg>');
  return out.join('\n') + '\n';
}
