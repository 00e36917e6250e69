/**
 * Edge answers per model family, echoed back: for every family engine-sim serves (its real tokenizer
 * and chat template), as vLLM and as SGLang, streamed and not, through the official OpenAI (chat and
 * Responses), Anthropic and Gemini SDKs, the model answers something awkward (multi-byte characters
 * split across byte-level tokens, several tool calls with unicode / nested / escaped / empty
 * arguments, the family's own markup typed in prose, an empty answer, reasoning only); the agent
 * must see exactly what the model wrote, sends it back as its SDK gave it with tool results holding
 * markup, and calls again. The trainer must get the engine's own ids: every record holds exactly what
 * the engine generated, and the second call's prompt continues the first call's prompt + output token
 * for token, except where the family's profile names the break.
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
const FAMILIES = Object.keys(PROFILE_OF_FAMILY) as FamilyName[];
const KINDS: Kind[] = ["vllm", "sglang"];
/**
 * The main matrix also runs on a vLLM whose chat route takes no prompt ids (before 0.28.0): its
 * token-in calls go to /v1/completions, whose text the gateway parses itself with the profile's parser.
 */
const OLD_VLLM = "0.20.0";
const ENGINES = [...KINDS, `vllm@${OLD_VLLM}`] as const;
const simOf = (engine: string) => (engine.startsWith("vllm@") ? { kind: "vllm" as const, vllmVersion: engine.slice(5) } : { kind: engine as Kind });

const PING = "mcp__net__ping-host.v2";
const TOOLS = [
  { name: "shell", description: "Run a shell command", parameters: { type: "object" as const, properties: { command: { type: "string" }, opts: { type: "object" } }, required: ["command"] } },
  // An MCP-style name (double underscores, a hyphen, a dot), taking no arguments.
  { name: PING, description: "Ping", parameters: { type: "object" as const, properties: {} } },
];

/**
 * Numbers JSON keeps and JavaScript does not: the script writes `one` as 1.0 and `big` with all its
 * digits (the model's arguments as Python prints them); the agent parses them to 1 and a rounded double.
 */
const BIG = "12345678901234567890";
const pyNumbers = (json: string) => json.replace('"one":1,', '"one":1.0,').replace(`"big":${Number(BIG)}`, `"big":${BIG}`);

/** Text whose characters span several byte-level tokens each (CJK, emoji, ZWJ sequences, combining marks). */
const UNICODE_TEXT = "Voilà: 你好，世界！🦀🎉 👩‍👩‍👧‍👦 naïve ½ — 日本語のテキスト 🇫🇷 done";
/** A family's own markup, typed by the model in ordinary prose (no call is meant). */
const MARKUP_TEXT = "In prose I type `<tool_call>` and `</tool_call>`, <|python_tag|>, <|channel|>final<|message|> and <｜tool▁sep｜>, nothing more.";
const CALL_ARGS = {
  command: 'echo "héllo 🦀" | grep \'x\' > C:\\tmp\\out.txt',
  opts: { nested: { deep: [1, 2.5, null, true, "ü"] }, empty: {}, list: [], one: 1, big: Number(BIG) },
};
/** A tool result that holds markup, the agent's to send. */
const TOOL_RESULT = '<tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>\n<tool_response>ok</tool_response> </think> 🦀';

type Scenario = "unicode" | "markup" | "parallel_calls" | "empty" | "reasoning_only" | "unicode_reasoning" | "reasoning_then_calls" | "cut_mid_char" | "system_prompt" | "raw_call" | "empty_think_calls" | "cut_in_call" | "think_text_call" | "cut_in_reasoning" | "text_around_calls" | "string_args" | "reasoning_text_around_calls";

/** A call long enough that a cut of CUT_IN_CALL tokens lands inside its arguments, whatever the family writes before it. */
const LONG_COMMAND = `echo ${Array.from({ length: 60 }, (_, i) => `word${i}`).join(" ")} > out.txt`;
const CUT_IN_CALL = 40;

/** Arguments as the agent got them: parsed when they parse (a cut call's do not). */
function argsOf(text: string): unknown {
  try {
    return JSON.parse(text || "{}");
  } catch {
    return text;
  }
}

/**
 * A tool call written as the model might write it rather than as the template renders it (compact
 * JSON, no newlines), scripted as raw text in the family's markup: the engine's parser still finds the
 * call, and the template, rendering it back, writes other tokens than the model did.
 */
