#!/usr/bin/env node
// Renders the model family × agent matrix and the families' preflight as Markdown, from what the
// suites measured (test/artifacts/matrix: cells/*.json written by test/e2e/families.test.ts and
// test/e2e-agents/agent-clis.test.ts, preflight/*.json by test/e2e/families.test.ts).
//   node test/matrix/render.mjs           print both tables
//   node test/matrix/render.mjs --write   replace them in README.md, between their marker comments
// Plain JavaScript so it runs without a build.
import { existsSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const DIR = path.join(ROOT, "test", "artifacts", "matrix");

/** Rows and columns, in the order engine-sim and the agent suite name them. */
const FAMILIES = [
  ["qwen3", "Qwen3"],
  ["qwen3-coder", "Qwen3-Coder"],
  ["llama3.1", "Llama 3.1"],
  ["deepseek-v3", "DeepSeek-V3"],
  ["deepseek-v3.1", "DeepSeek-V3.1"],
  ["gpt-oss", "gpt-oss"],
];
const AGENTS = [
  ["example-agent", "example agent"],
  ["claude-code", "Claude Code"],
  ["codex", "Codex"],
  ["gemini-cli", "Gemini CLI"],
  ["qwen-code", "Qwen Code"],
  ["opencode", "opencode"],
  ["pi", "pi"],
];

const readJson = (sub) => {
  const dir = path.join(DIR, sub);
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((f) => f.endsWith(".json"))
    .sort()
    .map((f) => JSON.parse(readFileSync(path.join(dir, f), "utf8")));
};

const range = (values) => {
  const lo = Math.min(...values);
  const hi = Math.max(...values);
  return lo === hi ? `${lo}` : `${lo}–${hi}`;
};

/** One cell of the matrix: every measured run of an agent on a family, summed up. */
function cellText(runs) {
  if (runs.length === 0) return "not run";
  const failed = runs.filter((r) => !r.passed);
  if (failed.length > 0) return `**failed** (${failed.length}/${runs.length}): ${failed[0].error ?? "see the suite"}`.replaceAll("|", "\\|");
  const traces = runs.map((r) => r.traces);
  const reasons = [...new Set(runs.flatMap((r) => r.breaks))];
  const exact = runs.every((r) => r.exact === true) ? "exact" : "**not exact**";
  const protocols = [...new Set(runs.map((r) => r.protocol))];
  const parts = [`${range(traces)} trace${Math.max(...traces) === 1 ? "" : "s"}`, exact];
  if (reasons.length > 0) parts.push(`breaks: ${reasons.join(", ")}`);
  const runsNote = runs.length > 1 ? `, ${runs.length} runs` : "";
  return `${parts.join(" · ")} (${protocols.join(", ")}${runsNote})`;
}

export function renderMatrix(cells) {
  const head = `| family | ${AGENTS.map(([, name]) => name).join(" | ")} |`;
  const rule = `| --- | ${AGENTS.map(() => "---").join(" | ")} |`;
  const rows = FAMILIES.map(([family, name]) => `| ${name} | ${AGENTS.map(([agent]) => cellText(cells.filter((c) => c.family === family && c.agent === agent))).join(" | ")} |`);
  const dates = cells.map((c) => c.measured_at.slice(0, 10)).sort();
  const when = dates.length > 0 ? `Measured ${dates[0] === dates.at(-1) ? dates[0] : `${dates[0]} to ${dates.at(-1)}`}.` : "Nothing measured yet.";
  return [head, rule, ...rows, "", when].join("\n");
}

const code = (s) => `\`${s}\``;
const yesNo = (b) => (b === null ? "unknown" : b ? "yes" : "no");

function preflightRow(p) {
  const family = FAMILIES.find(([f]) => f === p.family)?.[1] ?? p.family;
  const tokenIn = p.token_in.available ? `${code(p.token_in.route)}, turns end with ${code(p.token_in.end_of_turn)}` : `off: ${p.token_in.why}`;
  const tool = p.tool_turn.round_trips ? `yes${p.tool_turn.form && p.tool_turn.form !== "as_generated" ? ` (sent as ${p.tool_turn.form})` : ""}` : `${yesNo(p.tool_turn.round_trips)}: ${p.tool_turn.detail}`;
  const reasoning = `${yesNo(p.reasoning.dropped_at_user_turn)}: ${p.reasoning.detail}`;
  const pause = `${p.pause.abort_mode ?? "unknown"} (${p.pause.why})`;
  const cells = [family, `${p.kind} ${p.version ?? ""}`.trim(), code(p.profile), p.vocab_size?.toLocaleString("en-US") ?? "unbounded", tokenIn, tool, reasoning, pause];
  return `| ${cells.map((c) => String(c).replaceAll("\n", " ").replaceAll("|", "\\|")).join(" | ")} |`;
}

export function renderPreflight(preflights) {
  const order = (p) => FAMILIES.findIndex(([f]) => f === p.family) * 2 + (p.kind === "vllm" ? 0 : 1);
  const rows = [...preflights].sort((a, b) => order(a) - order(b)).map(preflightRow);
  if (rows.length === 0) return "Nothing measured yet: run test/e2e/families.test.ts.";
  return [
    "| family | server | profile | vocabulary | token-in | tool turn re-renders to its ids | reasoning dropped at a new user turn | abort pause |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ...rows,
  ].join("\n");
}

/** Replaces the text between `<!-- NAME:begin -->` and `<!-- NAME:end -->`. */
function replaceBetween(text, name, body) {
  const begin = `<!-- ${name}:begin -->`;
  const end = `<!-- ${name}:end -->`;
  const i = text.indexOf(begin);
  const j = text.indexOf(end);
  if (i < 0 || j < i) throw new Error(`README.md has no ${begin} … ${end} markers`);
  return `${text.slice(0, i + begin.length)}\n${body}\n${text.slice(j)}`;
}

const matrix = renderMatrix(readJson("cells"));
const preflight = renderPreflight(readJson("preflight"));
if (process.argv.includes("--write")) {
  const readme = path.join(ROOT, "README.md");
  writeFileSync(readme, replaceBetween(replaceBetween(readFileSync(readme, "utf8"), "matrix", matrix), "preflight", preflight));
  console.log("README.md: matrix and preflight tables rewritten");
} else {
  console.log(`${matrix}\n\n${preflight}`);
}
