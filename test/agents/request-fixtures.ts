/**
 * From the requests an agent CLI sent in one recorded session to the fixture files the transforms
 * tests replay (pure: record-requests.ts does the I/O).
 *
 * - Kinds: the first request that declares the CLI's shell tool is the `main` turn, the last one
 *   (it carries the shell call's and the read call's results) the `tool-result` turn, and requests
 *   that do not declare it (titles, summaries) are `side-<n>` in the order they came.
 * - The CLIs' own prose (system prompts, tool and parameter descriptions, context they add to the
 *   user's turn) is not ours to publish: each such string becomes REDACTED. Structure, roles, tool
 *   names and schemas, our instruction, the model's turns and the tool results stay as sent.
 * - What one run differs from the next in is replaced deterministically: the session token, the
 *   reasoning seals (re-made with FIXTURE_REASONING_KEY so tests can open them), sandbox paths,
 *   ids (numbered by first appearance), timestamps and timings.
 */
import { hashToken } from "@rollgate/store";
import { geminiThoughtSignature, openReasoning, sealReasoning, signReasoning, verifyReasoning } from "@rollgate/transforms";
import type { AgentProtocol } from "@rollgate/protocol";
import type { RecordedRequest } from "./recording-relay.js";

export const REDACTED = "[the CLI's own text, not reproduced]";
/** The key the fixtures' reasoning seals are made with (the gateway keys them by the session). */
export const FIXTURE_REASONING_KEY = "agent-request-fixtures";
export const TOKEN_PLACEHOLDER = "<session-token>";
/** Where sandbox folders and the link folder appear in the fixtures, whatever the machine's tmpdir. */
export const SANDBOX_PLACEHOLDER = "/tmp/rollgate-sandbox";
export const LINKS_PLACEHOLDER = "/tmp/rollgate-agent-links";

export interface RunFacts {
  cli: string;
  version: string;
  protocol: AgentProtocol;
  /** The task's id: the sandbox folder is `<tmpdir>/rollgate-<task id>-XXXXXX`. */
  taskId: string;
  /** The folder the shell step links the sandbox into (absolute-path read tools). */
  linkDir: string;
  /** Every text of ours holds it: the instruction, the commands, the answer, the read result. */
  word: string;
}

export interface AgentRequestFixture {
  cli: string;
  version: string;
  protocol: AgentProtocol;
  kind: string;
  reasoning_key: string;
  method: string;
  url: string;
  headers: Record<string, string>;
  body: unknown;
}

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

const isObject = (v: unknown): v is Record<string, Json> => typeof v === "object" && v !== null && !Array.isArray(v);

/** The tool names a request body declares, in any of the four protocols. */
export function declaredTools(body: unknown): string[] {
  if (!isObject(body) || !Array.isArray(body.tools)) return [];
  return body.tools.flatMap((t): string[] => {
    if (!isObject(t)) return [];
    if (Array.isArray(t.functionDeclarations)) return t.functionDeclarations.flatMap((d) => (isObject(d) && typeof d.name === "string" ? [d.name] : []));
    if (isObject(t.function) && typeof t.function.name === "string") return [t.function.name];
    return typeof t.name === "string" ? [t.name] : [];
  });
}

/** Names each JSON request of the session by its kind (see the module comment). */
export function requestKinds(requests: readonly RecordedRequest[], shellTool: string): { kind: string; request: RecordedRequest }[] {
  const json = requests.filter((r) => r.method === "POST" && isObject(r.body));
  const turns = json.filter((r) => declaredTools(r.body).includes(shellTool));
  if (turns.length < 2) throw new Error(`expected at least two turns declaring ${shellTool}, got ${turns.length} of ${json.length} requests`);
  const side = json.filter((r) => !turns.includes(r));
  return [
    { kind: "main", request: turns[0]! },
    { kind: "tool-result", request: turns.at(-1)! },
    ...side.map((request, i) => ({ kind: `side-${i + 1}`, request })),
  ];
}

