/**
 * Token-exact trajectories through the gateway: echoed history restored from the session's records,
 * and token-in continuation where Qwen3's template cannot round-trip the history (issue 5). The
 * gateway runs in-process (Fastify inject) against an in-process engine-sim (real Qwen3 tokenizer
 * and chat template, scripted by `#sim:`) on the real Redis, each gateway under its own key prefix.
 */
import { randomUUID } from "node:crypto";
import Anthropic from "@anthropic-ai/sdk";
import type { CompletionRecord, Trajectory } from "@rollgate/protocol";
import { buildEngineSim, getTokenizer, simLogprob } from "@rollgate/engine-sim";
import type { FastifyInstance } from "fastify";
import fc from "fast-check";
import { Redis } from "ioredis";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildGateway } from "./app.js";
import { fromSse, type AssistantAnswer } from "./__fixtures__/openai-sse.js";
import { GatewayEnv, loadGatewayEnv } from "./env.js";

const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const prefixes: string[] = [];
const apps: FastifyInstance[] = [];
let sim: FastifyInstance;
let simUrl: string;

type Mode = "auto" | "render" | "token_in";
const gateways = new Map<Mode, FastifyInstance>();

async function gateway(mode: Mode, listen = false): Promise<FastifyInstance> {
  const have = listen ? undefined : gateways.get(mode);
  if (have) return have;
  const prefix = `test-cont-${randomUUID().slice(0, 8)}`;
  prefixes.push(prefix);
  const env = GatewayEnv.parse({
    REDIS_URL,
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: simUrl, dp_size: 1, profile: "qwen3" }]),
    ROLLGATE_HEALTH_INTERVAL_S: "0",
    ROLLGATE_CONTINUATION: mode,
  });
  const app = await buildGateway({ env, logger: pino({ level: "silent" }) });
  apps.push(app);
  if (listen) await app.listen({ port: 0, host: "127.0.0.1" });
  else gateways.set(mode, app);
  return app;
}

beforeAll(async () => {
  sim = buildEngineSim({ dpSize: 1, model: "Qwen/Qwen3-8B" });
  await sim.listen({ port: 0, host: "127.0.0.1" });
  const addr = sim.server.address();
  simUrl = `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}`;
});

afterAll(async () => {
  for (const app of apps) await app.close();
  await sim.close();
  const redis = new Redis(REDIS_URL);
  for (const p of prefixes) {
    const found = [...(await redis.keys(`${p}:*`)), ...(await redis.keys(`{${p}:*`))];
    if (found.length) await redis.del(...found);
  }
  redis.disconnect();
});

const TOOLS = [
  {
    type: "function",
    function: {
      name: "shell",
      description: "Run a shell command",
      parameters: { type: "object", properties: { command: { type: "string" } }, required: ["command"] },
    },
  },
  {
    type: "function",
    function: { name: "read", description: "Read a file", parameters: { type: "object", properties: { path: { type: "string" } } } },
  },
];

interface AgentOptions {
  /** One script per user turn: the first goes in the first user message, later ones open new user turns. */
  scripts: SimStep[][];
  thinking: boolean;
  /** Echo assistant turns without `reasoning` (what OpenAI-SDK agents do). */
  dropReasoning: boolean;
  stream: boolean;
}


/**
 * A minimal OpenAI-chat agent: calls the model, runs every tool call (the result names the call),
 * echoes its history back its own way, and opens the next user turn when the model stops calling tools.
 */
