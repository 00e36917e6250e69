/**
 * Python-faithful JSON: parse JSON text the way Python's `json.loads` does (key order kept, ints
 * and floats told apart) and print it the way `json.dumps(x, ensure_ascii=False)` does.
 *
 * Why: vLLM renders tool-call arguments and tool schemas with Jinja's `tojson` (Python `json.dumps`)
 * and its hermes parser re-serialises arguments with `json.dumps(..., ensure_ascii=False)`. JS's
 * JSON.parse loses the int/float distinction (`1.0` → `1`) and reorders integer-like keys, so a
 * plain JS round trip would render different bytes than a real vLLM server.
 */

export class PyFloat {
  constructor(readonly value: number) {}
}
export class PyInt {
  /** Digits as written (Python ints are unbounded, so keep the text). */
  constructor(readonly digits: string) {}
}
export class PyDict {
  constructor(readonly entries: [string, PyValue][]) {}
  get(key: string): PyValue | undefined {
    for (let i = this.entries.length - 1; i >= 0; i--) {
      const e = this.entries[i]!;
      if (e[0] === key) return e[1];
    }
    return undefined;
  }
  has(key: string): boolean {
    return this.entries.some((e) => e[0] === key);
  }
}
export type PyValue = null | boolean | string | PyInt | PyFloat | PyDict | PyValue[];

export class PyJsonError extends Error {}

/** Parses JSON text as Python's json.loads would (duplicate keys: the last wins, first position kept). */
export function parsePyJson(text: string): PyValue {
  let i = 0;
  const n = text.length;
  const ws = () => {
    while (i < n) {
      const c = text.charCodeAt(i);
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) i++;
      else break;
    }
  };
  const fail = (msg: string): never => {
    throw new PyJsonError(`${msg} at char ${i}`);
  };
  const str = (): string => {
    // text[i] === '"'
    let out = "";
    i++;
    let start = i;
    for (;;) {
      if (i >= n) fail("Unterminated string");
      const c = text.charCodeAt(i);
      if (c === 0x22) {
        out += text.slice(start, i);
        i++;
        return out;
      }
      if (c === 0x5c) {
        out += text.slice(start, i);
        const e = text[i + 1];
        i += 2;
        switch (e) {
          case '"': out += '"'; break;
          case "\\": out += "\\"; break;
          case "/": out += "/"; break;
          case "b": out += "\b"; break;
          case "f": out += "\f"; break;
          case "n": out += "\n"; break;
          case "r": out += "\r"; break;
          case "t": out += "\t"; break;
          case "u": {
            const hex = text.slice(i, i + 4);
            if (!/^[0-9a-fA-F]{4}$/.test(hex)) fail("Invalid \\uXXXX escape");
            out += String.fromCharCode(parseInt(hex, 16));
            i += 4;
            break;
          }
          default:
            fail("Invalid \\escape");
        }
        start = i;
        continue;
      }
      if (c < 0x20) fail("Invalid control character");
      i++;
    }
  };
  const value = (): PyValue => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      const entries: [string, PyValue][] = [];
      ws();
      if (text[i] === "}") {
        i++;
        return new PyDict(entries);
      }
      for (;;) {
        ws();
        if (text[i] !== '"') fail("Expecting property name enclosed in double quotes");
        const k = str();
        ws();
        if (text[i] !== ":") fail("Expecting ':' delimiter");
        i++;
        const v = value();
        const at = entries.findIndex((e) => e[0] === k);
        if (at >= 0) entries[at] = [k, v];
        else entries.push([k, v]);
        ws();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i] === "}") {
          i++;
          return new PyDict(entries);
        }
        fail("Expecting ',' delimiter");
      }
    }
    if (c === "[") {
      i++;
      const items: PyValue[] = [];
      ws();
      if (text[i] === "]") {
        i++;
        return items;
      }
      for (;;) {
        items.push(value());
        ws();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i] === "]") {
          i++;
          return items;
        }
        fail("Expecting ',' delimiter");
      }
    }
    if (c === '"') return str();
    if (text.startsWith("true", i)) return (i += 4), true;
    if (text.startsWith("false", i)) return (i += 5), false;
    if (text.startsWith("null", i)) return (i += 4), null;
    const m = /^-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i, i + 400));
    if (!m) return fail("Expecting value");
    i += m[0].length;
    if (m[1] === undefined && m[2] === undefined) return new PyInt(m[0] === "-0" ? "0" : m[0]);
    return new PyFloat(Number(m[0]));
  };
  const v = value();
  ws();
  if (i !== n) fail("Extra data");
  return v;
}

