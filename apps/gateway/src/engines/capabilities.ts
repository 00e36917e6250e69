import type { ModelProfile } from "@rollgate/models";
import { request, type Dispatcher } from "undici";
import { z } from "zod";
import { engineTokenizer, type TokenizeCall } from "./tokenizer.js";
import type { ChatPromptField } from "./call.js";
import type { EngineConfig } from "../env.js";

/**
 * What an engine can do for the gateway beyond its chat route, found out once per engine:
 *
 * - its version (vLLM `GET /version`, SGLang `GET /server_info`);
 * - whether its chat route takes a pre-tokenised prompt, and in which field. Probed, not assumed
 *   from the version: servers ignore unknown fields, so the probe sends ids that differ from what
 *   the messages render and checks the prompt ids the engine answers with;
 * - (SGLang) whether its `/separate_reasoning` and `/parse_function_call` routes answer, so
 *   `/generate` output can be parsed by SGLang's own parsers;
 * - (SGLang) whether its streamed chat tells the prompt's and the answer's ids (PR #34488's
 *   response-level `sglext` chunk), so a streamed agent call is streamed from the engine;
 * - how an abort-mode pause is carried out on it (see `pausePlan`).
 */

/** vLLM's `/pause?mode=keep` (PR #32351, in the release after Jan 2026): in-flight requests freeze and resume. */
export const VLLM_KEEP_PAUSE_SINCE = "0.16.0";

export interface EngineCapabilities {
  version: string | null;
  /** The chat route's pre-tokenised prompt field this engine honours, or null. */
  chatPromptField: ChatPromptField | null;
  /** SGLang: its `/separate_reasoning` and `/parse_function_call` routes answer (its parsers on any text). */
  parseRoutes: boolean;
  /** SGLang: its streamed chat ends with PR #34488's `sglext` ids (input_ids, output_ids). Absent for vLLM. */
  streamedIds?: boolean;
}

/**
 * How the gateway carries out an abort-mode pause on one engine:
 * - `keep` (vLLM with `/pause?mode=keep`) / `in_place` (SGLang whose parse routes answer): the
 *   engine freezes in-flight requests and resumes them on the new weights; the gateway marks, from
 *   its own stream of each answer, which tokens came after the change. On SGLang whose chat stream
 *   carries the ids (`streamedIds`) that stream is read (every token's logprob comes with its step,
 *   the ids at the end); on an older one every call goes through `/generate` (its chat stream has
 *   no ids, and drops the logprobs of tokens its tool parser swallows) and the answer is parsed by
 *   SGLang's own parsers through its parse routes.
 * - `abort_continue`: the engine cuts them; after resume the gateway continues each one token-in and
 *   parses the whole answer with the gateway parser the model profile declares.
 * - `drain`: neither is possible: in-flight calls finish on the old weights before the engine pauses,
 *   as in a drain-mode pause.
 */
export type AbortPauseMode = "keep" | "in_place" | "abort_continue" | "drain";

/** Whether an SGLang engine can serve every call through /generate read by its own parse routes. */
export function sglangReadsGenerate(caps: EngineCapabilities, profile: ModelProfile): boolean {
  return caps.parseRoutes && profile.engine_parsers.sglang.tool_call_parser !== null;
}

export function pausePlan(kind: EngineConfig["kind"], caps: EngineCapabilities, profile: ModelProfile): { mode: AbortPauseMode; why: string } {
  if (kind === "vllm" && caps.version !== null && atLeast(caps.version, VLLM_KEEP_PAUSE_SINCE)) {
    return { mode: "keep", why: `vLLM ${caps.version} has /pause?mode=keep` };
  }
  if (kind === "sglang" && sglangReadsGenerate(caps, profile)) {
    const parser = profile.engine_parsers.sglang.tool_call_parser;
    if (caps.streamedIds) return { mode: "in_place", why: `SGLang pauses in place; calls are read from its chat stream, which carries the ids, and its own ${parser} parser reads them` };
    return { mode: "in_place", why: `SGLang pauses in place; calls go through /generate and its own ${parser} parser reads them` };
  }
  if (profile.gateway_parser) {
    return { mode: "abort_continue", why: `no freeze-in-place pause the gateway can follow here; the ${profile.name} profile's ${profile.gateway_parser} parser parses continued answers` };
  }
  return { mode: "drain", why: `no freeze-in-place pause the gateway can follow here and the ${profile.name} profile declares no gateway parser: in-flight calls finish on the old weights` };
}

/** The numeric release of a version string: "0.28.1.dev3+gabc" → [0, 28, 1]; null when it is not one. */
export function releaseOf(version: string): [number, number, number] | null {
  const m = /^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?/.exec(version.trim());
  return m ? [Number(m[1]), Number(m[2] ?? 0), Number(m[3] ?? 0)] : null;
}

export function atLeast(version: string, min: string): boolean {
  const a = releaseOf(version);
  const b = releaseOf(min)!;
  if (!a) return false;
  for (let i = 0; i < 3; i++) if (a[i] !== b[i]) return a[i]! > b[i]!;
  return true;
}

const VllmVersion = z.object({ version: z.string() });
const SglangServerInfo = z.object({ version: z.string() }).loose();

async function getJson(dispatcher: Dispatcher, url: string): Promise<unknown> {
  const res = await request(url, { dispatcher, headersTimeout: 10_000, bodyTimeout: 10_000 });
  const text = await res.body.text();
  if (res.statusCode !== 200) throw new Error(`GET ${url} answered ${res.statusCode}`);
  return JSON.parse(text) as unknown;
}

