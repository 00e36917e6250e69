import { expect } from "vitest";
import type { FastifyInstance } from "fastify";
import { buildEngineSim, getSimState } from "../app.js";
import type { EngineSimOptions } from "../state.js";
import type { SimTokenizer } from "../tokenizer.js";

/**
 * A scripted multi-turn tool conversation driven through a simulator the way an agent drives a
 * real server: each turn's answer is appended to the history (content, reasoning, tool calls as
 * returned) with the tool's result, and the next turn is asked. Each family test states what the
 * model writes and what vLLM's parsers return for every turn; this checks the chat route
 * (streamed and not), the raw-prompt routes and token-in against those expectations.
 */

export interface ExpectedTurn {
  /** The exact text the model writes, end token included (decoded with special tokens). */
  emitted: string;
  content: string | null;
  reasoning: string | null;
  calls: { name: string; arguments: string }[];
  finish: "stop" | "tool_calls";
}

export interface Conversation {
  messages: Record<string, unknown>[];
  tools?: Record<string, unknown>[];
  /** The tool results to append after each tool-calling turn, in call order. */
  results: string[];
  turns: ExpectedTurn[];
  extra?: Record<string, unknown>;
}

export async function post(app: FastifyInstance, url: string, payload: object, headers: Record<string, string> = {}) {
  return app.inject({ method: "POST", url, payload: JSON.stringify(payload), headers: { "content-type": "application/json", ...headers } });
}

interface DeltaCall {
  index: number;
  id?: string;
  function?: { name?: string; arguments?: string };
}

/** A chat stream chunk (the fields these tests read). */
export interface Chunk {
  choices: { token_ids?: number[]; finish_reason?: string | null; delta?: Record<string, unknown> & { tool_calls?: DeltaCall[] } }[];
  prompt_token_ids?: number[];
  [key: string]: unknown;
}

export function sse(body: string): Chunk[] {
  expect(body.endsWith("data: [DONE]\n\n")).toBe(true);
  return body
    .split("\n\n")
    .filter((s) => s && s !== "data: [DONE]")
    .map((s) => JSON.parse(s.slice(6)) as Chunk);
}

/** The answer a streamed vLLM chat reply adds up to. */
export function gatherStream(chunks: Chunk[], reasoningField = "reasoning") {
  let content: string | null = null;
  let reasoning: string | null = null;
  const calls: { id?: string; name: string; arguments: string }[] = [];
  const ids: number[] = [];
  let finish: string | null = null;
  for (const c of chunks) {
    const ch = c.choices[0];
    if (!ch) continue;
    ids.push(...(ch.token_ids ?? []));
    if (ch.finish_reason) finish = ch.finish_reason;
    const d = ch.delta ?? {};
    if (typeof d.content === "string" && d.content !== "") content = (content ?? "") + d.content;
    if (typeof d[reasoningField] === "string") reasoning = (reasoning ?? "") + d[reasoningField];
    for (const t of d.tool_calls ?? []) {
      calls[t.index] ??= { name: "", arguments: "" };
      if (t.id) calls[t.index]!.id = t.id;
      if (t.function?.name) calls[t.index]!.name += t.function.name;
      if (t.function?.arguments) calls[t.index]!.arguments += t.function.arguments;
    }
  }
  return { content, reasoning, calls: calls.map(({ name, arguments: a }) => ({ name, arguments: a })), ids, finish, prompt: chunks[0]?.prompt_token_ids as number[] | undefined };
}

export interface TurnRecord {
  promptIds: number[];
  ids: number[];
}

/**
 * Plays the conversation on the vLLM chat route (streamed or not), checking each turn, and returns
 * every turn's prompt and output ids.
 */
/**
 * How the prompt reaches the chat route: rendered by the server from the messages, or rendered by
 * /tokenize and sent as ids (vLLM's kv_transfer_params.prompt_token_ids or prompt_token_ids field,
 * SGLang's input_ids; SGLang answers in its own shape).
 */
export type PromptMode = "render" | "kv_transfer_params" | "prompt_token_ids" | "input_ids";

