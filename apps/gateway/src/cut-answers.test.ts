/**
 * Answers cut by `max_tokens`, echoed back: for every model family engine-sim serves (its real
 * tokenizer and chat template), as vLLM and as SGLang, streamed and not, an agent on the official
 * OpenAI SDK (and on the Anthropic and Gemini SDKs) has its first call cut by `max_tokens` inside the reasoning
 * or inside a tool call's arguments; it sends the cut answer back as the SDK gave it (a tool result
 * for a cut call the SDK returned, else "go on") and calls again. The trainer must get the engine's
 * own ids: every record holds exactly what the engine generated, and the second call's prompt
 * continues the first call's prompt + output token for token (one trace), except where the family's
 * profile names the break (gpt-oss: the engine renders harmony tool calls itself, token-in off).
 * What each family writes and where it breaks is read from its profile, never hard-coded.
 */
import Anthropic from "@anthropic-ai/sdk";
import { GoogleGenAI, type Content, type Part } from "@google/genai";
import OpenAI from "openai";
import { getSimState, simLogprob, type FamilyName } from "@rollgate/engine-sim";
import { PRESETS, type ModelProfile } from "@rollgate/models";
import type { CompletionRecord, Trajectory } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PROFILE_OF_FAMILY, startHarness, type Harness } from "./__fixtures__/harness.js";
import { addToolCallDeltas } from "./__fixtures__/openai-sse.js";

type Kind = "vllm" | "sglang";
type Cut = "reasoning" | "tool_arguments";

const FAMILIES = Object.keys(PROFILE_OF_FAMILY) as FamilyName[];
const KINDS: Kind[] = ["vllm", "sglang"];

const SHELL = {
  name: "shell",
  description: "Run a shell command",
  parameters: { type: "object" as const, properties: { command: { type: "string" } }, required: ["command"] },
};

/** Long enough that a cut of CUT_AT tokens lands inside it, whatever the family writes before it. */
const LONG = Array.from({ length: 60 }, (_, i) => `word${i}`).join(" ");
const REASONING = `I think about ${LONG} and then stop here.`;
const COMMAND = `echo ${LONG} > out.txt`;
const CUT_AT = 40;

/** The family writes reasoning when its profile names the token that ends it. */
const thinks = (p: ModelProfile) => p.reasoning_end !== null;

/** Tools are declared, but not where the family calls tools only with thinking off and the cut is in the reasoning. */
const withTools = (p: ModelProfile, cut: Cut) => cut === "tool_arguments" || !p.thinking.off_with_tools;

function script(cut: Cut): string {
  const first = cut === "reasoning" ? { think: REASONING, text: "Done thinking." } : { tool_calls: [{ name: "shell", arguments: { command: COMMAND } }] };
  return `#sim: ${JSON.stringify([first, { text: "Finished." }])}`;
}

type Protocol = "openai_chat" | "anthropic" | "gemini";
const PROTOCOLS: Protocol[] = ["openai_chat", "anthropic", "gemini"];
/** How each protocol tells an agent its answer was cut by max_tokens. */
const CUT_FINISH: Record<Protocol, string> = { openai_chat: "length", anthropic: "max_tokens", gemini: "MAX_TOKENS" };

type Session = Awaited<ReturnType<Harness["openSession"]>>;

interface Answer {
  finish: string | null;
  calledTool: boolean;
}

interface Agent {
  call: (maxTokens?: number) => Promise<Answer>;
  /** Sends the last answer back as the SDK gave it, then a result for each of its tool calls, else "go on". */
  echo: () => void;
}

/** An OpenAI-SDK agent; streamed, it joins the deltas into one message, whatever fields they carry. */
function openaiAgent(s: Session, profile: ModelProfile, cut: Cut, stream: boolean): Agent {
  const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
  const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: `Do the task.\n${script(cut)}` }];
  let last: Record<string, unknown> = {};
  const tools = withTools(profile, cut) ? { tools: [{ type: "function" as const, function: SHELL }] } : {};
  const kwargs = cut === "reasoning" && profile.thinking.kwarg ? { chat_template_kwargs: { [profile.thinking.kwarg]: true } } : {};
  return {
    call: async (maxTokens) => {
      const body = { model: "agent", messages, ...(maxTokens ? { max_tokens: maxTokens } : {}), ...tools, ...kwargs };
      if (!stream) {
        const choice = (await client.chat.completions.create(body)).choices[0]!;
        last = { ...choice.message };
        return { finish: choice.finish_reason, calledTool: !!choice.message.tool_calls?.length };
      }
      const text: Record<string, string> = {};
      const calls: { id: string; type: "function"; function: { name: string; arguments: string } }[] = [];
      let finish: string | null = null;
      for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
        const choice = chunk.choices[0];
        if (!choice) continue;
        finish = choice.finish_reason ?? finish;
        for (const [k, v] of Object.entries(choice.delta)) if (typeof v === "string" && k !== "role") text[k] = (text[k] ?? "") + v;
        addToolCallDeltas(calls, choice.delta.tool_calls);
      }
      last = { role: "assistant", content: text.content ?? null, ...text, ...(calls.length ? { tool_calls: calls } : {}) };
      return { finish, calledTool: calls.length > 0 };
    },
    echo: () => {
      messages.push(last as unknown as OpenAI.ChatCompletionAssistantMessageParam);
      const calls = (last.tool_calls ?? []) as { id: string }[];
      for (const t of calls) messages.push({ role: "tool", tool_call_id: t.id, content: "ran it" });
      if (!calls.length) messages.push({ role: "user", content: "go on" });
    },
  };
}

