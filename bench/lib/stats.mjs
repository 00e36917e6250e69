/** Small statistics and table helpers shared by the benchmarks. */

export function percentile(values, p) {
  if (values.length === 0) return NaN;
  const sorted = Float64Array.from(values).sort();
  const idx = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[idx];
}

export const median = (values) => {
  if (values.length === 0) return NaN;
  const s = [...values].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

export const mean = (values) => (values.length === 0 ? NaN : values.reduce((a, b) => a + b, 0) / values.length);

/** Rounds for display (and for the JSON results, which stay small and readable). */
export function round(x, digits = 2) {
  if (typeof x !== "number" || !Number.isFinite(x)) return x;
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/** Prints an aligned text table: `rows` are arrays of cells. */
export function printTable(title, header, rows) {
  const cells = [header, ...rows].map((r) => r.map((c) => (c === null || c === undefined ? "—" : String(c))));
  const widths = header.map((_, i) => Math.max(...cells.map((r) => r[i]?.length ?? 0)));
  const line = (r) => r.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join("  ");
  const out = [`\n## ${title}`, line(cells[0]), widths.map((w) => "-".repeat(w)).join("  "), ...cells.slice(1).map(line)];
  console.log(out.join("\n"));
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
