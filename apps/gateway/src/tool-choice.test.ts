/**
 * A forced tool choice, end to end: for every model family engine-sim serves (its real tokenizer and
 * chat template), as vLLM and as SGLang, streamed and not, an agent on the official OpenAI SDK
 * (`tool_choice: "required"` / a named function), the Anthropic SDK (`{type: "any"}` / `{type:
 * "tool"}`) or the Gemini SDK (`mode: ANY`, with one allowed name for the named case) gets the call,
 * sends it back with a tool result and calls again, forcing the tool once more, then once more
 * leaving the choice to the model. The engine answers a forced choice with guided
 * decoding: the model's tokens are bare JSON, not the family's tool-call markup, so the template's
 * render of the echoed call is not what the model wrote. The trainer must still get the engine's own
 * ids: every record holds exactly what the engine generated, and each call's prompt continues the
 * previous call's prompt + output token for token (one trace), except where the family's profile
 * turns token-in off (gpt-oss), where the break must be named, never merged over.
 */
import Anthropic from "@anthropic-ai/sdk";
import { FunctionCallingConfigMode, GoogleGenAI, type Content, type Part } from "@google/genai";
import OpenAI from "openai";
import { getSimState, simLogprob, type FamilyName } from "@rollgate/engine-sim";
import { PRESETS, type ModelProfile } from "@rollgate/models";
import type { CompletionRecord, Trajectory } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PROFILE_OF_FAMILY, startHarness, type Harness } from "./__fixtures__/harness.js";
import { addToolCallDeltas } from "./__fixtures__/openai-sse.js";

type Kind = "vllm" | "sglang";
type Choice = "required" | "named";
type Protocol = "openai_chat" | "anthropic" | "gemini";

const FAMILIES = Object.keys(PROFILE_OF_FAMILY) as FamilyName[];
const KINDS: Kind[] = ["vllm", "sglang"];
const PROTOCOLS: Protocol[] = ["openai_chat", "anthropic", "gemini"];
const CHOICES: Choice[] = ["required", "named"];

const SHELL = {
  name: "shell",
  description: "Run a shell command",
  parameters: { type: "object" as const, properties: { command: { type: "string" } }, required: ["command"] },
};
const READ = {
  name: "read_file",
  description: "Read a file",
  parameters: { type: "object" as const, properties: { path: { type: "string" } }, required: ["path"] },
};
const COMMAND = "ls -la /tmp";
const REASONING = "The listing will tell me.";

/** The family writes reasoning when its profile names the token that ends it; not where it calls tools only with thinking off. */
const thinks = (p: ModelProfile) => p.reasoning_end !== null && !p.thinking.off_with_tools;

/** Two forced calls (the agent forces the tool on each), then the answer the agent leaves to the model. */
function script(p: ModelProfile): string {
  const call = { tool_calls: [{ name: "shell", arguments: { command: COMMAND } }] };
  const step = thinks(p) ? { think: REASONING, ...call } : call;
  return `#sim: ${JSON.stringify([step, step, { text: "Finished." }])}`;
}

type Session = Awaited<ReturnType<Harness["openSession"]>>;

interface Answer {
  finish: string | null;
  calls: { name: string; args: unknown }[];
}

interface Agent {
  /** `forced`: the call carries the cell's tool choice (else the choice is left to the model). */
  call: (forced: boolean) => Promise<Answer>;
  /** Sends the last answer back as the SDK gave it, then a result for each of its tool calls. */
  echo: () => void;
}