const RAW_CALL: Partial<Record<FamilyName, string>> = {
  qwen3: '<tool_call>\n{"name":"shell","arguments":{"command":"ls -la","opts":{"x":1}}}\n</tool_call>',
  "qwen3-coder": "<tool_call><function=shell><parameter=command>ls -la</parameter></function></tool_call>",
  // Llama 3.1 may open its call with <|python_tag|>, which its template never renders back for a JSON call.
  "llama3.1": '<|python_tag|>{"name":"shell","parameters":{"command":"ls -la","opts":{"x":1}}}',
  "deepseek-v3": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>shell\n```json\n{"command":"ls -la","opts":{"x":1}}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
  "deepseek-v3.1": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>shell<｜tool▁sep｜>{"command":"ls -la","opts":{"x":1}}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
};
/**
 * Text before, between and after tool calls, as the model may write it: the engine's streaming parser
 * gives every piece of it as content, so a streamed answer shows the agent text after a call (an
 * Anthropic text block or a Responses message item after the call), which it sends back so.
 */
const TEXT_AROUND_CALLS: Partial<Record<FamilyName, string>> = {
  qwen3: 'Looking.\n<tool_call>\n{"name": "shell", "arguments": {"command": "ls"}}\n</tool_call>\nbetween\n<tool_call>\n{"name": "shell", "arguments": {"command": "pwd"}}\n</tool_call>\nAfter the calls.',
};

/**
 * A call whose arguments the model wrote as a JSON string, not an object: the engine's parser passes
 * them on as that string, which an Anthropic tool_use cannot carry as its input (an object).
 */
const STRING_ARGS: Partial<Record<FamilyName, string>> = {
  qwen3: '<tool_call>\n{"name": "shell", "arguments": "{\\"command\\": \\"ls\\"}"}\n</tool_call>',
  "deepseek-v3.1": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>shell<｜tool▁sep｜>"ls -la"<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
};

const RAW_ARGS = (f: FamilyName) => (f === "qwen3-coder" ? { command: "ls -la" } : { command: "ls -la", opts: { x: 1 } });

/** Characters of four UTF-8 bytes that byte-level vocabularies split into several tokens each. */
const RARE = "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐌰𐌱𐌲 𓀀𓀁𓀂 ".repeat(6);
/** The second answer: multi-byte too, so text generated token-in (parsed by the gateway where it must) is checked as well. */
const SECOND = "Finished: 完成 🦀 ok.";

interface Step {
  think?: string;
  text?: string;
  tool_calls?: { name: string; arguments: Record<string, unknown> }[];
}

const thinks = (p: ModelProfile) => p.reasoning_end !== null;
/** gpt-oss writes one call per answer; Llama 3.1 writes no text beside its calls. */
const oneCallPerAnswer = (f: FamilyName) => f === "gpt-oss" || f === "llama3.1";
const noTextBesideCalls = (f: FamilyName) => f === "llama3.1";

function firstStep(scenario: Scenario, family: FamilyName): Step {
  switch (scenario) {
    case "unicode":
      return { text: UNICODE_TEXT };
    case "markup":
      return { text: MARKUP_TEXT };
    case "parallel_calls": {
      const calls = [
        { name: "shell", arguments: CALL_ARGS },
        { name: PING, arguments: {} },
      ];
      return {
        ...(noTextBesideCalls(family) ? {} : { text: "Running 🦀 两个 tools." }),
        tool_calls: oneCallPerAnswer(family) ? calls.slice(0, 1) : calls,
      };
    }
    case "empty":
      return {};
    case "reasoning_only":
      return { think: "Only thinking, no answer." };
    case "unicode_reasoning":
      return { think: `Reasoning: ${UNICODE_TEXT}`, text: UNICODE_TEXT };
    case "reasoning_then_calls":
      return { think: "I look first 🔍.", text: "Looking: 先看看。" };
    case "cut_mid_char":
      return { text: RARE };
    case "system_prompt":
      return { text: "Told by the system prompt 📜." };
    case "raw_call":
      return { text: RAW_CALL[family]! };
    case "empty_think_calls":
      return { think: "", tool_calls: [{ name: PING, arguments: {} }] };
    case "think_text_call":
      // gpt-oss: analysis, a commentary preamble, then the call: two <|end|> tokens in one answer.
      return { think: "Plan: run it.", text: "Running it now.", tool_calls: [{ name: "shell", arguments: { command: "ls" } }] };
    case "cut_in_reasoning":
      return { think: `Thinking at length: ${LONG_COMMAND}`, text: "Done." };
    case "text_around_calls":
      return { text: TEXT_AROUND_CALLS[family]! };
    case "reasoning_text_around_calls":
      // After reasoning, the text after a call keeps its newlines (only the template's after </think> are not shown).
      return { think: "Plan: look 🔍.", text: TEXT_AROUND_CALLS[family]! };
    case "string_args":
      return { text: STRING_ARGS[family]! };
    case "cut_in_call":
      return { tool_calls: [{ name: "shell", arguments: { command: LONG_COMMAND } }] };
  }
}

/** The second answer: tool calls after a reasoning turn (generated token-in where the template drops that reasoning), else text. */
function secondStep(scenario: Scenario, family: FamilyName, tools: boolean): Step {
  if (scenario === "reasoning_then_calls" && tools) return { tool_calls: [{ name: "shell", arguments: CALL_ARGS }] };
  // Written again after the echo: generated token-in where the template rewrites the first answer (the
  // gateway parses it where the engine's route does not), it must read as the first did.
  if (scenario === "text_around_calls" || scenario === "reasoning_text_around_calls") return firstStep(scenario, family);
  void family;
  return { text: SECOND };
}

const scenarioThinks = (s: Scenario) =>
  s === "reasoning_only" || s === "unicode_reasoning" || s === "reasoning_then_calls" || s === "empty_think_calls" || s === "think_text_call" || s === "cut_in_reasoning" || s === "reasoning_text_around_calls";

function script(scenario: Scenario, family: FamilyName, tools: boolean): string {
  return `#sim: ${pyNumbers(JSON.stringify([firstStep(scenario, family), secondStep(scenario, family, tools), { text: "Finished." }]))}`;
}

type Protocol = "openai_chat" | "openai_responses" | "anthropic" | "gemini";
const PROTOCOLS: Protocol[] = ["openai_chat", "openai_responses", "anthropic", "gemini"];

type Session = Awaited<ReturnType<Harness["openSession"]>>;

/** How each protocol tells an agent its answer was cut by max_tokens. */
const CUT_FINISH: Record<Protocol, string> = { openai_chat: "length", openai_responses: "incomplete", anthropic: "max_tokens", gemini: "MAX_TOKENS" };

/** What the agent saw of an answer. */
interface Answer {
  text: string;
  reasoning: string;
  calls: { name: string; args: unknown }[];
  /** The logprobs the agent asked for (OpenAI chat, Gemini), one per generated token. */
  logprobs?: number[];
  /** Why the answer ended, in the protocol's words (Responses: the response's status). */
  finish: string | null;
  /** The usage's count of generated tokens. */
  outputTokens?: number;
  /** The usage's count of reasoning tokens, where the protocol reports one (Responses, Gemini). */
  reasoningTokens?: number;
}

interface Agent {
  call: (maxTokens?: number) => Promise<Answer>;
  /** Sends the last answer back as the SDK gave it, then a result for each of its tool calls, else "go on". */
  echo: () => void;
}

interface AgentOpts {
  prompt: string;
  /** The script goes in the protocol's system prompt (OpenAI chat: a developer message), the user only says "Do the task." */
  system?: boolean;
  tools: boolean;
  think: boolean;
  profile: ModelProfile;
  stream: boolean;
}

/** Arguments serialised again, compact and keys reversed; ones that do not parse (a cut call's) as they came. */
function reorder(args: string): string {
  const v = argsOf(args);
  return typeof v === "object" && v !== null ? JSON.stringify(Object.fromEntries(Object.entries(v).reverse())) : args;
}

