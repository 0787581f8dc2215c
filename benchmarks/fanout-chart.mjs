// The SVG chart of benchmarks/fanout.bench.mjs: redis-server CPU per acquire+release pair
// against the number of subscribed processes, one line per notification mode (whiskers:
// min–max over the repetitions). A hand-written SVG string, as throughput-chart.mjs.

const esc = (s) => String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

function niceMax(x) {
  const p = 10 ** Math.floor(Math.log10(x));
  for (const m of [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (m * p >= x) return m * p;
  return 10 * p;
}

/**
 * @param {object} o
 * @param {string} o.title
 * @param {string|string[]} o.subtitle
 * @param {{label: string, color: string, points: {x: number, y: number, min?: number, max?: number}[]}[]} o.series
 */
export function fanoutSvg({ title, subtitle, series }) {
  const W = 860;
  const H = 480;
  const m = { top: 78, right: 40, bottom: 110, left: 70 };
  const pw = W - m.left - m.right;
  const ph = H - m.top - m.bottom;
  const xs = [...new Set(series.flatMap((s) => s.points.map((p) => p.x)))].sort((a, b) => a - b);
  const xmax = Math.max(1, ...xs);
  const ymax = niceMax(Math.max(1, ...series.flatMap((s) => s.points.map((p) => p.max ?? p.y)).filter(Number.isFinite)) * 1.08);
  const x = (v) => m.left + (v / xmax) * pw;
  const y = (v) => m.top + ph - (v / ymax) * ph;
  const out = [];
  out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif" font-size="12">`);
  out.push(`<rect width="${W}" height="${H}" fill="#ffffff"/>`);
  out.push(`<text x="${m.left}" y="24" font-size="16" font-weight="600" fill="#111">${esc(title)}</text>`);
  [].concat(subtitle).forEach((line, i) => out.push(`<text x="${m.left}" y="${42 + i * 15}" fill="#555" font-size="11">${esc(line)}</text>`));
  const ticks = 5;
  for (let i = 0; i <= ticks; i++) {
    const v = (ymax / ticks) * i;
    out.push(`<line x1="${m.left}" x2="${m.left + pw}" y1="${y(v).toFixed(1)}" y2="${y(v).toFixed(1)}" stroke="${i ? '#e5e7eb' : '#9ca3af'}"/>`);
    out.push(`<text x="${m.left - 8}" y="${(y(v) + 4).toFixed(1)}" text-anchor="end" fill="#444">${Math.round(v)}</text>`);
  }
  for (const v of xs) {
    out.push(`<line x1="${x(v).toFixed(1)}" x2="${x(v).toFixed(1)}" y1="${m.top + ph}" y2="${m.top + ph + 5}" stroke="#9ca3af"/>`);
    out.push(`<text x="${x(v).toFixed(1)}" y="${m.top + ph + 18}" text-anchor="middle" fill="#444">${v}</text>`);
  }
  out.push(`<text transform="translate(18 ${m.top + ph / 2}) rotate(-90)" text-anchor="middle" fill="#333">redis-server CPU per pair (µs)</text>`);
  out.push(`<text x="${m.left + pw / 2}" y="${m.top + ph + 38}" text-anchor="middle" fill="#333">subscribed processes (idle connections waiting on other keys)</text>`);
  series.forEach((s, i) => {
    const pts = s.points.filter((p) => Number.isFinite(p.y)).sort((a, b) => a.x - b.x);
    out.push(`<polyline fill="none" stroke="${s.color}" stroke-width="2" points="${pts.map((p) => `${x(p.x).toFixed(1)},${y(p.y).toFixed(1)}`).join(' ')}"/>`);
    for (const p of pts) {
      if (Number.isFinite(p.min) && Number.isFinite(p.max)) {
        out.push(`<line x1="${x(p.x).toFixed(1)}" x2="${x(p.x).toFixed(1)}" y1="${y(p.min).toFixed(1)}" y2="${y(p.max).toFixed(1)}" stroke="${s.color}" stroke-width="1"/>`);
      }
      out.push(`<circle cx="${x(p.x).toFixed(1)}" cy="${y(p.y).toFixed(1)}" r="3.5" fill="${s.color}"/>`);
      out.push(`<text x="${(x(p.x) + 6).toFixed(1)}" y="${(y(p.y) - 6).toFixed(1)}" fill="${s.color}" font-size="11">${p.y.toFixed(1)}</text>`);
    }
    const ly = m.top + ph + 60 + i * 18;
    out.push(`<line x1="${m.left}" x2="${m.left + 24}" y1="${ly - 4}" y2="${ly - 4}" stroke="${s.color}" stroke-width="2"/>`);
    out.push(`<text x="${m.left + 32}" y="${ly}" fill="#222">${esc(s.label)}</text>`);
  });
  out.push('</svg>');
  return out.join('\n') + '\n';
}