/** The session token the CLI authenticated with (each protocol's own header). */
export function sessionToken(headers: Record<string, string>): string {
  const bearer = /^Bearer (.+)$/i.exec(headers.authorization ?? "");
  const token = bearer?.[1] ?? headers["x-api-key"] ?? headers["x-goog-api-key"];
  if (!token) throw new Error("the request carries no session token");
  return token;
}

/** Reasoning the gateway sealed with the session's key, sealed again with `toKey`; seals it did not make stay. */
export function resealReasoning(value: unknown, fromKey: string, toKey: string): unknown {
  if (Array.isArray(value)) return value.map((v) => resealReasoning(v, fromKey, toKey));
  if (!isObject(value)) return value;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) out[k] = resealReasoning(v, fromKey, toKey);
  // Anthropic: a thinking block's signature is an HMAC of its text.
  if (typeof value.thinking === "string" && typeof value.signature === "string" && verifyReasoning(fromKey, value.thinking, value.signature)) {
    out.signature = signReasoning(toKey, value.thinking);
  }
  // Responses: encrypted_content is the reasoning itself, sealed.
  if (typeof value.encrypted_content === "string") {
    const text = openReasoning(fromKey, value.encrypted_content);
    if (text !== null) out.encrypted_content = sealReasoning(toKey, text);
  }
  // Gemini: the same seal, in standard base64.
  if (typeof value.thoughtSignature === "string") {
    const text = openReasoning(fromKey, value.thoughtSignature);
    if (text !== null) out.thoughtSignature = geminiThoughtSignature(toKey, text);
  }
  return out;
}

const TEXT_KEYS = new Set(["text", "content", "system", "instructions"]);
/** Top-level fields that hold the system prompt. */
const SYSTEM_FIELDS = new Set(["system", "instructions", "systemInstruction"]);
/** Blocks whose text is a tool's output: written by running our commands, kept. */
const RESULT_TYPES = new Set(["tool_result", "function_call_output"]);

interface Where {
  role: string | null;
  system: boolean;
  tools: boolean;
  result: boolean;
}

/** Replaces the CLI's own prose by REDACTED; `ours` tells which user texts are the task's. */
export function redactCliText(body: unknown, ours: (text: string) => boolean): unknown {
  const walk = (v: unknown, key: string, w: Where): unknown => {
    if (typeof v === "string") {
      if (w.tools) return key === "description" ? REDACTED : v;
      if (!TEXT_KEYS.has(key) || w.result) return v;
      if (w.system || w.role === "system" || w.role === "developer") return REDACTED;
      if (w.role === "user" && !ours(v)) return REDACTED;
      return v;
    }
    if (Array.isArray(v)) return v.map((x) => walk(x, key, w));
    if (!isObject(v)) return v;
    const here: Where = {
      ...w,
      role: typeof v.role === "string" ? v.role : w.role,
      result: w.result || (typeof v.type === "string" && RESULT_TYPES.has(v.type)),
    };
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) {
      const inner = k === "functionResponse" ? { ...here, result: true } : here;
      out[k] = walk(x, k, inner);
    }
    return out;
  };
  if (!isObject(body)) return body;
  const top: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(body)) {
    top[k] = walk(v, k, { role: null, system: SYSTEM_FIELDS.has(k), tools: k === "tools", result: false });
  }
  return top;
}

const escape = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

/**
 * Replaces what differs from one run to the next in every string of `value`. `ids` numbers each
 * distinct id by first appearance; pass the same map for one file's headers and body.
 */