function openaiAgent(s: Session, o: AgentOpts): Agent {
  const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
  const messages: OpenAI.ChatCompletionMessageParam[] = o.system
    ? [
        { role: "developer", content: o.prompt },
        { role: "user", content: "Do the task." },
      ]
    : [{ role: "user", content: o.prompt }];
  let last: Record<string, unknown> = {};
  const tools = o.tools ? { tools: TOOLS.map((f) => ({ type: "function" as const, function: f })) } : {};
  const kwargs = o.profile.thinking.kwarg ? { chat_template_kwargs: { [o.profile.thinking.kwarg]: o.think } } : {};
  return {
    call: async (maxTokens) => {
      const body = { model: "agent", messages, logprobs: true, top_logprobs: 2, ...(maxTokens ? { max_tokens: maxTokens } : {}), ...tools, ...kwargs };
      let text: Record<string, string> = {};
      const logprobs: number[] = [];
      const calls: { id: string; type: "function"; function: { name: string; arguments: string } }[] = [];
      let finish: string | null = null;
      if (!o.stream) {
        const choice = (await client.chat.completions.create(body)).choices[0]!;
        finish = choice.finish_reason;
        const m = choice.message;
        for (const l of choice.logprobs?.content ?? []) logprobs.push(l.logprob);
        // Sent back as most agents do: without the reasoning (the gateway restores it from the record).
        last = { role: "assistant", content: m.content, ...(m.tool_calls?.length ? { tool_calls: m.tool_calls } : {}) };
        text = Object.fromEntries(Object.entries(m).filter(([k, v]) => typeof v === "string" && k !== "role")) as Record<string, string>;
        for (const t of m.tool_calls ?? []) if (t.type === "function") calls.push({ id: t.id, type: "function", function: t.function });
      } else {
        for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
          const choice = chunk.choices[0];
          if (!choice) continue;
          finish = choice.finish_reason ?? finish;
          for (const l of choice.logprobs?.content ?? []) logprobs.push(l.logprob);
          for (const [k, v] of Object.entries(choice.delta)) if (typeof v === "string" && k !== "role") text[k] = (text[k] ?? "") + v;
          addToolCallDeltas(calls, choice.delta.tool_calls);
        }
        last = { role: "assistant", content: text.content ?? null, ...(calls.length ? { tool_calls: calls } : {}) };
      }
      return {
        text: text.content ?? "",
        reasoning: text.reasoning_content ?? text.reasoning ?? "",
        calls: calls.map((c) => ({ name: c.function.name, args: argsOf(c.function.arguments) })),
        logprobs,
        finish,
      };
    },
    echo: () => {
      // Sent back as many agents do: arguments parsed and serialised again (compact, keys reordered).
      const reserialised = ((last.tool_calls ?? []) as { id: string; type: "function"; function: { name: string; arguments: string } }[]).map((c) => ({
        ...c,
        function: { ...c.function, arguments: reorder(c.function.arguments) },
      }));
      messages.push({ ...last, ...(reserialised.length ? { tool_calls: reserialised } : {}) } as unknown as OpenAI.ChatCompletionAssistantMessageParam);
      const calls = (last.tool_calls ?? []) as { id: string }[];
      for (const t of calls) messages.push({ role: "tool", tool_call_id: t.id, content: TOOL_RESULT });
      if (!calls.length) messages.push({ role: "user", content: "go on" });
    },
  };
}

function responsesAgent(s: Session, o: AgentOpts): Agent {
  const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
  const input: OpenAI.Responses.ResponseInputItem[] = [{ role: "user", content: o.system ? "Do the task." : o.prompt }];
  const instructions = o.system ? { instructions: o.prompt } : {};
  let last: OpenAI.Responses.ResponseOutputItem[] = [];
  const tools = o.tools ? { tools: TOOLS.map((f) => ({ type: "function" as const, name: f.name, description: f.description, parameters: f.parameters, strict: false })) } : {};
  const reasoning = o.think ? { reasoning: { effort: "medium" as const, summary: "auto" as const } } : {};
  return {
    call: async (maxTokens) => {
      const body = { model: "agent", input, ...instructions, ...(maxTokens ? { max_output_tokens: maxTokens } : {}), ...tools, ...reasoning };
      let output: OpenAI.Responses.ResponseOutputItem[] = [];
      let reasoningTokens: number | undefined;
      let outputTokens: number | undefined;
      let status: string | null = null;
      if (!o.stream) {
        const r = await client.responses.create(body);
        output = r.output;
        status = r.status ?? null;
        reasoningTokens = r.usage?.output_tokens_details.reasoning_tokens;
        outputTokens = r.usage?.output_tokens;
      } else {
        for await (const ev of await client.responses.create({ ...body, stream: true })) {
          if (ev.type === "response.completed" || ev.type === "response.incomplete") {
            output = ev.response.output;
            status = ev.response.status ?? null;
            reasoningTokens = ev.response.usage?.output_tokens_details.reasoning_tokens;
            outputTokens = ev.response.usage?.output_tokens;
          }
        }
      }
      last = output;
      let text = "";
      let reasoningText = "";
      const calls: Answer["calls"] = [];
      for (const item of output) {
        if (item.type === "message") for (const c of item.content) text += c.type === "output_text" ? c.text : "";
        if (item.type === "reasoning") for (const c of [...item.summary, ...(item.content ?? [])]) reasoningText += c.text;
        if (item.type === "function_call") calls.push({ name: item.name, args: argsOf(item.arguments) });
      }
      return { text, reasoning: reasoningText, calls, outputTokens, finish: status, ...(reasoningTokens !== undefined ? { reasoningTokens } : {}) };
    },
    echo: () => {
      input.push(...(last as OpenAI.Responses.ResponseInputItem[]));
      const calls = last.filter((i): i is OpenAI.Responses.ResponseFunctionToolCall => i.type === "function_call");
      for (const c of calls) input.push({ type: "function_call_output", call_id: c.call_id, output: TOOL_RESULT });
      if (!calls.length) input.push({ role: "user", content: "go on" });
    },
  };
}

function anthropicAgent(s: Session, o: AgentOpts): Agent {
  const client = new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 });
  const messages: Anthropic.MessageParam[] = [{ role: "user", content: o.system ? "Do the task." : o.prompt }];
  const system = o.system ? { system: [{ type: "text" as const, text: o.prompt, cache_control: { type: "ephemeral" as const } }] } : {};
  let last: Anthropic.ContentBlock[] = [];
  const tools = o.tools ? { tools: TOOLS.map((f) => ({ name: f.name, description: f.description, input_schema: f.parameters })) } : {};
  const thinking = o.think ? { thinking: { type: "enabled" as const, budget_tokens: 1024 } } : {};
  return {
    call: async (maxTokens) => {
      const body = { model: "claude-test", max_tokens: maxTokens ?? 2048, messages, ...system, ...tools, ...thinking };
      const m = o.stream ? await client.messages.stream(body).finalMessage() : await client.messages.create(body);
      last = m.content;
      let text = "";
      let reasoning = "";
      const calls: Answer["calls"] = [];
      for (const b of m.content) {
        if (b.type === "text") text += b.text;
        if (b.type === "thinking") reasoning += b.thinking;
        if (b.type === "tool_use") calls.push({ name: b.name, args: b.input });
      }
      return { text, reasoning, calls, outputTokens: m.usage.output_tokens, finish: m.stop_reason };
    },
    echo: () => {
      // Thinking blocks are sent back only with a call (the API may drop them from a turn that ended the
      // exchange); the gateway restores them from the record either way.
      const uses0 = last.some((b) => b.type === "tool_use");
      messages.push({ role: "assistant", content: uses0 ? last : last.filter((b) => b.type !== "thinking" && b.type !== "redacted_thinking") });
      const uses = last.filter((b): b is Anthropic.ToolUseBlock => b.type === "tool_use");
      messages.push({
        role: "user",
        content: uses.length ? uses.map((u) => ({ type: "tool_result" as const, tool_use_id: u.id, content: TOOL_RESULT })) : "go on",
      });
    },
  };
}