function openaiAgent(s: Session, profile: ModelProfile, choice: Choice, stream: boolean): Agent {
  const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
  const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: `List /tmp.\n${script(profile)}` }];
  let last: Record<string, unknown> = {};
  const tools = [SHELL, READ].map((f) => ({ type: "function" as const, function: f }));
  const kwargs = thinks(profile) && profile.thinking.kwarg ? { chat_template_kwargs: { [profile.thinking.kwarg]: true } } : {};
  const toolChoice: OpenAI.ChatCompletionToolChoiceOption = choice === "required" ? "required" : { type: "function", function: { name: "shell" } };
  return {
    call: async (forced) => {
      const body = { model: "agent", messages, tools, ...(forced ? { tool_choice: toolChoice } : {}), ...kwargs };
      if (!stream) {
        const c = (await client.chat.completions.create(body)).choices[0]!;
        last = { ...c.message };
        const calls = (c.message.tool_calls ?? []).flatMap((t) => (t.type === "function" ? [{ name: t.function.name, args: JSON.parse(t.function.arguments) as unknown }] : []));
        return { finish: c.finish_reason, calls };
      }
      const text: Record<string, string> = {};
      const calls: { id: string; type: "function"; function: { name: string; arguments: string } }[] = [];
      let finish: string | null = null;
      for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
        const c = chunk.choices[0];
        if (!c) continue;
        finish = c.finish_reason ?? finish;
        for (const [k, v] of Object.entries(c.delta)) if (typeof v === "string" && k !== "role") text[k] = (text[k] ?? "") + v;
        addToolCallDeltas(calls, c.delta.tool_calls);
      }
      last = { role: "assistant", content: text.content ?? null, ...text, ...(calls.length ? { tool_calls: calls } : {}) };
      return { finish, calls: calls.map((t) => ({ name: t.function.name, args: JSON.parse(t.function.arguments) as unknown })) };
    },
    echo: () => {
      messages.push(last as unknown as OpenAI.ChatCompletionAssistantMessageParam);
      for (const t of (last.tool_calls ?? []) as { id: string }[]) messages.push({ role: "tool", tool_call_id: t.id, content: "a.txt b.txt" });
    },
  };
}

function anthropicAgent(s: Session, profile: ModelProfile, choice: Choice, stream: boolean): Agent {
  const client = new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 });
  const messages: Anthropic.MessageParam[] = [{ role: "user", content: `List /tmp.\n${script(profile)}` }];
  let last: Anthropic.ContentBlock[] = [];
  const tools = [SHELL, READ].map((f) => ({ name: f.name, description: f.description, input_schema: f.parameters }));
  const thinking = thinks(profile) ? { thinking: { type: "enabled" as const, budget_tokens: 1024 } } : {};
  const toolChoice: Anthropic.ToolChoice = choice === "required" ? { type: "any" } : { type: "tool", name: "shell" };
  return {
    call: async (forced) => {
      const body = { model: "claude-test", max_tokens: 512, messages, tools, ...(forced ? { tool_choice: toolChoice } : {}), ...thinking };
      const m = stream ? await client.messages.stream(body).finalMessage() : await client.messages.create(body);
      last = m.content;
      return { finish: m.stop_reason, calls: m.content.flatMap((b) => (b.type === "tool_use" ? [{ name: b.name, args: b.input }] : [])) };
    },
    echo: () => {
      messages.push({ role: "assistant", content: last });
      const uses = last.filter((b): b is Anthropic.ToolUseBlock => b.type === "tool_use");
      messages.push({ role: "user", content: uses.map((u) => ({ type: "tool_result" as const, tool_use_id: u.id, content: "a.txt b.txt" })) });
    },
  };
}

function geminiAgent(s: Session, profile: ModelProfile, choice: Choice, stream: boolean): Agent {
  const ai = new GoogleGenAI({ apiKey: s.token, httpOptions: { baseUrl: s.urls.gemini.replace(/\/v1beta\/?$/, "") } });
  const contents: Content[] = [{ role: "user", parts: [{ text: `List /tmp.\n${script(profile)}` }] }];
  let last: Content = { role: "model", parts: [] };
  const tools = [{ functionDeclarations: [SHELL, READ].map((f) => ({ name: f.name, description: f.description, parametersJsonSchema: f.parameters })) }];
  const thinking = thinks(profile) ? { thinkingConfig: { includeThoughts: true, thinkingBudget: 1024 } } : {};
  const fcc = { mode: FunctionCallingConfigMode.ANY, ...(choice === "named" ? { allowedFunctionNames: ["shell"] } : {}) };
  return {
    call: async (forced) => {
      const request = { model: "gemini-agent", contents, config: { tools, ...(forced ? { toolConfig: { functionCallingConfig: fcc } } : {}), ...thinking } };
      const chunks = stream ? [] : [await ai.models.generateContent(request)];
      if (stream) for await (const c of await ai.models.generateContentStream(request)) chunks.push(c);
      const parts: Part[] = chunks.flatMap((c) => c.candidates?.[0]?.content?.parts ?? []);
      last = { role: "model", parts };
      const finish = chunks.map((c) => c.candidates?.[0]?.finishReason).findLast((f) => f !== undefined) ?? null;
      return { finish, calls: parts.flatMap((p) => (p.functionCall ? [{ name: p.functionCall.name ?? "", args: p.functionCall.args }] : [])) };
    },
    echo: () => {
      contents.push(last);
      const calls = (last.parts ?? []).flatMap((p) => (p.functionCall ? [p.functionCall] : []));
      contents.push({ role: "user", parts: calls.map((c) => ({ functionResponse: { id: c.id, name: c.name, response: { output: "a.txt b.txt" } } })) });
    },
  };
}