async function runAgent(app: FastifyInstance, opts: AgentOptions) {
  const s = (await app.inject({ method: "POST", url: "/v1/sessions", payload: {} })).json() as { id: string; token: string };
  const messages: Record<string, unknown>[] = [{ role: "system", content: "You are a careful agent." }];
  const answers: AssistantAnswer[] = [];
  for (let turn = 0; turn < opts.scripts.length; turn++) {
    messages.push({ role: "user", content: `Task part ${turn + 1}.\n#sim: ${JSON.stringify(opts.scripts[turn])}` });
    for (let step = 0; step < 12; step++) {
      const res = await app.inject({
        method: "POST",
        url: `/s/${s.id}/v1/chat/completions`,
        headers: { authorization: `Bearer ${s.token}` },
        payload: {
          model: "agent",
          messages,
          tools: TOOLS,
          stream: opts.stream,
          chat_template_kwargs: { enable_thinking: opts.thinking },
        },
      });
      expect(res.statusCode, res.body).toBe(200);
      const answer: AssistantAnswer = opts.stream ? fromSse(res.body) : (res.json().choices[0].message as AssistantAnswer);
      answers.push({ content: answer.content ?? null, reasoning: answer.reasoning ?? null, tool_calls: answer.tool_calls ?? [] });
      const echo: Record<string, unknown> = { role: "assistant", content: answer.content ?? null };
      if (!opts.dropReasoning && answer.reasoning) echo.reasoning = answer.reasoning;
      if (answer.tool_calls?.length) echo.tool_calls = answer.tool_calls.map((t) => ({ id: t.id, type: "function", function: t.function }));
      messages.push(echo);
      if (!answer.tool_calls?.length) break;
      for (const t of answer.tool_calls) messages.push({ role: "tool", tool_call_id: t.id, content: `result of ${t.function.name} ${t.function.arguments}` });
    }
  }
  const records = ((await app.inject({ url: `/v1/sessions/${s.id}/completions` })).json() as { completions: CompletionRecord[] }).completions;
  const trajectory = (await app.inject({ url: `/v1/sessions/${s.id}/trajectory` })).json() as Trajectory;
  return { session: s.id, messages, answers, records, trajectory };
}

/** A `#sim:` step (docs/sim-policy.md#steps), with plain JSON arguments (the script is sent as JSON text). */
interface SimStep {
  text?: string;
  think?: string;
  tool_calls?: { name: string; arguments: Record<string, unknown> }[];
  finish?: "stop" | "length";
}

const call = (name: string, args: Record<string, unknown>) => ({ name, arguments: args });

/** A tool conversation: thinking (when on), text beside calls, several calls in one turn, a float argument. */
function toolScript(thinking: boolean): SimStep[] {
  const think = (t: string) => (thinking ? { think: t } : {});
  return [
    { ...think("First I look around."), tool_calls: [call("shell", { command: "ls -la" })] },
    { ...think("Two files to read."), text: "Reading both.", tool_calls: [call("read", { path: "a.txt" }), call("read", { path: "b.txt", scale: 2.5 })] },
    { ...think("Now the summary."), tool_calls: [call("shell", { command: "wc -l a.txt b.txt" })] },
    { ...think("Done."), text: "Both files are short." },
  ];
}

/** Every trainable token is an engine output token with its logprob, and the trace decodes to the engine's view. */
function expectTokenExact(traj: Trajectory, records: CompletionRecord[]) {
  const trace = traj.traces[0]!;
  const byId = new Map(records.map((r) => [r.id, r]));
  const sampled: number[] = [];
  const sampledLps: number[] = [];
  for (const id of trace.completion_ids) {
    const r = byId.get(id)!;
    sampled.push(...r.output_ids);
    sampledLps.push(...r.output_logprobs);
    // The logprobs are the engine's: engine-sim's documented function of (weights, context, token).
    r.output_ids.forEach((t, i) => expect(r.output_logprobs[i]).toBe(simLogprob("0", [...r.prompt_ids, ...r.output_ids.slice(0, i)], t)));
  }
  expect(trace.response_ids.filter((_, i) => trace.loss_mask[i] === 1)).toEqual(sampled);
  expect(trace.response_logprobs.filter((_, i) => trace.loss_mask[i] === 1)).toEqual(sampledLps);
  expect(trace.response_logprobs.filter((_, i) => trace.loss_mask[i] === 0).every((x) => x === 0)).toBe(true);
  const last = records.at(-1)!;
  expect([...trace.prompt_ids, ...trace.response_ids]).toEqual([...last.prompt_ids, ...last.output_ids]);
}

const decode = (ids: number[]) => getTokenizer().decode(ids);

describe("ROLLGATE_CONTINUATION", () => {
  it("defaults to auto and refuses an unknown mode at start-up", () => {
    const engines = JSON.stringify([{ kind: "vllm", url: "http://e:8000" }]);
    expect(loadGatewayEnv({ ROLLGATE_ENGINES: engines }).ROLLGATE_CONTINUATION).toBe("auto");
    expect(loadGatewayEnv({ ROLLGATE_ENGINES: engines, ROLLGATE_CONTINUATION: "token_in" }).ROLLGATE_CONTINUATION).toBe("token_in");
    expect(() => loadGatewayEnv({ ROLLGATE_ENGINES: engines, ROLLGATE_CONTINUATION: "sometimes" })).toThrow(/ROLLGATE_CONTINUATION/);
  });
});