function geminiAgent(s: Session, o: AgentOpts): Agent {
  const ai = new GoogleGenAI({ apiKey: s.token, httpOptions: { baseUrl: s.urls.gemini.replace(/\/v1beta\/?$/, "") } });
  const contents: Content[] = [{ role: "user", parts: [{ text: o.system ? "Do the task." : o.prompt }] }];
  const system = o.system ? { systemInstruction: o.prompt } : {};
  let last: Content = { role: "model", parts: [] };
  const tools = o.tools ? { tools: [{ functionDeclarations: TOOLS.map((f) => ({ name: f.name, description: f.description, parametersJsonSchema: f.parameters })) }] } : {};
  const thinking = o.think ? { thinkingConfig: { includeThoughts: true, thinkingBudget: 1024 } } : { thinkingConfig: { thinkingBudget: 0 } };
  return {
    call: async (maxTokens) => {
      const request = {
        model: "gemini-agent",
        contents,
        config: { ...system, responseLogprobs: true, logprobs: 2, ...(maxTokens ? { maxOutputTokens: maxTokens } : {}), ...tools, ...thinking },
      };
      const chunks = o.stream ? [] : [await ai.models.generateContent(request)];
      if (o.stream) for await (const c of await ai.models.generateContentStream(request)) chunks.push(c);
      const parts: Part[] = chunks.flatMap((c) => c.candidates?.[0]?.content?.parts ?? []);
      last = { role: "model", parts };
      const thoughts = chunks.map((c) => c.usageMetadata?.thoughtsTokenCount).findLast((n) => n !== undefined);
      const candidates = chunks.map((c) => c.usageMetadata?.candidatesTokenCount).findLast((n) => n !== undefined);
      const logprobs = chunks.flatMap((c) => c.candidates?.[0]?.logprobsResult?.chosenCandidates ?? []).map((c) => c.logProbability!);
      let text = "";
      let reasoning = "";
      const calls: Answer["calls"] = [];
      for (const p of parts) {
        if (p.text !== undefined && p.thought) reasoning += p.text;
        else if (p.text !== undefined) text += p.text;
        if (p.functionCall) calls.push({ name: p.functionCall.name!, args: p.functionCall.args ?? {} });
      }
      const outputTokens = candidates === undefined ? undefined : candidates + (thoughts ?? 0);
      const finish = chunks.map((c) => c.candidates?.[0]?.finishReason).findLast((f) => f !== undefined) ?? null;
      return { text, reasoning, calls, logprobs, outputTokens, finish, ...(thoughts !== undefined ? { reasoningTokens: thoughts } : {}) };
    },
    echo: () => {
      // Thought parts are not sent back (what gemini-cli keeps is the signature on the call part).
      contents.push({ ...last, parts: (last.parts ?? []).filter((p) => !p.thought) });
      const calls = (last.parts ?? []).flatMap((p) => (p.functionCall ? [p.functionCall] : []));
      contents.push({
        role: "user",
        parts: calls.length ? calls.map((c) => ({ functionResponse: { id: c.id, name: c.name, response: { output: TOOL_RESULT } } })) : [{ text: "go on" }],
      });
    },
  };
}

const AGENTS: Record<Protocol, (s: Session, o: AgentOpts) => Agent> = {
  openai_chat: openaiAgent,
  openai_responses: responsesAgent,
  anthropic: anthropicAgent,
  gemini: geminiAgent,
};

const SCENARIOS: Scenario[] = ["unicode", "markup", "parallel_calls", "empty", "reasoning_only", "unicode_reasoning", "reasoning_then_calls", "cut_mid_char", "system_prompt", "raw_call", "empty_think_calls", "cut_in_call", "think_text_call", "cut_in_reasoning", "text_around_calls", "string_args", "reasoning_text_around_calls"];

// (Only where the profile names a gateway parser: without one, such a vLLM cannot continue token-in at all, and every rewrite is a named break.)
const tokenInByCompletions = (f: FamilyName) => PRESETS[PROFILE_OF_FAMILY[f]!]!.gateway_parser !== null;
const MAIN = FAMILIES.flatMap((family) => ENGINES.filter((e) => !e.startsWith("vllm@") || tokenInByCompletions(family)).map((engine) => [family, engine] as const));