const AGENTS: Record<Protocol, typeof openaiAgent> = { openai_chat: openaiAgent, anthropic: anthropicAgent, gemini: geminiAgent };
/** How each protocol says "the model called a tool"; OpenAI: "tool_calls", or "stop" for a named function (vLLM, as OpenAI). */
const TOOL_FINISH: Record<Protocol, string> = { openai_chat: "tool_calls", anthropic: "tool_use", gemini: "STOP" };

describe.each(FAMILIES.flatMap((family) => KINDS.map((kind) => [family, kind] as const)))("%s on %s", (family, kind) => {
  const profile = PRESETS[PROFILE_OF_FAMILY[family]!]!;
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness(`tc-${family.replace(/\W/g, "")}-${kind}`, { family, kind }, { ROLLGATE_HEALTH_INTERVAL_S: "0" });
  }, 60_000);
  afterAll(async () => h?.close());

  const cells = PROTOCOLS.flatMap((protocol) => CHOICES.flatMap((choice) => [false, true].map((stream) => [protocol, choice, stream] as const)));

  it.each(cells)("%s: tool_choice %s (streamed %s), twice, calls echoed with their results: the engine's ids, one trace or a named break", async (protocol, choice, stream) => {
    const s = await h.openSession();
    const agent = AGENTS[protocol](s, profile, choice, stream);
    // Twice: the agent forces the tool, gets the call, sends it back with its result.
    for (let k = 0; k < 2; k++) {
      const a = await agent.call(true);
      // The agent gets the forced call, as its protocol says a tool was called.
      expect(a.calls).toEqual([{ name: "shell", args: { command: COMMAND } }]);
      const openaiNamed = protocol === "openai_chat" && choice === "named" && kind === "vllm" && family !== "gpt-oss";
      expect(a.finish).toBe(openaiNamed ? "stop" : TOOL_FINISH[protocol]);
      agent.echo();
    }
    const last = await agent.call(false);
    expect(last.calls).toEqual([]);

    const records = await h.records(s.id);
    expect(records).toHaveLength(3);
    const state = getSimState(h.sim);
    // The forced answers are what the engine generated: guided JSON (not the family's markup) where
    // the engine guides this family, after the reasoning when the family thinks.
    for (const r of records.slice(0, 2)) {
      const out = state.tok.decode(r.output_ids);
      expect(out).toMatch(/"command": ?"ls -la \/tmp"/);
      if (thinks(profile)) expect(out).toContain(REASONING);
      if (family !== "gpt-oss") expect(out.trimEnd()).toMatch(kind === "vllm" && choice === "named" ? /\{"command": "ls -la \/tmp"\}(<[^>]*>|<｜[^｜]*｜>)?$/ : /"parameters": \{"command": "ls -la \/tmp"\}\}\](<[^>]*>|<｜[^｜]*｜>)?$/);
    }
    expect(state.tok.decode(records[2]!.output_ids)).toContain("Finished.");
    // Every record's ids are the engine's: each token's logprob is engine-sim's function of
    // (weights, the engine's context, the token), which only the engine's own ids in order reproduce.
    for (const r of records) {
      expect(r.output_ids.length).toBe(r.output_logprobs.length);
      r.output_ids.forEach((t, i) => expect(r.output_logprobs[i]).toBe(simLogprob(state.weightVersion, [...r.prompt_ids, ...r.output_ids.slice(0, i)], t)));
    }

    const closed = await fetch(`${h.url}/v1/sessions/${s.id}/close?trajectory=prefix_merging`, { method: "POST" });
    expect(closed.status).toBe(200);
    const { trajectory } = (await closed.json()) as { trajectory: Trajectory };
    const breaks = trajectory.stats.breaks;
    const continues = (a: CompletionRecord, b: CompletionRecord) =>
      b.prompt_ids.length >= a.prompt_ids.length + a.output_ids.length && [...a.prompt_ids, ...a.output_ids].every((id, i) => b.prompt_ids[i] === id);
    if (profile.token_in === "off") {
      // The engine renders the echoed calls itself (the profile turns token-in off): where its render
      // is not what the model wrote, the break is named on that record, past the earlier prompt (inside
      // what the model wrote), never merged over; elsewhere the trace goes on.
      const broken = records.slice(1).filter((r, i) => !continues(records[i]!, r));
      expect(breaks.map((b) => b.record_id)).toEqual(broken.map((r) => r.id));
      for (const b of breaks) {
        const i = records.findIndex((r) => r.id === b.record_id);
        expect(b.position).toBeGreaterThanOrEqual(records[i - 1]!.prompt_ids.length);
        expect(b.reason).toBe("history_rewritten");
        expect(b.detail).toContain(records[i - 1]!.id);
      }
      expect(trajectory.traces).toHaveLength(1 + breaks.length);
      return;
    }
    expect(trajectory.traces, JSON.stringify(breaks)).toHaveLength(1);
    expect(breaks).toEqual([]);
    // Token-exact continuation: each call's prompt begins with the previous call's prompt and output.
    for (let i = 1; i < records.length; i++) expect(continues(records[i - 1]!, records[i]!)).toBe(true);
    const trace = trajectory.traces[0]!;
    expect(trace.completion_ids).toEqual(records.map((r) => r.id));
    expect(trace.response_ids.filter((_, i) => trace.loss_mask[i] === 1)).toEqual(records.flatMap((r) => r.output_ids));
    const lastRecord = records[2]!;
    expect([...trace.prompt_ids, ...trace.response_ids]).toEqual([...lastRecord.prompt_ids, ...lastRecord.output_ids]);
  });
});