async function postJson(call: TokenizeCall, path: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; text: string }> {
  const res = await request(`${call.target.engine.url}${path}`, {
    method: "POST",
    dispatcher: call.dispatcher,
    signal: call.signal,
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
    headersTimeout: 30_000,
    bodyTimeout: 30_000,
  });
  return { status: res.statusCode, text: await res.body.text() };
}

/** The engine's release (vLLM `GET /version`, SGLang `GET /server_info`), or null when it cannot say. */
export async function engineVersion(dispatcher: Dispatcher, engine: EngineConfig): Promise<string | null> {
  try {
    if (engine.kind === "vllm") return VllmVersion.parse(await getJson(dispatcher, `${engine.url}/version`)).version;
    return SglangServerInfo.parse(await getJson(dispatcher, `${engine.url}/server_info`)).version;
  } catch {
    return null;
  }
}

const ProbeAnswer = z
  .object({
    prompt_token_ids: z.array(z.number().int()).nullish(),
    choices: z.array(z.object({ prompt_token_ids: z.array(z.number().int()).nullish() }).loose()).nullish(),
    sglext: z.object({ input_ids: z.array(z.number().int()).nullish() }).loose().nullish(),
  })
  .loose();

const sameIds = (a: readonly number[] | null | undefined, b: readonly number[]) => !!a && a.length === b.length && a.every((x, i) => x === b[i]);

/**
 * The chat route's pre-tokenised prompt field, if any: a one-token generation whose messages say one
 * thing while the ids say another; the field works when the engine's prompt ids are the ids sent.
 */
async function probeChatPromptField(call: TokenizeCall): Promise<ChatPromptField | null> {
  const kind = call.target.engine.kind;
  const ids = (await engineTokenizer.renderChat(call, [{ role: "user", content: "rollgate token-in probe: these ids" }])).ids;
  const fields: ChatPromptField[] = kind === "vllm" ? ["prompt_token_ids", "kv_transfer_params"] : ["input_ids"];
  for (const field of fields) {
    const body: Record<string, unknown> = {
      model: call.model,
      messages: [{ role: "user", content: "rollgate token-in probe: these messages" }],
      max_tokens: 1,
      logprobs: true,
      return_token_ids: true,
      ...(kind === "sglang" ? { return_prompt_token_ids: true, return_input_ids: true, routed_dp_rank: call.target.dpRank } : {}),
      ...(field === "kv_transfer_params" ? { kv_transfer_params: { prompt_token_ids: ids } } : { [field]: ids }),
    };
    const res = await postJson(call, "/v1/chat/completions", body, { "x-data-parallel-rank": String(call.target.dpRank) });
    if (res.status !== 200) continue;
    const a = ProbeAnswer.safeParse(JSON.parse(res.text));
    if (!a.success) continue;
    const got = a.data.prompt_token_ids ?? a.data.choices?.[0]?.prompt_token_ids ?? a.data.sglext?.input_ids;
    if (sameIds(got, ids)) return field;
  }
  return null;
}

/** SGLang: whether its parse routes answer (an empty text, the profile's parser names or SGLang's defaults). */
async function probeParseRoutes(call: TokenizeCall): Promise<boolean> {
  const names = call.target.profile.engine_parsers.sglang;
  const [reasoning, calls] = await Promise.all([
    postJson(call, "/separate_reasoning", { text: "", reasoning_parser: names.reasoning_parser ?? "qwen3" }),
    postJson(call, "/parse_function_call", { text: "", tools: [], ...(names.tool_call_parser ? { tool_call_parser: names.tool_call_parser } : {}) }),
  ]);
  return reasoning.status === 200 && calls.status === 200;
}

/** SGLang: whether a streamed chat asked for PR #34488's ids ends with them (a one-token generation). */
async function probeStreamedIds(call: TokenizeCall): Promise<boolean> {
  const res = await postJson(
    call,
    "/v1/chat/completions",
    {
      model: call.model,
      messages: [{ role: "user", content: "rollgate streamed ids probe" }],
      max_tokens: 1,
      stream: true,
      logprobs: true,
      return_input_ids: true,
      return_output_ids: true,
      routed_dp_rank: call.target.dpRank,
    },
    { "x-data-parallel-rank": String(call.target.dpRank) },
  );
  if (res.status !== 200) return false;
  for (const line of res.text.split("\n")) {
    if (!line.startsWith("data:") || !line.includes("sglext")) continue;
    try {
      const ext = (JSON.parse(line.slice(5)) as { sglext?: { input_ids?: unknown; output_ids?: unknown } }).sglext;
      if (Array.isArray(ext?.input_ids) && Array.isArray(ext.output_ids) && Array.isArray(ext.output_ids[0])) return true;
    } catch {
      // not JSON: not the chunk looked for
    }
  }
  return false;
}

/** Probes one engine (on the call's rank). Generations are one token long. */
export async function probeCapabilities(call: TokenizeCall): Promise<EngineCapabilities> {
  const engine = call.target.engine;
  const sglang = engine.kind === "sglang";
  const [version, chatPromptField, parseRoutes, streamedIds] = await Promise.all([
    engineVersion(call.dispatcher, engine),
    probeChatPromptField(call),
    sglang ? probeParseRoutes(call).catch(() => false) : Promise.resolve(false),
    sglang ? probeStreamedIds(call).catch(() => false) : Promise.resolve(false),
  ]);
  return { version, chatPromptField, parseRoutes, ...(sglang ? { streamedIds } : {}) };
}