describe.each(MAIN)("%s on %s", (family, engine) => {
  const profile = PRESETS[PROFILE_OF_FAMILY[family]!]!;
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness(`edges-${family.replace(/\W/g, "")}-${engine.replace(/\W/g, "")}`, { family, ...simOf(engine) }, { ROLLGATE_HEALTH_INTERVAL_S: "0" });
  }, 60_000);
  afterAll(async () => h?.close());

  /** The max_tokens that cuts the cut_mid_char answer inside a character: found by a probe call in a session of its own. */
  let midChar: number | undefined;
  const cutMidChar = async (): Promise<number> => {
    if (midChar !== undefined) return midChar;
    const s = await h.openSession();
    await openaiAgent(s, { prompt: script("cut_mid_char", family, true), tools: true, think: false, profile, stream: false }).call();
    const [probe] = await h.records(s.id);
    const tok = getSimState(h.sim).tok;
    midChar = probe!.output_ids.findIndex((_, i) => i >= 8 && tok.decode(probe!.output_ids.slice(0, i)).endsWith("\ufffd"));
    expect(midChar, "a cut inside a character").toBeGreaterThan(0);
    return midChar;
  };

  const scenarios = SCENARIOS.filter((s) => (thinks(profile) || !scenarioThinks(s)) && (s !== "raw_call" || RAW_CALL[family] !== undefined) && ((s !== "text_around_calls" && s !== "reasoning_text_around_calls") || TEXT_AROUND_CALLS[family] !== undefined) && (s !== "string_args" || STRING_ARGS[family] !== undefined)
      // A family that calls tools only with thinking off has no thinking turn with calls.
      && ((s !== "empty_think_calls" && s !== "think_text_call") || !profile.thinking.off_with_tools));
  const cells = PROTOCOLS.flatMap((protocol) => scenarios.flatMap((scenario) => [false, true].map((stream) => [protocol, scenario, stream] as const)));

  it.each(cells)("%s: %s (streamed %s), echoed back: what the model wrote, the engine's ids, continued token for token", async (protocol, scenario, stream) => {
    const s = await h.openSession();
    const step = firstStep(scenario, family);
    const think = scenarioThinks(scenario);
    const tools = !(think && profile.thinking.off_with_tools);
    const cut = scenario === "cut_mid_char" ? await cutMidChar() : scenario === "cut_in_call" || scenario === "cut_in_reasoning" ? CUT_IN_CALL : undefined;
    const system = scenario === "system_prompt";
    const agent = AGENTS[protocol](s, { prompt: `${system ? "You are an agent." : "Do the task."}\n${script(scenario, family, tools)}`, system, tools, think, profile, stream });
    const first = await agent.call(cut);
    // The agent sees exactly what the model wrote (before a call, with the separator the parser leaves);
    // cut inside a character, the whole characters before it.
    if (scenario === "cut_mid_char") expect(step.text!.startsWith(first.text.replace(/\ufffd$/, ""))).toBe(true);
    else if (scenario === "raw_call" || scenario === "cut_in_reasoning" || scenario === "string_args") expect(first.text.trim()).toBe("");
    // Streamed, every piece of text around the calls; not streamed, the text before the first call (vLLM's two parsers).
    else if (scenario === "text_around_calls" || scenario === "reasoning_text_around_calls") expect(["Looking. between After the calls.", "Looking."]).toContain(first.text.replace(/\s+/g, " ").trim());
    else if (scenario !== "markup") expect(first.text.trim()).toBe(step.text ?? "");
    if (scenario === "cut_in_reasoning") expect(step.think!.startsWith(first.reasoning.trim())).toBe(true);
    else if (think) expect(first.reasoning.trim()).toBe(step.think);
    const calls =
      scenario === "raw_call"
        ? [{ name: "shell", arguments: RAW_ARGS(family) }]
        : scenario === "text_around_calls" || scenario === "reasoning_text_around_calls"
          ? ["ls", "pwd"].map((command) => ({ name: "shell", arguments: { command } }))
          : (step.tool_calls ?? []);
    // A call cut inside its arguments reaches the agent with what of them came (or {} where the protocol's arguments are an object).
    if (scenario === "cut_in_call") {
      expect(first.calls.map((c) => c.name)).toEqual(["shell"]);
      // Never a truncated command the agent could take for a whole one: an Anthropic input is {}, streamed or not.
      if (protocol === "anthropic") expect(first.calls[0]!.args).toEqual({});
    }
    // Arguments that are no object: as the engine gave them where the protocol carries a string, {} in an
    // Anthropic tool_use (streamed or not), wrapped as {"value": …} in a Gemini functionCall.
    else if (scenario === "string_args") {
      const written = JSON.parse(/(?:"arguments": |<｜tool▁sep｜>)("(?:[^"\\]|\\.)*")/.exec(step.text!)![1]!) as string;
      const shown = protocol === "anthropic" ? {} : protocol === "gemini" ? { value: written } : written;
      expect(first.calls).toEqual([{ name: "shell", args: shown }]);
    }
    else expect(first.calls).toEqual(calls.map((c) => ({ name: c.name, args: c.arguments })));
    agent.echo();
    const second = await agent.call();
    const next = secondStep(scenario, family, tools);
    if (scenario === "text_around_calls" || scenario === "reasoning_text_around_calls") expect([second.text, second.calls]).toEqual([first.text, first.calls]);
    else {
      expect(second.text.trim()).toBe(next.text ?? "");
      expect(second.calls).toEqual((next.tool_calls ?? []).map((c) => ({ name: c.name, args: c.arguments })));
    }

    if (second.calls.length) {
      // The calls' results go back too, and the conversation goes on: a third answer.
      agent.echo();
      expect((await agent.call()).text.trim()).toBe("Finished.");
    }
    const records = await h.records(s.id);
    expect(records).toHaveLength(second.calls.length ? 3 : 2);
    const [r0, r1] = records as [CompletionRecord, CompletionRecord];
    const state = getSimState(h.sim);
    for (const r of records) {
      expect(r.output_ids.length).toBe(r.output_logprobs.length);
      r.output_ids.forEach((t, i) => expect(r.output_logprobs[i]).toBe(simLogprob(state.weightVersion, [...r.prompt_ids, ...r.output_ids.slice(0, i)], t)));
    }
    // The model wrote its numbers as Python does; the record keeps them so, whatever the agent parsed.
    // A cut answer says so in the agent's protocol; a whole one does not.
    expect(first.finish === CUT_FINISH[protocol], `finish ${first.finish}`).toBe(cut !== undefined);
    // The usage counts every generated token.
    if (protocol !== "openai_chat") expect(first.outputTokens).toBe(r0.output_ids.length);
    // The logprobs the agent asked for are the record's, one per generated token.
    if (first.logprobs) expect(first.logprobs).toEqual(r0.output_logprobs);
    // Reasoning tokens are counted through the token that ends the reasoning (all of them when the answer was cut inside it).
    if ((protocol === "openai_responses" || protocol === "gemini") && think && step.think) {
      const end = state.tok.tokenId(profile.reasoning_end!);
      expect(end).toBeDefined();
      expect(first.reasoningTokens).toBe(scenario === "cut_in_reasoning" ? r0.output_ids.length : r0.output_ids.indexOf(end!) + 1);
    }
    // The test is what it says: some token of the answer is a piece of a character.
    if (scenario === "unicode") expect(r0.output_ids.some((id) => state.tok.decode([id]).includes("\ufffd"))).toBe(true);
    if (scenario === "parallel_calls") expect(state.tok.decode(r0.output_ids)).toMatch(new RegExp(`"one": ?1\\.0.*"big": ?${BIG}`));
    if (cut) expect(r0.output_ids).toHaveLength(cut);
    else if (step.text) expect(state.tok.decode(r0.output_ids)).toContain(step.text);

    const closed = await fetch(`${h.url}/v1/sessions/${s.id}/close?trajectory=prefix_merging`, { method: "POST" });
    expect(closed.status).toBe(200);
    const { trajectory } = (await closed.json()) as { trajectory: Trajectory };
    const breaks = trajectory.stats.breaks;
    if (cut && profile.token_in === "off" && breaks.length) {
      // A cut answer the engine renders back otherwise is not continued where the profile turns token-in off.
      expect(breaks.map((b) => [b.record_id, b.reason])).toEqual([[r1.id, "truncated_output"]]);
      return;
    }
    if (profile.token_in === "off" && breaks.length) {
      // The engine renders this family's history itself and the profile turns token-in off: the
      // break is named, on the second record, never merged over.
      for (const b of breaks) expect(b.reason).toBe("history_rewritten");
      // The break says why in this family's terms: a final answer's end token is rendered back as another.
      if (!step.tool_calls?.length && !think && step.text) expect(breaks[0]!.detail).toContain("<|return|>");
      expect(breaks.map((b) => b.record_id)).toEqual(records.slice(1, breaks.length + 1).map((r) => r.id));
      return;
    }
    expect(trajectory.traces, JSON.stringify(breaks)).toHaveLength(1);
    expect(breaks).toEqual([]);
    records.slice(1).forEach((r, i) => {
      const prev = records[i]!;
      expect(r.prompt_ids.slice(0, prev.prompt_ids.length + prev.output_ids.length)).toEqual([...prev.prompt_ids, ...prev.output_ids]);
    });
    const trace = trajectory.traces[0]!;
    expect(trace.response_ids.filter((_, i) => trace.loss_mask[i] === 1)).toEqual(records.flatMap((r) => r.output_ids));
  });
});

/**
 * A `stop` string that ends inside a token: the agent sees the text before it, the record holds every
 * token the engine generated (the one the string ends in included), and the answer sent back ("The an")
 * is restored so the next call's prompt continues the recorded ids, or the break is named.
 */
const STOP_TEXT = "The answer is 42; the rest 🦀 is never shown.";
const STOP_AT = "swer";
type StopProtocol = "openai_chat" | "anthropic" | "gemini";