// An engine without a token-in chat route (vLLM before 0.28): a forced call needs the chat route's
// guided decoding, so the gateway cannot send it token-in and the engine renders the history. The
// earlier guided answer then comes back in the family's markup: the break must be named, and say why.
describe("qwen3 on vLLM 0.27 (no token-in chat route)", () => {
  const profile = PRESETS[PROFILE_OF_FAMILY.qwen3!]!;
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness("tc-old-vllm", { family: "qwen3", kind: "vllm", vllmVersion: "0.27.0" }, { ROLLGATE_HEALTH_INTERVAL_S: "0" });
  }, 60_000);
  afterAll(async () => h?.close());

  it.each([["openai_chat", "required", false] as const, ["anthropic", "named", true] as const])(
    "%s: tool_choice %s (streamed %s) twice: the second forced call breaks the trace, named as the guided answer re-rendered",
    async (protocol, choice, stream) => {
      const s = await h.openSession();
      const agent = AGENTS[protocol](s, profile, choice, stream);
      for (let k = 0; k < 2; k++) {
        expect((await agent.call(true)).calls).toEqual([{ name: "shell", args: { command: COMMAND } }]);
        agent.echo();
      }
      expect((await agent.call(false)).calls).toEqual([]);
      const records = await h.records(s.id);
      expect(records).toHaveLength(3);
      const closed = await fetch(`${h.url}/v1/sessions/${s.id}/close?trajectory=prefix_merging`, { method: "POST" });
      const { trajectory } = (await closed.json()) as { trajectory: Trajectory };
      const breaks = trajectory.stats.breaks;
      // The second forced call was rendered: it diverges inside the first answer's guided JSON.
      expect(breaks.map((b) => b.record_id)).toContain(records[1]!.id);
      const b = breaks.find((x) => x.record_id === records[1]!.id)!;
      expect(b.reason).toBe("history_rewritten");
      expect(b.position).toBeGreaterThanOrEqual(records[0]!.prompt_ids.length);
      expect(b.detail).toContain(records[0]!.id);
      expect(b.detail).toContain(`tool_choice ${choice === "required" ? '"required"' : '"shell"'}`);
      expect(b.detail).toContain("guided");
    },
  );
});
