/** Small statistics and table helpers shared by the benchmarks. */

/**
 * @param {readonly number[]} values
 * @param {number} p 0–100
 */
export function percentile(values, p) {
  if (values.length === 0) return NaN;
  const sorted = Float64Array.from(values).sort();
  const idx = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[idx];
}

/** @param {readonly number[]} values */
export const median = (values) => {
  if (values.length === 0) return NaN;
  const s = [...values].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

/** @param {readonly number[]} values */
export const mean = (values) => (values.length === 0 ? NaN : values.reduce((a, b) => a + b, 0) / values.length);

/** Rounds for display (and for the JSON results, which stay small and readable). */
/**
 * @template T
 * @param {T} x
 * @returns {T}
 */
export function round(x, digits = 2) {
  if (typeof x !== "number" || !Number.isFinite(x)) return x;
  const f = 10 ** digits;
  return /** @type {T} */ (Math.round(x * f) / f);
}

/**
 * Prints an aligned text table: `rows` are arrays of cells.
 * @param {string} title
 * @param {readonly string[]} header
 * @param {readonly (readonly unknown[])[]} rows
 */
export function printTable(title, header, rows) {
  const cells = [header, ...rows].map((r) => r.map((c) => (c === null || c === undefined ? "—" : String(c))));
  const widths = header.map((_, i) => Math.max(...cells.map((r) => r[i]?.length ?? 0)));
  const line = (/** @type {string[]} */ r) => r.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join("  ");
  const out = [`\n## ${title}`, line(cells[0]), widths.map((w) => "-".repeat(w)).join("  "), ...cells.slice(1).map(line)];
  console.log(out.join("\n"));
}

/** @param {number} ms */
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