async function stopCall(s: Session, protocol: StopProtocol, profile: ModelProfile, stream: boolean, history: unknown[]): Promise<{ text: string; history: unknown[] }> {
  if (protocol === "openai_chat") {
    const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
    const kwargs = profile.thinking.kwarg ? { chat_template_kwargs: { [profile.thinking.kwarg]: false } } : {};
    const body = { model: "agent", messages: history as OpenAI.ChatCompletionMessageParam[], stop: [STOP_AT], ...kwargs };
    let text = "";
    let finish: string | null = null;
    if (!stream) {
      const choice = (await client.chat.completions.create(body)).choices[0]!;
      text = choice.message.content ?? "";
      finish = choice.finish_reason;
    } else {
      for await (const c of await client.chat.completions.create({ ...body, stream: true })) {
        text += c.choices[0]?.delta.content ?? "";
        finish = c.choices[0]?.finish_reason ?? finish;
      }
    }
    expect(finish).toBe("stop");
    return { text, history: [...history, { role: "assistant", content: text }, { role: "user", content: "go on" }] };
  }
  if (protocol === "anthropic") {
    const client = new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 });
    const body = { model: "claude-test", max_tokens: 512, messages: history as Anthropic.MessageParam[], stop_sequences: [STOP_AT] };
    const m = stream ? await client.messages.stream(body).finalMessage() : await client.messages.create(body);
    const text = m.content.map((b) => (b.type === "text" ? b.text : "")).join("");
    // Anthropic tells the agent which of its stop sequences ended the answer.
    if (text === "The an") expect([m.stop_reason, m.stop_sequence]).toEqual(["stop_sequence", STOP_AT]);
    return { text, history: [...history, { role: "assistant", content: m.content }, { role: "user", content: "go on" }] };
  }
  const ai = new GoogleGenAI({ apiKey: s.token, httpOptions: { baseUrl: s.urls.gemini.replace(/\/v1beta\/?$/, "") } });
  const request = { model: "gemini-agent", contents: history as Content[], config: { stopSequences: [STOP_AT], thinkingConfig: { thinkingBudget: 0 } } };
  const chunks = stream ? [] : [await ai.models.generateContent(request)];
  if (stream) for await (const c of await ai.models.generateContentStream(request)) chunks.push(c);
  const parts = chunks.flatMap((c) => c.candidates?.[0]?.content?.parts ?? []);
  return { text: parts.map((p) => p.text ?? "").join(""), history: [...history, { role: "model", parts }, { role: "user", parts: [{ text: "go on" }] }] };
}

describe.each(FAMILIES.flatMap((family) => KINDS.map((kind) => [family, kind] as const)))("%s on %s: stop strings", (family, kind) => {
  const profile = PRESETS[PROFILE_OF_FAMILY[family]!]!;
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness(`edges-stop-${family.replace(/\W/g, "")}-${kind}`, { family, kind }, { ROLLGATE_HEALTH_INTERVAL_S: "0" });
  }, 60_000);
  afterAll(async () => h?.close());

  const protocols: StopProtocol[] = ["openai_chat", "anthropic", "gemini"];
  const cells = protocols.flatMap((p) => [false, true].map((stream) => [p, stream] as const));
  it.each(cells)("%s (streamed %s): a stop string inside a token, echoed back", async (protocol, stream) => {
    const s = await h.openSession();
    const prompt = `Answer.\n#sim: ${JSON.stringify([{ text: STOP_TEXT }, { text: SECOND }])}`;
    const start = protocol === "gemini" ? [{ role: "user", parts: [{ text: prompt }] }] : [{ role: "user", content: prompt }];
    const first = await stopCall(s, protocol, profile, stream, start);
    // gpt-oss's text is harmony's parse of the token ids, so its stop string ends at a token's end.
    expect(first.text).toBe(family === "gpt-oss" ? "The answer" : "The an");
    const second = await stopCall(s, protocol, profile, stream, first.history);
    expect(second.text).toBe(SECOND);

    const [r0, r1] = (await h.records(s.id)) as [CompletionRecord, CompletionRecord];
    const tok = getSimState(h.sim).tok;
    // The record holds the engine's tokens: through the one the stop string ends in.
    expect(tok.decode(r0.output_ids)).toContain("The answer");
    expect(tok.decode(r0.output_ids)).not.toContain(" is");
    const closed = await fetch(`${h.url}/v1/sessions/${s.id}/close?trajectory=prefix_merging`, { method: "POST" });
    const { trajectory } = (await closed.json()) as { trajectory: Trajectory };
    const breaks = trajectory.stats.breaks;
    if (breaks.length) {
      // Not continued: the break is named on the second record.
      expect(breaks.map((b) => b.record_id)).toEqual([r1.id]);
      expect(breaks[0]!.reason, JSON.stringify(breaks)).not.toBe("unknown");
      return;
    }
    expect(r1.prompt_ids.slice(0, r0.prompt_ids.length + r0.output_ids.length)).toEqual([...r0.prompt_ids, ...r0.output_ids]);
  });
});

/**
 * The thinking switch flipped between the calls of one conversation (Qwen3's enable_thinking,
 * DeepSeek-V3.1's thinking), per protocol: each answer is in the mode it was asked in, and the second
 * call's prompt continues the first's prompt + output token for token, or the break is the one the
 * profile names.
 */
type ThinkProtocol = "openai_chat" | "anthropic" | "gemini";
async function thinkCall(s: Session, protocol: ThinkProtocol, profile: ModelProfile, stream: boolean, on: boolean, history: unknown[]) {
  if (protocol === "openai_chat") {
    const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
    const body = { model: "agent", messages: history as OpenAI.ChatCompletionMessageParam[], chat_template_kwargs: { [profile.thinking.kwarg!]: on } };
    const text: Record<string, string> = {};
    if (!stream) {
      const m = (await client.chat.completions.create(body)).choices[0]!.message as unknown as Record<string, unknown>;
      for (const [k, v] of Object.entries(m)) if (typeof v === "string" && k !== "role") text[k] = v;
    } else {
      for await (const c of await client.chat.completions.create({ ...body, stream: true })) {
        for (const [k, v] of Object.entries(c.choices[0]?.delta ?? {})) if (typeof v === "string" && k !== "role") text[k] = (text[k] ?? "") + v;
      }
    }
    const reasoning = text.reasoning_content ?? text.reasoning ?? "";
    return { text: text.content ?? "", reasoning, history: [...history, { role: "assistant", ...text }, { role: "user", content: "go on" }] };
  }
  if (protocol === "anthropic") {
    const client = new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 });
    const body = { model: "claude-test", max_tokens: 2048, messages: history as Anthropic.MessageParam[], thinking: on ? { type: "enabled" as const, budget_tokens: 1024 } : { type: "disabled" as const } };
    const m = stream ? await client.messages.stream(body).finalMessage() : await client.messages.create(body);
    return {
      text: m.content.map((b) => (b.type === "text" ? b.text : "")).join(""),
      reasoning: m.content.map((b) => (b.type === "thinking" ? b.thinking : "")).join(""),
      history: [...history, { role: "assistant", content: m.content }, { role: "user", content: "go on" }],
    };
  }
  const ai = new GoogleGenAI({ apiKey: s.token, httpOptions: { baseUrl: s.urls.gemini.replace(/\/v1beta\/?$/, "") } });
  const request = { model: "gemini-agent", contents: history as Content[], config: { thinkingConfig: on ? { includeThoughts: true, thinkingBudget: 1024 } : { thinkingBudget: 0 } } };
  const chunks = stream ? [] : [await ai.models.generateContent(request)];
  if (stream) for await (const c of await ai.models.generateContentStream(request)) chunks.push(c);
  const parts = chunks.flatMap((c) => c.candidates?.[0]?.content?.parts ?? []);
  return {
    text: parts.map((p) => (p.thought ? "" : (p.text ?? ""))).join(""),
    reasoning: parts.map((p) => (p.thought ? (p.text ?? "") : "")).join(""),
    history: [...history, { role: "model", parts }, { role: "user", parts: [{ text: "go on" }] }],
  };
}