/** An Anthropic-SDK agent (`messages.stream(…).finalMessage()` when streamed). */
function anthropicAgent(s: Session, profile: ModelProfile, cut: Cut, stream: boolean): Agent {
  const client = new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 });
  const messages: Anthropic.MessageParam[] = [{ role: "user", content: `Do the task.\n${script(cut)}` }];
  let last: Anthropic.ContentBlock[] = [];
  const tools = withTools(profile, cut)
    ? { tools: [{ name: SHELL.name, description: SHELL.description, input_schema: SHELL.parameters }] }
    : {};
  const thinking = cut === "reasoning" ? { thinking: { type: "enabled" as const, budget_tokens: 1024 } } : {};
  return {
    call: async (maxTokens) => {
      const body = { model: "claude-test", max_tokens: maxTokens ?? 512, messages, ...tools, ...thinking };
      const m = stream ? await client.messages.stream(body).finalMessage() : await client.messages.create(body);
      last = m.content;
      return { finish: m.stop_reason, calledTool: m.content.some((b) => b.type === "tool_use") };
    },
    echo: () => {
      messages.push({ role: "assistant", content: last });
      const uses = last.filter((b): b is Anthropic.ToolUseBlock => b.type === "tool_use");
      messages.push({
        role: "user",
        content: uses.length ? uses.map((u) => ({ type: "tool_result" as const, tool_use_id: u.id, content: "ran it" })) : "go on",
      });
    },
  };
}

/** A Gemini-SDK agent: the model turn echoed as the SDK gave it (streamed: its chunks' parts in order), thought parts included. */
function geminiAgent(s: Session, profile: ModelProfile, cut: Cut, stream: boolean): Agent {
  const ai = new GoogleGenAI({ apiKey: s.token, httpOptions: { baseUrl: s.urls.gemini.replace(/\/v1beta\/?$/, "") } });
  const contents: Content[] = [{ role: "user", parts: [{ text: `Do the task.\n${script(cut)}` }] }];
  let last: Content = { role: "model", parts: [] };
  const tools = withTools(profile, cut) ? { tools: [{ functionDeclarations: [{ name: SHELL.name, description: SHELL.description, parametersJsonSchema: SHELL.parameters }] }] } : {};
  const thinking = cut === "reasoning" ? { thinkingConfig: { includeThoughts: true, thinkingBudget: 1024 } } : {};
  return {
    call: async (maxTokens) => {
      const request = { model: "gemini-agent", contents, config: { ...(maxTokens ? { maxOutputTokens: maxTokens } : {}), ...tools, ...thinking } };
      const chunks = stream ? [] : [await ai.models.generateContent(request)];
      if (stream) for await (const c of await ai.models.generateContentStream(request)) chunks.push(c);
      const parts: Part[] = chunks.flatMap((c) => c.candidates?.[0]?.content?.parts ?? []);
      last = { role: "model", parts };
      const finish = chunks.map((c) => c.candidates?.[0]?.finishReason).findLast((f) => f !== undefined) ?? null;
      return { finish, calledTool: parts.some((p) => p.functionCall) };
    },
    echo: () => {
      contents.push(last);
      const calls = (last.parts ?? []).flatMap((p) => (p.functionCall ? [p.functionCall] : []));
      contents.push({
        role: "user",
        parts: calls.length ? calls.map((c) => ({ functionResponse: { id: c.id, name: c.name, response: { output: "ran it" } } })) : [{ text: "go on" }],
      });
    },
  };
}

const AGENTS: Record<Protocol, typeof openaiAgent> = { openai_chat: openaiAgent, anthropic: anthropicAgent, gemini: geminiAgent };