export async function playChat(app: FastifyInstance, tok: SimTokenizer, conv: Conversation, stream: boolean, mode: PromptMode = "render"): Promise<TurnRecord[]> {
  const messages = [...conv.messages];
  const records: TurnRecord[] = [];
  let result = 0;
  const sglang = mode === "input_ids";
  for (const [k, want] of conv.turns.entries()) {
    const body: Record<string, unknown> = { messages, ...(conv.tools ? { tools: conv.tools } : {}), return_token_ids: true, ...(conv.extra ?? {}) };
    if (mode !== "render") {
      const kwargs = (conv.extra?.chat_template_kwargs ?? null) as Record<string, unknown> | null;
      const t = await post(app, "/tokenize", { messages, ...(conv.tools ? { tools: conv.tools } : {}), ...(kwargs ? { chat_template_kwargs: kwargs } : {}) });
      const ids = t.json().tokens as number[];
      if (mode === "kv_transfer_params") body.kv_transfer_params = { prompt_token_ids: ids };
      else if (mode === "prompt_token_ids") body.prompt_token_ids = ids;
      else {
        body.input_ids = ids;
        body.return_prompt_token_ids = true;
      }
    }
    const res = await post(app, "/v1/chat/completions", stream ? { ...body, stream: true } : body);
    if (mode !== "render" && !sglang && !stream) expect(res.json().prompt_token_ids, `turn ${k}: the token-in prompt is the prompt`).toEqual(body.kv_transfer_params ? (body.kv_transfer_params as { prompt_token_ids: number[] }).prompt_token_ids : body.prompt_token_ids);
    expect(res.statusCode, `turn ${k}: ${res.body}`).toBe(200);
    let got: { content: string | null; reasoning: string | null; calls: { name: string; arguments: string }[]; ids: number[]; finish: string | null; prompt: number[] };
    if (stream) {
      const g = gatherStream(sse(res.body));
      got = { ...g, prompt: g.prompt! };
    } else {
      const j = res.json();
      const m = j.choices[0].message;
      got = {
        content: m.content,
        reasoning: (sglang ? m.reasoning_content : m.reasoning) ?? null,
        calls: (m.tool_calls ?? []).map((t: { function: { name: string; arguments: string } }) => t.function),
        ids: j.choices[0].token_ids,
        finish: j.choices[0].finish_reason,
        prompt: sglang ? j.choices[0].prompt_token_ids : j.prompt_token_ids,
      };
    }
    expect(tok.decode(got.ids), `turn ${k} emitted`).toBe(want.emitted);
    // The ids are the real tokenisation of what the model wrote.
    expect(got.ids, `turn ${k} ids`).toEqual(tok.encode(want.emitted));
    expect({ content: got.content, reasoning: got.reasoning, calls: got.calls, finish: got.finish }, `turn ${k} (${stream ? "streamed" : "not streamed"})`).toEqual({
      content: want.content,
      reasoning: want.reasoning,
      calls: want.calls,
      finish: want.finish,
    });
    records.push({ promptIds: got.prompt, ids: got.ids });
    // The agent appends the answer and the tools' results.
    const calls = want.calls.map((c, i) => ({ id: `call_${k}_${i}`, type: "function", function: c }));
    messages.push({ role: "assistant", content: want.content, ...(want.reasoning !== null ? { reasoning: want.reasoning } : {}), ...(calls.length > 0 ? { tool_calls: calls } : {}) });
    for (const c of calls) messages.push({ role: "tool", tool_call_id: c.id, content: conv.results[result++] ?? "ok" });
  }
  return records;
}

/** The same turns through the raw-prompt routes (the chat prompt's ids as a completions prompt / SGLang input_ids). */
export async function playRaw(app: FastifyInstance, records: TurnRecord[], kind: "vllm" | "sglang"): Promise<void> {
  for (const [k, r] of records.entries()) {
    if (kind === "vllm") {
      const j = (await post(app, "/v1/completions", { prompt: r.promptIds, max_tokens: 4096, return_token_ids: true })).json();
      expect(j.choices[0].token_ids, `completions turn ${k}`).toEqual(r.ids);
    } else {
      const j = (await post(app, "/generate", { input_ids: r.promptIds, sampling_params: { max_new_tokens: 4096 } })).json();
      expect(j.output_ids, `/generate turn ${k}`).toEqual(r.ids);
    }
  }
}

/**
 * The conversation with token-in prompts (the ids /tokenize renders), on the three routes that take
 * them: vLLM's kv_transfer_params.prompt_token_ids (≥ 0.28.0), its prompt_token_ids field (0.29.0),
 * SGLang's input_ids. Each turn must parse to the same answer as the rendered call.
 */
export async function playTokenIn(options: EngineSimOptions, conv: Conversation): Promise<void> {
  const apps = [buildEngineSim({ ...options, vllmVersion: "0.28.0" }), buildEngineSim({ ...options, vllmVersion: "0.29.0" }), buildEngineSim({ ...options, kind: "sglang" })];
  try {
    const tok = getSimState(apps[0]!).tok;
    await playChat(apps[0]!, tok, conv, false, "kv_transfer_params");
    await playChat(apps[0]!, tok, conv, true, "kv_transfer_params");
    await playChat(apps[1]!, tok, conv, false, "prompt_token_ids");
    await playChat(apps[2]!, tok, conv, false, "input_ids");
  } finally {
    await Promise.all(apps.map((a) => a.close()));
  }
}