const SWITCHABLE = FAMILIES.filter((f) => {
  const p = PRESETS[PROFILE_OF_FAMILY[f]!]!;
  return p.thinking.kwarg !== null && p.reasoning_end !== null;
});

describe.each(SWITCHABLE.flatMap((family) => KINDS.map((kind) => [family, kind] as const)))("%s on %s: thinking switched per request", (family, kind) => {
  const profile = PRESETS[PROFILE_OF_FAMILY[family]!]!;
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness(`edges-think-${family.replace(/\W/g, "")}-${kind}`, { family, kind }, { ROLLGATE_HEALTH_INTERVAL_S: "0" });
  }, 60_000);
  afterAll(async () => h?.close());

  const protocols: ThinkProtocol[] = ["openai_chat", "anthropic", "gemini"];
  const cells = protocols.flatMap((p) => [[true, false], [false, true], [false, false]].flatMap(([a, b]) => [false, true].map((stream) => [p, a!, b!, stream] as const)));
  it.each(cells)("%s: thinking %s then %s (streamed %s)", async (protocol, on1, on2, stream) => {
    const s = await h.openSession();
    const steps = [
      { ...(on1 ? { think: "First thoughts 🤔." } : {}), text: "First answer 一." },
      { ...(on2 ? { think: "Second thoughts." } : {}), text: "Second answer 二." },
    ];
    const prompt = `Answer.\n#sim: ${JSON.stringify(steps)}`;
    const start = protocol === "gemini" ? [{ role: "user", parts: [{ text: prompt }] }] : [{ role: "user", content: prompt }];
    const first = await thinkCall(s, protocol, profile, stream, on1, start);
    expect(first.text.trim()).toBe(steps[0]!.text);
    expect(first.reasoning.trim()).toBe(steps[0]!.think ?? "");
    const second = await thinkCall(s, protocol, profile, stream, on2, first.history);
    expect(second.text.trim()).toBe(steps[1]!.text);
    expect(second.reasoning.trim()).toBe(steps[1]!.think ?? "");

    const [r0, r1] = (await h.records(s.id)) as [CompletionRecord, CompletionRecord];
    const closed = await fetch(`${h.url}/v1/sessions/${s.id}/close?trajectory=prefix_merging`, { method: "POST" });
    const { trajectory } = (await closed.json()) as { trajectory: Trajectory };
    expect(trajectory.stats.breaks, JSON.stringify(trajectory.stats.breaks)).toEqual([]);
    expect(r1.prompt_ids.slice(0, r0.prompt_ids.length + r0.output_ids.length)).toEqual([...r0.prompt_ids, ...r0.output_ids]);
  });
});

/**
 * The same tokens give the agent the same answer whichever route produced them: a Qwen3 answer on a
 * vLLM whose chat route takes no prompt ids is parsed by the engine's chat route when it is a
 * conversation's first answer, and by the gateway's own parser when it was generated token-in (a
 * later answer, /v1/completions). A call whose JSON is broken, or cut by max_tokens, must read the
 * same both ways (the calls, the text, and a finish that says a cut answer was cut).
 */
const BROKEN_CALLS: Record<string, { text: string; cut?: number }> = {
  // The call object's closing brace is missing: the name is readable, the JSON does not parse.
  broken_json: { text: '<tool_call>\n{"name": "shell", "arguments": {"command": "ls -la"}\n</tool_call>' },
  cut_in_arguments: { text: `<tool_call>\n{"name": "shell", "arguments": {"command": "${LONG_COMMAND}"}}\n</tool_call>`, cut: CUT_IN_CALL },
  // A string of JSON as the arguments: the engine's route passes the string on.
  string_arguments: { text: STRING_ARGS.qwen3! },
};

describe(`qwen3 on vllm@${OLD_VLLM}: a broken or cut call reads the same by either route`, () => {
  const profile = PRESETS[PROFILE_OF_FAMILY.qwen3!]!;
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness("edges-broken-qwen3", { family: "qwen3", kind: "vllm", vllmVersion: OLD_VLLM }, { ROLLGATE_HEALTH_INTERVAL_S: "0" });
  }, 60_000);
  afterAll(async () => h?.close());

  const cells = Object.keys(BROKEN_CALLS).flatMap((c) => PROTOCOLS.flatMap((p) => [false, true].map((stream) => [c, p, stream] as const)));
  it.each(cells)("%s, %s (streamed %s): the engine's chat route and the gateway's token-in parse agree", async (name, protocol, stream) => {
    const { text, cut } = BROKEN_CALLS[name]!;
    const opts = { tools: true, think: false, profile, stream };
    // The engine's chat route: the answer is the conversation's first.
    const a = await h.openSession();
    const byEngine = await AGENTS[protocol](a, { ...opts, prompt: `Do the task.\n#sim: ${JSON.stringify([{ text }])}` }).call(cut);
    // Token-in: the same answer after a first one, generated on /v1/completions and parsed by the gateway.
    const b = await h.openSession();
    const agent = AGENTS[protocol](b, { ...opts, prompt: `Do the task.\n#sim: ${JSON.stringify([{ text: "ok" }, { text }])}` });
    expect((await agent.call()).text).toBe("ok");
    agent.echo();
    const byGateway = await agent.call(cut);
    const [r0, r1] = (await h.records(b.id)) as [CompletionRecord, CompletionRecord];
    expect(r1.prompt_ids.slice(0, r0.prompt_ids.length + r0.output_ids.length), "generated token-in").toEqual([...r0.prompt_ids, ...r0.output_ids]);
    const ra = (await h.records(a.id))[0]!;
    const tok = getSimState(h.sim).tok;
    expect(tok.decode(r1.output_ids)).toBe(tok.decode(ra.output_ids));

    const seen = (x: Answer) => ({ text: x.text, calls: x.calls, finish: x.finish });
    expect(seen(byGateway)).toEqual(seen(byEngine));
    // A cut answer says so; the call reached the agent (an agent told "stop" may end its episode).
    if (cut) expect(byEngine.finish).toBe(CUT_FINISH[protocol]);
    expect(byEngine.calls.map((c) => c.name)).toEqual(["shell"]);
  });
});