describe.each(FAMILIES.flatMap((family) => KINDS.map((kind) => [family, kind] as const)))("%s on %s", (family, kind) => {
  const profile = PRESETS[PROFILE_OF_FAMILY[family]!]!;
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness(`cut-${family.replace(/\W/g, "")}-${kind}`, { family, kind }, { ROLLGATE_HEALTH_INTERVAL_S: "0" });
  }, 60_000);
  afterAll(async () => h?.close());

  const cuts: Cut[] = thinks(profile) ? ["reasoning", "tool_arguments"] : ["tool_arguments"];
  // A tool_use cut inside its input reaches an Anthropic agent as `input: {}` (its arguments do not
  // parse), and comes back so: the echo is still the recorded call.
  const cells = PROTOCOLS.flatMap((protocol) => cuts.flatMap((cut) => [false, true].map((stream) => [protocol, cut, stream] as const)));

  it.each(cells)("%s: cut inside %s (streamed %s), echoed back: the engine's ids, continued token for token", async (protocol, cut, stream) => {
    const s = await h.openSession();
    const agent = AGENTS[protocol](s, profile, cut, stream);
    const first = await agent.call(CUT_AT);
    // The agent is told its answer was cut, in its protocol, also where vLLM's chat route says
    // "tool_calls" for an answer whose call it parsed, cut or not (its serving_chat rule, which
    // engine-sim keeps): the gateway tells the cut by the answer having all the tokens it was allowed.
    expect(first.finish).toBe(CUT_FINISH[protocol]);
    if (cut === "tool_arguments") expect(first.calledTool).toBe(true);
    agent.echo();
    const second = await agent.call();
    expect(second.finish).not.toBe(CUT_FINISH[protocol]);

    const records = await h.records(s.id);
    expect(records).toHaveLength(2);
    const [r0, r1] = records as [CompletionRecord, CompletionRecord];
    const state = getSimState(h.sim);
    // The cut is where the cell says: inside the reasoning, or inside the call's arguments.
    // The record says the answer was cut, and its ids show it: exactly max_tokens of them.
    expect(r0.finish_reason).toBe("length");
    expect(r0.output_ids).toHaveLength(CUT_AT);
    const cutText = state.tok.decode(r0.output_ids);
    if (cut === "reasoning") {
      expect(cutText).toContain("I think about word0");
      expect(cutText).not.toContain(profile.reasoning_end!);
    } else {
      expect(cutText).toContain("echo word0");
      expect(cutText).not.toContain("out.txt");
    }
    // Every record's output ids are the engine's: each token's logprob is engine-sim's function of
    // (weights, the engine's context, the token), which only the engine's own ids in order reproduce.
    for (const r of records) {
      expect(r.output_ids.length).toBe(r.output_logprobs.length);
      r.output_ids.forEach((t, i) => expect(r.output_logprobs[i]).toBe(simLogprob(state.weightVersion, [...r.prompt_ids, ...r.output_ids.slice(0, i)], t)));
    }
    expect(state.tok.decode(r1.output_ids)).toContain("Finished.");

    const closed = await fetch(`${h.url}/v1/sessions/${s.id}/close?trajectory=prefix_merging`, { method: "POST" });
    expect(closed.status).toBe(200);
    const { trajectory } = (await closed.json()) as { trajectory: Trajectory };
    const breaks = trajectory.stats.breaks;
    if (cut === "tool_arguments" && profile.token_in === "off" && profile.notes.rerendered) {
      // The profile documents that the engine renders this family's past tool calls itself, not as the
      // model wrote them, and turns token-in off: the cut call cannot be continued token-in, and the
      // break is named (on the cut record: the prompt diverges inside its output), never merged over.
      expect(trajectory.traces).toHaveLength(2);
      expect(breaks).toHaveLength(1);
      expect(breaks[0]!.record_id).toBe(r1.id);
      expect(breaks[0]!.position).toBeGreaterThanOrEqual(r0.prompt_ids.length);
      // A truncated output not continued, on either engine.
      expect(breaks[0]!.reason).toBe("truncated_output");
      expect(breaks[0]!.detail).toContain(r0.id);
      expect(trajectory.traces.map((t) => t.completion_ids)).toEqual([[r0.id], [r1.id]]);
      return;
    }
    expect(trajectory.traces, JSON.stringify(breaks)).toHaveLength(1);
    expect(breaks).toEqual([]);
    // Token-exact continuation: call 2's prompt begins with call 1's prompt and its cut output.
    expect(r1.prompt_ids.slice(0, r0.prompt_ids.length + r0.output_ids.length)).toEqual([...r0.prompt_ids, ...r0.output_ids]);
    const trace = trajectory.traces[0]!;
    expect(trace.completion_ids).toEqual([r0.id, r1.id]);
    expect(trace.response_ids.slice(0, r0.output_ids.length)).toEqual(r0.output_ids);
    expect(trace.response_ids.filter((_, i) => trace.loss_mask[i] === 1)).toEqual([...r0.output_ids, ...r1.output_ids]);
    expect([...trace.prompt_ids, ...trace.response_ids]).toEqual([...r1.prompt_ids, ...r1.output_ids]);
  });
});