export function scrubRunSpecific(value: unknown, facts: RunFacts & { token: string }, ids: Map<string, string>): unknown {
  const number = (id: string, make: (n: number) => string) => {
    let out = ids.get(id);
    if (!out) {
      out = make(ids.size + 1);
      ids.set(id, out);
    }
    return out;
  };
  const pad = (n: number, width: number) => String(n).padStart(width, "0");
  const rules: [RegExp, (m: string, ...g: string[]) => string][] = [
    [new RegExp(escape(facts.token), "g"), () => TOKEN_PLACEHOLDER],
    [new RegExp(escape(hashToken(facts.token)), "g"), () => "<session-token-hash>"],
    // Sandbox folders, under whatever tmpdir the machine has.
    [new RegExp(`(?:/[^/\\s"'\`]+)*/rollgate-${escape(facts.taskId.slice(0, 40))}-[A-Za-z0-9]{6}`, "g"), () => SANDBOX_PLACEHOLDER],
    [new RegExp(escape(facts.linkDir), "g"), () => LINKS_PLACEHOLDER],
    [/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/gi, (m) => number(m, (n) => `00000000-0000-0000-0000-${pad(n, 12)}`)],
    // Hex ids and digests (tool call ids, response ids, device ids), kept at their length.
    [/(?<![0-9a-zA-Z])[0-9a-f]{16,}(?![0-9a-zA-Z])/g, (m) => number(m, (n) => pad(n, m.length))],
    // opencode's ascending ids: prefix, 12 hex digits of time, 14 random characters.
    [/\b([a-z]{3,4})_[0-9a-f]{12}[0-9A-Za-z]{14}\b/g, (m, p: string) => number(m, (n) => `${p}_${pad(n, 26)}`)],
    // Unix milliseconds (2020 to 2060).
    [/\b1[5-9]\d{11}\b|\b2[0-8]\d{11}\b/g, () => "1700000000000"],
    // Shell tool outputs: Codex's random chunk id and wall time, the process group Gemini CLI and Qwen Code report.
    [/Chunk ID: [0-9a-f]+/g, () => "Chunk ID: 000000"],
    [/Wall time: [\d.]+ seconds/g, () => "Wall time: 0.0000 seconds"],
    [/Process Group PGID: \d+/g, () => "Process Group PGID: 1000"],
  ];
  const scrub = (s: string) => rules.reduce((acc, [re, fn]) => acc.replace(re, fn as (m: string) => string), s);
  const walk = (v: unknown): unknown => {
    if (typeof v === "string") return scrub(v);
    if (Array.isArray(v)) return v.map(walk);
    if (isObject(v)) return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, walk(x)]));
    return v;
  };
  return walk(value);
}

/** Maps a CLI builds from a hash map, so their key order changes from run to run (Codex). */
const UNORDERED_FIELDS = new Set(["client_metadata"]);

function sortUnordered(body: unknown): unknown {
  if (!isObject(body)) return body;
  return Object.fromEntries(
    Object.entries(body).map(([k, v]) => [k, UNORDERED_FIELDS.has(k) && isObject(v) ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => a.localeCompare(b))) : v]),
  );
}

/** Headers that say how a CLI talks, not how the connection went. */
const TRANSPORT_HEADERS = new Set(["host", "connection", "content-length", "accept-encoding", "keep-alive", "transfer-encoding"]);

/** One fixture file: the request as the CLI sent it, kind named, CLI prose redacted, run specifics scrubbed. */
export function toFixture(kind: string, request: RecordedRequest, facts: RunFacts): AgentRequestFixture {
  const token = sessionToken(request.headers);
  const headers = Object.fromEntries(Object.entries(request.headers).filter(([k]) => !TRANSPORT_HEADERS.has(k)).sort(([a], [b]) => a.localeCompare(b)));
  const resealed = resealReasoning(request.body, hashToken(token), FIXTURE_REASONING_KEY);
  const redacted = redactCliText(resealed, (text) => text.includes(facts.word));
  const ids = new Map<string, string>();
  const scrubbedHeaders = scrubRunSpecific(headers, { ...facts, token }, ids) as Record<string, string>;
  return {
    cli: facts.cli,
    version: facts.version,
    protocol: facts.protocol,
    kind,
    reasoning_key: FIXTURE_REASONING_KEY,
    method: request.method,
    url: request.url,
    headers: scrubbedHeaders,
    body: sortUnordered(scrubRunSpecific(redacted, { ...facts, token }, ids)),
  };
}