describe("echoed history restored from the records (thinking on)", () => {
  it("an agent that drops `reasoning` still gets one trace, even with the engine rendering every call", async () => {
    for (const mode of ["render", "auto"] as const) {
      const run = await runAgent(await gateway(mode), { scripts: [toolScript(true)], thinking: true, dropReasoning: true, stream: false });
      expect(run.records).toHaveLength(4);
      expect(run.trajectory.traces, `${mode}: ${JSON.stringify(run.trajectory.stats.breaks)}`).toHaveLength(1);
      expect(run.trajectory.stats.breaks).toEqual([]);
      expectTokenExact(run.trajectory, run.records);
      // The agent sent no reasoning; the records (what the engine rendered) carry it back.
      expect(run.messages.filter((m) => m.role === "assistant").every((m) => m.reasoning === undefined)).toBe(true);
      expect(run.records[3]!.request.messages.filter((m) => m.role === "assistant").map((m) => (m as { reasoning?: string }).reasoning)).toEqual([
        "\nFirst I look around.\n",
        "\nTwo files to read.\n",
        "\nNow the summary.\n",
      ]);
      // Nothing needed token-in: the restored history renders to the recorded tokens.
      const text = decode([...run.records[3]!.prompt_ids]);
      expect(text).toContain("<think>\nTwo files to read.\n</think>\n\nReading both.\n<tool_call>");
    }
  });
});

describe("thinking off: the template drops the empty <think></think> block of earlier turns", () => {
  it("auto continues token-in: one trace, token-exact", async () => {
    const run = await runAgent(await gateway("auto"), { scripts: [toolScript(false)], thinking: false, dropReasoning: true, stream: false });
    expect(run.records).toHaveLength(4);
    expect(run.trajectory.traces, JSON.stringify(run.trajectory.stats.breaks)).toHaveLength(1);
    expectTokenExact(run.trajectory, run.records);
    const text = decode([...run.records[3]!.prompt_ids, ...run.records[3]!.output_ids]);
    // Every earlier turn keeps the empty think block the model actually saw in its generation prompt.
    expect(text.match(/<\|im_start\|>assistant\n<think>\n\n<\/think>\n\n/g)).toHaveLength(4);
    expect(text).toContain('<tool_call>\n{"name": "read", "arguments": {"path": "b.txt", "scale": 2.5}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>');
    expect(text.endsWith("<|im_start|>assistant\n<think>\n\n</think>\n\nBoth files are short.<|im_end|>")).toBe(true);
  });

  it("render breaks on every turn, and every break is explained as history_rewritten", async () => {
    const run = await runAgent(await gateway("render"), { scripts: [toolScript(false)], thinking: false, dropReasoning: true, stream: false });
    expect(run.records).toHaveLength(4);
    expect(run.trajectory.traces).toHaveLength(4);
    const breaks = run.trajectory.stats.breaks;
    expect(breaks.map((b) => b.record_id)).toEqual(run.records.slice(1).map((r) => r.id));
    for (const b of breaks) {
      expect(b.reason).toBe("history_rewritten");
      expect(b.detail, JSON.stringify(breaks)).toMatch(/think/);
    }
  });
});

describe("thinking on with a second user query: Qwen3 drops earlier reasoning", () => {
  const scripts = [
    [
      { think: "Look first.", tool_calls: [call("shell", { command: "ls" })] },
      { think: "Enough.", text: "There is one file." },
    ],
    [{ think: "The user wants more.", text: "Here is more." }],
  ];

  it("render: the break is detected and explained, not merged", async () => {
    const run = await runAgent(await gateway("render"), { scripts, thinking: true, dropReasoning: false, stream: false });
    expect(run.records).toHaveLength(3);
    expect(run.trajectory.traces).toHaveLength(2);
    const [b] = run.trajectory.stats.breaks;
    expect(b).toMatchObject({ record_id: run.records[2]!.id, reason: "history_rewritten" });
    expect(b!.detail).toMatch(/reasoning/);
    // The engine saw the history without the earlier reasoning.
    expect(decode(run.records[2]!.prompt_ids)).not.toContain("<think>\nLook first.");
  });

  it("auto: continues token-in, keeping the reasoning the model actually saw (one trace)", async () => {
    const run = await runAgent(await gateway("auto"), { scripts, thinking: true, dropReasoning: false, stream: false });
    expect(run.trajectory.traces).toHaveLength(1);
    expectTokenExact(run.trajectory, run.records);
    const text = decode(run.records[2]!.prompt_ids);
    expect(text).toContain("<think>\nLook first.\n</think>\n\n<tool_call>");
    expect(text).toContain("<think>\nEnough.\n</think>\n\nThere is one file.<|im_end|>\n<|im_start|>user\nTask part 2.");
  });
});