/** Python's `repr(float)` (what json.dumps prints for floats). */
export function pyFloatRepr(x: number): string {
  if (Number.isNaN(x)) return "NaN";
  if (x === Infinity) return "Infinity";
  if (x === -Infinity) return "-Infinity";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed for 1e-4 <= |x| < 1e16, else scientific.
  const [mant, expStr] = x.toExponential().split("e") as [string, string];
  const exp = Number(expStr);
  const neg = mant.startsWith("-");
  const digits = mant.replace("-", "").replace(".", "");
  let out: string;
  if (exp >= -4 && exp < 16) {
    if (exp >= digits.length - 1) out = digits + "0".repeat(exp - digits.length + 1) + ".0";
    else if (exp >= 0) out = digits.slice(0, exp + 1) + "." + digits.slice(exp + 1);
    else out = "0." + "0".repeat(-exp - 1) + digits;
  } else {
    const m = digits.length > 1 ? digits[0] + "." + digits.slice(1) : digits;
    out = `${m}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
  }
  return neg ? "-" + out : out;
}

/** A JSON string literal as Python's json.dumps(ensure_ascii=False) writes it. */
export function pyStr(s: string): string {
  // JSON.stringify matches Python here (\" \\ \b \f \n \r \t, other C0 as \u00xx, '/' and non-ASCII
  // kept) except for lone surrogates, which only Python leaves raw; they cannot occur in valid input.
  return JSON.stringify(s);
}

/** Python `json.dumps(value, ensure_ascii=False)` with the default `", "` / `": "` separators. */
export function pyDumps(v: PyValue): string {
  if (v === null) return "null";
  if (v === true) return "true";
  if (v === false) return "false";
  if (typeof v === "string") return pyStr(v);
  if (v instanceof PyInt) return v.digits;
  if (v instanceof PyFloat) return pyFloatRepr(v.value);
  if (v instanceof PyDict) return `{${v.entries.map(([k, x]) => `${pyStr(k)}: ${pyDumps(x)}`).join(", ")}}`;
  return `[${v.map(pyDumps).join(", ")}]`;
}

/** Converts a plain JS value (from JSON.parse) to a PyValue: integral numbers become ints. */
export function fromJs(v: unknown): PyValue {
  if (v === null || v === undefined) return null;
  if (typeof v === "boolean" || typeof v === "string") return v;
  if (typeof v === "number") return Number.isInteger(v) && Math.abs(v) < 2 ** 53 ? new PyInt(String(v)) : new PyFloat(v);
  if (Array.isArray(v)) return v.map(fromJs);
  if (typeof v === "object") return new PyDict(Object.entries(v as Record<string, unknown>).map(([k, x]) => [k, fromJs(x)]));
  return String(v);
}

/** Converts a PyValue to plain JS (for templates and validation); big ints lose precision. */
export function toJs(v: PyValue): unknown {
  if (v instanceof PyInt) return Number(v.digits);
  if (v instanceof PyFloat) return v.value;
  if (v instanceof PyDict) return Object.fromEntries(v.entries.map(([k, x]) => [k, toJs(x)]));
  if (Array.isArray(v)) return v.map(toJs);
  return v;
}

/** `json.dumps(value, ensure_ascii=False, indent=n)`: Python's pretty printer (`,` then newline, `": "`). */
export function pyDumpsIndent(v: PyValue, indent: number, level = 0): string {
  const pad = (l: number) => "\n" + " ".repeat(indent * l);
  if (v instanceof PyDict) {
    if (v.entries.length === 0) return "{}";
    return `{${v.entries.map(([k, x]) => `${pad(level + 1)}${pyStr(k)}: ${pyDumpsIndent(x, indent, level + 1)}`).join(",")}${pad(level)}}`;
  }
  if (Array.isArray(v)) {
    if (v.length === 0) return "[]";
    return `[${v.map((x) => `${pad(level + 1)}${pyDumpsIndent(x, indent, level + 1)}`).join(",")}${pad(level)}]`;
  }
  return pyDumps(v);
}

/** `json.dumps(value, ensure_ascii=False, separators=(",", ":"))`: compact JSON. */
export function pyDumpsCompact(v: PyValue): string {
  if (v instanceof PyDict) return `{${v.entries.map(([k, x]) => `${pyStr(k)}:${pyDumpsCompact(x)}`).join(",")}}`;
  if (Array.isArray(v)) return `[${v.map(pyDumpsCompact).join(",")}]`;
  return pyDumps(v);
}

/** Python's `str(value)` of a parsed JSON value (what Jinja's `| string` prints): True, None, 1.0, {'a': 1}. */
export function pyStrValue(v: PyValue): string {
  if (v === null) return "None";
  if (v === true) return "True";
  if (v === false) return "False";
  if (typeof v === "string") return v;
  if (v instanceof PyInt) return v.digits;
  if (v instanceof PyFloat) return pyFloatRepr(v.value);
  const repr = (x: PyValue): string => (typeof x === "string" ? `'${x.replaceAll("\\", "\\\\").replaceAll("'", "\\'")}'` : pyStrValue(x));
  if (v instanceof PyDict) return `{${v.entries.map(([k, x]) => `${repr(k)}: ${repr(x)}`).join(", ")}}`;
  return `[${v.map(repr).join(", ")}]`;
}
export { stringEnd, valueEnd } from "./extent.js";
