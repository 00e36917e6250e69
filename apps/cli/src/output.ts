import { RollgateClient, RollgateError } from "@rollgate/client";
import type { Values } from "./framework.js";

/** Exit codes (documented in `rollgate --help`). */
export const EXIT = {
  ok: 0,
  /** The operation ran but its outcome is a failure (a task failed, a stream ended early). */
  failed: 1,
  usage: 2,
  /** Nothing answered at the gateway URL. */
  unreachable: 3,
  /** The gateway answered with an error (4xx/5xx). */
  api: 4,
} as const;

/** Indented JSON with arrays of numbers (token ids, logprobs, masks) kept on one line each. */
export function prettyJson(value: unknown): string {
  return JSON.stringify(value, null, 2).replace(/\[\s*(-?[\d.eE+-]+(?:,\s*-?[\d.eE+-]+)*)\s*\]/g, (_m, inner: string) => `[${inner.replace(/\s+/g, "")}]`);
}

/**
 * Text an agent (or its grader) wrote, made safe to print on the operator's terminal: control
 * characters other than newline and tab are shown as their Unicode pictures (ESC as ␛), so the
 * agent's escape sequences (erasing the lines above, setting the title, writing the clipboard with
 * OSC 52) are seen, not played. A carriage return ends a line, as a progress bar's redraws would
 * read in a file.
 */
export function printable(text: string): string {
  // eslint-disable-next-line no-control-regex
  return text.replace(/\r\n?/g, "\n").replace(/[\x00-\x08\x0b-\x1f\x7f-\x9f]/g, (c) => {
    const code = c.charCodeAt(0);
    return code < 0x20 ? String.fromCharCode(0x2400 + code) : code === 0x7f ? "\u2421" : "\ufffd";
  });
}

/** `text` cut to at most `max` characters with an ellipsis, never through the middle of one (an emoji is two UTF-16 units). */
export function clip(text: string, max: number): string {
  const chars = Array.from(text);
  return chars.length > max ? `${chars.slice(0, max - 1).join("")}…` : text;
}

export const DEFAULT_URL = "http://127.0.0.1:8080";

/** Colours only on a terminal, never with NO_COLOR or --no-color. */
export function makeStyle(enabled: boolean) {
  const wrap = (open: number, close: number) => (s: string | number) => (enabled ? `\x1b[${open}m${s}\x1b[${close}m` : String(s));
  return {
    enabled,
    bold: wrap(1, 22),
    dim: wrap(2, 22),
    red: wrap(31, 39),
    green: wrap(32, 39),
    yellow: wrap(33, 39),
    blue: wrap(34, 39),
    magenta: wrap(35, 39),
    cyan: wrap(36, 39),
    gray: wrap(90, 39),
    inverse: wrap(7, 27),
  };
}
export type Style = ReturnType<typeof makeStyle>;

export interface Context {
  url: string;
  apiKey: string | undefined;
  json: boolean;
  /** Colours on stdout. */
  style: Style;
  /** Colours on stderr. */
  errStyle: Style;
  client: RollgateClient;
  out: (line?: string) => void;
  err: (line?: string) => void;
  /** Prints a value as JSON (one document, pretty unless `compact`). */
  printJson: (value: unknown, compact?: boolean) => void;
}

export function makeContext(values: Values): Context {
  const url = String(values.url ?? process.env.ROLLGATE_URL ?? DEFAULT_URL);
  const apiKey = (values["api-key"] as string | undefined) || process.env.ROLLGATE_API_KEY || undefined;
  const colorWanted = values.color !== false && !process.env.NO_COLOR;
  const style = makeStyle(colorWanted && process.stdout.isTTY === true);
  const errStyle = makeStyle(colorWanted && process.stderr.isTTY === true);
  let client: RollgateClient | undefined;
  return {
    url,
    apiKey,
    json: values.json === true,
    style,
    errStyle,
    get client() {
      client ??= new RollgateClient({ baseUrl: url, ...(apiKey ? { apiKey } : {}) });
      return client;
    },
    out: (line = "") => void process.stdout.write(`${line}\n`),
    err: (line = "") => void process.stderr.write(`${line}\n`),
    printJson: (value, compact = false) => void process.stdout.write(`${compact ? JSON.stringify(value) : prettyJson(value)}\n`),
  };
}

/** Prints an error the way a user can act on it, and returns the exit code for it. */
export function reportError(ctx: Pick<Context, "json" | "err" | "errStyle" | "url" | "printJson">, err: unknown): number {
  const s = ctx.errStyle;
  if (err instanceof RollgateError) {
    if (ctx.json) ctx.printJson(err.toJSON());
    if (err.unreachable && err.type === "unreachable") {
      ctx.err(`${s.red("rollgate:")} ${err.message}`);
      ctx.err(`  Is the gateway running? Start one with ${s.bold("rollgate up")}, or point at another with --url / ROLLGATE_URL.`);
      return EXIT.unreachable;
    }
    ctx.err(`${s.red("rollgate:")} ${err.status ? `${err.status} ` : ""}${err.type}: ${err.message}`);
    if (Array.isArray(err.details)) {
      for (const d of err.details as { path?: string; message?: string }[]) {
        ctx.err(`  ${d.path ?? ""}${d.path ? ": " : ""}${d.message ?? JSON.stringify(d)}`);
      }
    } else if (err.details !== undefined) {
      ctx.err(`  ${JSON.stringify(err.details)}`);
    }
    if (err.status === 401) ctx.err("  The gateway needs an API key: pass --api-key or set ROLLGATE_API_KEY.");
    // Any answer from the server that is not the call's success (a 4xx/5xx, or a 2xx that is not
    // the gateway's JSON: another server at this URL) is a gateway error.
    return err.status > 0 ? EXIT.api : EXIT.failed;
  }
  const message = err instanceof Error ? err.message : String(err);
  if (ctx.json) ctx.printJson({ error: { type: "cli_error", message } });
  ctx.err(`${s.red("rollgate:")} ${message}`);
  return EXIT.failed;
}

export const fmt = {
  reward: (r: number | null | undefined) => (r === null || r === undefined ? "–" : r.toFixed(3)),
  ms: (ms: number | null | undefined) => {
    if (ms === null || ms === undefined) return "–";
    if (ms < 1000) return `${Math.round(ms)}ms`;
    if (ms < 60_000) return `${(ms / 1000).toFixed(1)}s`;
    return `${Math.floor(ms / 60_000)}m${String(Math.round((ms % 60_000) / 1000)).padStart(2, "0")}s`;
  },
  int: (n: number | null | undefined) => (n === null || n === undefined ? "–" : n.toLocaleString("en-US")),
  time: (iso: string | null | undefined) => (iso ? new Date(iso).toISOString().slice(11, 19) : "–"),
};

/** Colours a task status. */
export function statusColor(s: Style, status: string): string {
  switch (status) {
    case "completed":
      return s.green(status);
    case "failed":
    case "timed_out":
      return s.red(status);
    case "running":
      return s.cyan(status);
    case "queued":
      return s.yellow(status);
    default:
      return s.gray(status);
  }
}