describe("token-in generation", () => {
  it("gives identical records streamed or not, and the same answers as the engine's chat route", async () => {
    const script = toolScript(false);
    const [plain, streamed, rendered] = await Promise.all([
      runAgent(await gateway("token_in"), { scripts: [script], thinking: false, dropReasoning: true, stream: false }),
      runAgent(await gateway("token_in"), { scripts: [script], thinking: false, dropReasoning: true, stream: true }),
      runAgent(await gateway("render"), { scripts: [script], thinking: false, dropReasoning: true, stream: false }),
    ]);
    const strip = (r: CompletionRecord) => ({
      prompt_ids: r.prompt_ids,
      output_ids: r.output_ids,
      output_logprobs: r.output_logprobs,
      finish_reason: r.finish_reason,
      usage: { prompt_tokens: r.usage.prompt_tokens, completion_tokens: r.usage.completion_tokens },
      message: { ...r.message, tool_calls: r.message.tool_calls.map((t) => t.function) },
      request: r.request.messages.map((m) => (m.role === "assistant" ? { ...m, tool_calls: m.tool_calls?.map((t) => t.function) } : m.role === "tool" ? m.content : m)),
    });
    expect(streamed.records.map(strip)).toEqual(plain.records.map(strip));
    const answer = (a: AssistantAnswer) => ({ content: a.content, reasoning: a.reasoning, tool_calls: a.tool_calls.map((t) => t.function) });
    expect(plain.answers.map(answer)).toEqual(rendered.answers.map(answer));
    expect(streamed.answers.map(answer)).toEqual(rendered.answers.map(answer));
    expect(plain.records.map((r) => r.finish_reason)).toEqual(rendered.records.map((r) => r.finish_reason));
    // Engine-issued tool-call ids in vLLM's shape.
    expect(plain.answers[0]!.tool_calls[0]!.id).toMatch(/^chatcmpl-tool-[0-9a-f]{32}$/);
    expect(plain.trajectory.traces).toHaveLength(1);
    expect(streamed.trajectory.traces).toHaveLength(1);
  });

  it("continues after an answer cut on length: <|im_end|> is interstitial glue, never trained on", async () => {
    const run = await runAgent(await gateway("token_in"), {
      scripts: [[{ text: "a long answer that is cut", finish: "length" }], [{ text: "after" }]],
      thinking: false,
      dropReasoning: true,
      stream: false,
    });
    const [r0, r1] = run.records as [CompletionRecord, CompletionRecord];
    expect(r0.finish_reason).toBe("length");
    const imEnd = getTokenizer().encode("<|im_end|>")[0]!;
    expect(r0.output_ids.at(-1)).not.toBe(imEnd);
    expect(r1.prompt_ids.slice(0, r0.prompt_ids.length + r0.output_ids.length + 1)).toEqual([...r0.prompt_ids, ...r0.output_ids, imEnd]);
    expect(run.trajectory.traces).toHaveLength(1);
    const trace = run.trajectory.traces[0]!;
    expect(trace.response_ids[r0.output_ids.length]).toBe(imEnd);
    expect(trace.loss_mask[r0.output_ids.length]).toBe(0);
    expectTokenExact(run.trajectory, run.records);
  });
});