/**
 * Llama 3.1 writing two JSON calls in one answer (`{…}; {…}`): the engine's parser gives both, but
 * the family's chat template renders one call per turn and refuses more ("This model only supports
 * single tool-calls at once!"). The agent sends the answer back with both calls' results; its next
 * call must not fail on that render: the conversation goes on, continued from the recorded ids.
 */
describe.each(KINDS)("llama3.1 on %s: two tool calls in one answer, echoed back", (kind) => {
  const profile = PRESETS[PROFILE_OF_FAMILY["llama3.1"]!]!;
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness(`edges-llama2calls-${kind}`, { family: "llama3.1", kind }, { ROLLGATE_HEALTH_INTERVAL_S: "0" });
  }, 60_000);
  afterAll(async () => h?.close());

  const cells = PROTOCOLS.flatMap((p) => [false, true].map((stream) => [p, stream] as const));
  it.each(cells)("%s (streamed %s)", async (protocol, stream) => {
    const s = await h.openSession();
    const calls = ["ls", "pwd"].map((command) => ({ name: "shell", arguments: { command } }));
    const steps = [{ tool_calls: calls }, { text: SECOND }, { text: "Finished." }];
    const agent = AGENTS[protocol](s, { prompt: `Do the task.\n#sim: ${JSON.stringify(steps)}`, tools: true, think: false, profile, stream });
    const first = await agent.call();
    expect(first.calls).toEqual(calls.map((c) => ({ name: c.name, args: c.arguments })));
    agent.echo();
    const second = await agent.call();
    expect(second.text.trim()).toBe(SECOND);
    agent.echo();
    expect((await agent.call()).text.trim()).toBe("Finished.");

    const records = await h.records(s.id);
    expect(records).toHaveLength(3);
    const closed = await fetch(`${h.url}/v1/sessions/${s.id}/close?trajectory=prefix_merging`, { method: "POST" });
    const { trajectory } = (await closed.json()) as { trajectory: Trajectory };
    expect(trajectory.stats.breaks, JSON.stringify(trajectory.stats.breaks)).toEqual([]);
    records.slice(1).forEach((r, i) => {
      const prev = records[i]!;
      expect(r.prompt_ids.slice(0, prev.prompt_ids.length + prev.output_ids.length)).toEqual([...prev.prompt_ids, ...prev.output_ids]);
    });
  });
});

/**
 * A stop string the agent asked for, matched inside a tool call's arguments: the answer was cut by
 * the agent's own stop sequence, so the call is not whole. Every protocol says so as it says a stop
 * sequence: OpenAI chat finish "stop" (never "tool_calls", which would have the agent run a cut
 * call), Anthropic stop_reason "stop_sequence" naming the string; the cut call stays in the answer as
 * the engine gave it (an Anthropic input {}), so the answer sent back continues the recorded ids.
 */
const STOP_IN_CALL = "word9";
describe.each(KINDS)("qwen3 on %s: a stop string inside a tool call", (kind) => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness(`edges-stopcall-${kind}`, { family: "qwen3", kind }, { ROLLGATE_HEALTH_INTERVAL_S: "0" });
  }, 60_000);
  afterAll(async () => h?.close());

  const cells = (["openai_chat", "anthropic"] as const).flatMap((p) => [false, true].map((stream) => [p, stream] as const));
  it.each(cells)("%s (streamed %s)", async (protocol, stream) => {
    const s = await h.openSession();
    const prompt = `Do the task.\n#sim: ${JSON.stringify([{ tool_calls: [{ name: "shell", arguments: { command: LONG_COMMAND } }] }, { text: SECOND }])}`;
    const tools = TOOLS.slice(0, 1);
    let finish: string | null;
    let sequence: string | null = null;
    let calls: string[];
    let second: string;
    if (protocol === "openai_chat") {
      const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
      const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: prompt }];
      const body = { model: "agent", messages, stop: [STOP_IN_CALL], tools: tools.map((f) => ({ type: "function" as const, function: f })), chat_template_kwargs: { enable_thinking: false } };
      let message: OpenAI.ChatCompletionMessage;
      if (!stream) {
        const c = (await client.chat.completions.create(body)).choices[0]!;
        [finish, message] = [c.finish_reason, c.message];
      } else {
        const got = await client.chat.completions.stream({ ...body, stream: true }).finalChatCompletion();
        [finish, message] = [got.choices[0]!.finish_reason, got.choices[0]!.message];
      }
      calls = (message.tool_calls ?? []).map((c) => (c.type === "function" ? c.function.name : ""));
      messages.push({ role: "assistant", content: message.content, ...(message.tool_calls?.length ? { tool_calls: message.tool_calls } : {}) });
      for (const c of message.tool_calls ?? []) messages.push({ role: "tool", tool_call_id: c.id, content: TOOL_RESULT });
      second = (await client.chat.completions.create({ ...body, stop: [] })).choices[0]!.message.content ?? "";
    } else {
      const client = new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 });
      const messages: Anthropic.MessageParam[] = [{ role: "user", content: prompt }];
      const body = { model: "claude-test", max_tokens: 512, messages, stop_sequences: [STOP_IN_CALL], tools: tools.map((f) => ({ name: f.name, description: f.description, input_schema: f.parameters })) };
      const m = stream ? await client.messages.stream(body).finalMessage() : await client.messages.create(body);
      [finish, sequence] = [m.stop_reason, m.stop_sequence];
      const uses = m.content.filter((b) => b.type === "tool_use");
      // Never a truncated command the agent could take for a whole one.
      for (const u of uses) expect(u.input).toEqual({});
      calls = uses.map((u) => u.name);
      messages.push({ role: "assistant", content: m.content });
      messages.push({ role: "user", content: uses.length ? uses.map((u) => ({ type: "tool_result" as const, tool_use_id: u.id, content: TOOL_RESULT })) : "go on" });
      const next = await client.messages.create({ ...body, stop_sequences: [] });
      second = next.content.map((b) => (b.type === "text" ? b.text : "")).join("");
    }
    expect([finish, sequence]).toEqual(protocol === "openai_chat" ? ["stop", null] : ["stop_sequence", STOP_IN_CALL]);
    expect(calls).toEqual(["shell"]);
    expect(second).toBe(SECOND);

    const [r0, r1] = (await h.records(s.id)) as [CompletionRecord, CompletionRecord];
    expect(r0.finish_reason).toBe("stop");
    const tok = getSimState(h.sim).tok;
    expect(tok.decode(r0.output_ids)).toContain(STOP_IN_CALL);
    const closed = await fetch(`${h.url}/v1/sessions/${s.id}/close?trajectory=prefix_merging`, { method: "POST" });
    const { trajectory } = (await closed.json()) as { trajectory: Trajectory };
    expect(trajectory.stats.breaks, JSON.stringify(trajectory.stats.breaks)).toEqual([]);
    expect(r1.prompt_ids.slice(0, r0.prompt_ids.length + r0.output_ids.length)).toEqual([...r0.prompt_ids, ...r0.output_ids]);
  });
});
