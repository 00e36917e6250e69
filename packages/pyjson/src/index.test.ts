/**
 * The codec against the reference: random JSON documents parsed and printed here and by the
 * machine's python3 (`json.loads` then `json.dumps` with ensure_ascii=False, indent=2, compact
 * separators, and `str()`), byte for byte. engine-sim and the gateway's parsers both print with
 * this one codec; checking it against Python keeps it from agreeing with itself.
 */
import { execFileSync } from "node:child_process";
import { seededRandom } from "@rollgate/testkit";
import { describe, expect, it } from "vitest";
import { parsePyJson, pyDumps, pyDumpsCompact, pyDumpsIndent, pyStrValue } from "./index.js";

const NUMBERS = ["0", "-0", "1", "-17", "123456789012345678901234567890", "1.0", "0.1", "-2.5", "1e-05", "1E5", "1.5e300", "1e16", "12345678901234567.0", "0.0001", "3.141592653589793", "-0.0", "2e-7", "1.7976931348623157e308"];
const STRINGS = ["", "a", "héllo wörld", "tab\there", "quote \" and \\ back", "line\nbreak", "ctl \u0001\u001f", "emoji 😀", "日本語", "slash /", "it's", "</tool_call>", "\u2028sep"];

function gen(r: () => number, depth: number): string {
  const pick = <T>(xs: readonly T[]) => xs[Math.floor(r() * xs.length)]!;
  const k = r();
  if (depth > 3 || k < 0.35) {
    const leaf = r();
    if (leaf < 0.4) return pick(NUMBERS);
    if (leaf < 0.8) return JSON.stringify(pick(STRINGS));
    return pick(["true", "false", "null"]);
  }
  const n = Math.floor(r() * 4);
  if (k < 0.65) return `[${Array.from({ length: n }, () => gen(r, depth + 1)).join(r() < 0.5 ? "," : ", ")}]`;
  // Integer-like keys too: JS objects would reorder them, Python keeps insertion order.
  const keys = [...new Set(Array.from({ length: n }, () => pick(["b", "a", "10", "2", "z", "ключ", "sp ace"])))];
  return `{${keys.map((key) => `${JSON.stringify(key)}:${r() < 0.5 ? " " : ""}${gen(r, depth + 1)}`).join(",")}}`;
}

const PYTHON = `
import json, sys
out = []
for text in json.load(sys.stdin):
    v = json.loads(text)
    out.append([json.dumps(v, ensure_ascii=False), json.dumps(v, ensure_ascii=False, indent=2), json.dumps(v, ensure_ascii=False, separators=(",", ":")), str(v) if isinstance(v, str) else None])
json.dump(out, sys.stdout)
`;

describe("pyjson against python3's json module", () => {
  it("prints 400 random documents exactly as json.dumps does (default, indent=2, compact separators)", () => {
    const r = seededRandom(20261126); // a failure names a reproducible document
    const docs = Array.from({ length: 400 }, () => gen(r, 0));
    const python = JSON.parse(execFileSync("python3", ["-c", PYTHON], { input: JSON.stringify(docs), encoding: "utf8" })) as [string, string, string, string | null][];
    docs.forEach((text, i) => {
      const v = parsePyJson(text);
      const [dumps, indented, compact, str] = python[i]!;
      expect(pyDumps(v), text).toBe(dumps);
      expect(pyDumpsIndent(v, 2), text).toBe(indented);
      expect(pyDumpsCompact(v), text).toBe(compact);
      if (str !== null) expect(pyStrValue(v), text).toBe(str);
    });
  });
});