describe("token-in under every protocol's stream encoder", () => {
  it("Anthropic SDK, streamed, thinking disabled: tool_use blocks, stop reasons and one trace", async () => {
    const app = await gateway("token_in", true);
    const addr = app.server.address();
    const url = `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}`;
    const s = (await (await fetch(`${url}/v1/sessions`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" })).json()) as {
      id: string;
      token: string;
      urls: { anthropic: string };
    };
    const client = new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 });
    const script = [
      { text: "Listing.", tool_calls: [call("bash", { command: "ls" })] },
      { tool_calls: [call("bash", { command: "cat a.txt" }), call("bash", { command: "cat b.txt" })] },
      { text: "All read." },
    ];
    const tools: Anthropic.Tool[] = [{ name: "bash", description: "Run a command", input_schema: { type: "object", properties: { command: { type: "string" } } } }];
    const messages: Anthropic.MessageParam[] = [{ role: "user", content: `Read the files.\n#sim: ${JSON.stringify(script)}` }];
    const stops: (string | null)[] = [];
    for (let i = 0; i < 3; i++) {
      const m = await client.messages
        .stream({ model: "claude-test", max_tokens: 256, tools, thinking: { type: "disabled" }, messages })
        .finalMessage();
      stops.push(m.stop_reason);
      messages.push({ role: "assistant", content: m.content });
      const uses = m.content.filter((b): b is Anthropic.ToolUseBlock => b.type === "tool_use");
      if (uses.length === 0) {
        expect(m.content).toEqual([{ type: "text", text: "All read." }]);
        break;
      }
      if (i === 1) expect(uses.map((u) => u.input)).toEqual([{ command: "cat a.txt" }, { command: "cat b.txt" }]);
      messages.push({ role: "user", content: uses.map((u) => ({ type: "tool_result" as const, tool_use_id: u.id, content: `ran ${JSON.stringify(u.input)}` })) });
    }
    expect(stops).toEqual(["tool_use", "tool_use", "end_turn"]);
    const records = ((await (await fetch(`${url}/v1/sessions/${s.id}/completions`)).json()) as { completions: CompletionRecord[] }).completions;
    const trajectory = (await (await fetch(`${url}/v1/sessions/${s.id}/trajectory`)).json()) as Trajectory;
    expect(trajectory.traces, JSON.stringify(trajectory.stats.breaks)).toHaveLength(1);
    expectTokenExact(trajectory, records);
  });
});

describe("property: random multi-turn tool conversations through gateway + engine-sim (auto)", () => {
  const word = fc.constantFrom("alpha", "beta", "über", "数据", "x y", 'quote "q"', "tab\tand\\slash");
  const args = fc.dictionary(fc.constantFrom("path", "command", "n", "flag", "list"), fc.oneof(word, fc.integer({ min: -5, max: 99 }), fc.boolean(), fc.constant(2.5), fc.array(word, { maxLength: 2 })), {
    minKeys: 0,
    maxKeys: 3,
  });
  const toolStep = fc.record({
    think: fc.option(word, { nil: undefined }),
    text: fc.option(word, { nil: undefined }),
    tool_calls: fc.array(fc.record({ name: fc.constantFrom("shell", "read"), arguments: args }), { minLength: 1, maxLength: 2 }),
  });
  const finalStep = fc.record({ think: fc.option(word, { nil: undefined }), text: word });
  const userTurn = fc.tuple(fc.array(toolStep, { minLength: 0, maxLength: 3 }), finalStep).map(([tools, last]) => [...tools, last].map(clean));
  function clean(step: Record<string, unknown>): SimStep {
    return Object.fromEntries(Object.entries(step).filter(([, v]) => v !== undefined)) as SimStep;
  }

  it("one trace; trainable tokens are exactly the engine's with their logprobs; the trace decodes to the engine's view", async () => {
    const app = await gateway("auto");
    await fc.assert(
      fc.asyncProperty(
        fc.array(userTurn, { minLength: 1, maxLength: 2 }),
        fc.boolean(),
        fc.boolean(),
        fc.boolean(),
        async (scripts, thinking, dropReasoning, stream) => {
          const run = await runAgent(app, { scripts, thinking, dropReasoning, stream });
          expect(run.records.length).toBe(scripts.flat().length);
          expect(run.trajectory.traces, JSON.stringify(run.trajectory.stats.breaks)).toHaveLength(1);
          expectTokenExact(run.trajectory, run.records);
          // The engine's view holds the final conversation: every user turn, tool result and answer.
          const trace = run.trajectory.traces[0]!;
          const text = decode([...trace.prompt_ids, ...trace.response_ids]);
          let at = 0;
          for (const m of run.messages) {
            const piece =
              m.role === "tool" || m.role === "user" || m.role === "system"
                ? (m.content as string)
                : ((m.content as string | null) ?? "").trim();
            if (piece === "") continue;
            const found = text.indexOf(piece, at);
            expect(found, `message ${JSON.stringify(m)} not in order in ${text}`).toBeGreaterThanOrEqual(0);
            at = found + piece.length;
          }
        },
      ),
      { numRuns: 10 },
    );
  }, 120_000);
});
