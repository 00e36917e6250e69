/**
 * The official OpenAI SDK (`client.responses.create`) against the gateway (listening on a real
 * port) and an in-process engine-sim, on the real Redis under a test key prefix: a two-turn tool
 * conversation as Codex sends it (store: false, encrypted reasoning replayed), streamed and not,
 * and the recorded trajectory is one token-exact trace.
 */
import OpenAI from "openai";
import { getTokenizer } from "@rollgate/engine-sim";
import { type Trace } from "@rollgate/protocol";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TEST_REDIS_URL, dropPrefixes, startHarness, type Harness } from "./__fixtures__/harness.js";
import { buildGateway } from "./app.js";
import { GatewayEnv } from "./env.js";

let h: Harness;

beforeAll(async () => {
  h = await startHarness("resp", { dpSize: 1 });
});

afterAll(() => h?.close());

async function openSession(): Promise<{ id: string; token: string; client: OpenAI }> {
  const s = await h.openSession();
  return { ...s, client: new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 }) };
}

const records = (sid: string) => h.records(sid);

const SYSTEM = "You are a test agent in a terminal.";
const THINK = "I should run the shell.";
const THINK2 = "The command worked.";
const ANSWER = "Done: out.txt holds hi.";
const TOOL_OUTPUT = "Process exited with code 0";
const script = [
  { think: THINK, tool_calls: [{ name: "exec_command", arguments: { cmd: "echo hi > out.txt" } }] },
  { think: THINK2, text: ANSWER },
];
const USER = `Create out.txt containing hi.\n#sim: ${JSON.stringify(script)}`;

// What Codex sends (our own text): developer + user messages, a function tool, a namespace tool
// and the hosted web_search tool, store:false, encrypted reasoning asked for.
const firstTurn = {
  model: "gpt-codex-test",
  instructions: "",
  input: [
    { type: "message", role: "developer", content: [{ type: "input_text", text: SYSTEM }] },
    { type: "message", role: "user", content: [{ type: "input_text", text: USER }] },
  ],
  tools: [
    {
      type: "function",
      name: "exec_command",
      description: "Runs a command",
      strict: false,
      parameters: { type: "object", properties: { cmd: { type: "string" } }, required: ["cmd"], additionalProperties: false },
    },
    {
      type: "namespace",
      name: "agents",
      description: "Sub-agents",
      tools: [{ type: "function", name: "spawn", description: "Spawn a sub-agent", strict: false, parameters: { type: "object", properties: {} } }],
    },
    { type: "web_search", external_web_access: true },
  ],
  tool_choice: "auto",
  parallel_tool_calls: true,
  reasoning: { summary: "auto" },
  store: false,
  include: ["reasoning.encrypted_content"],
  prompt_cache_key: "thread-1",
} as unknown as OpenAI.Responses.ResponseCreateParamsNonStreaming;

type Item = OpenAI.Responses.ResponseOutputItem;

/** One call; streamed, the output items are the `output_item.done` events, as Codex collects them. */
async function call(client: OpenAI, body: OpenAI.Responses.ResponseCreateParamsNonStreaming, stream: boolean) {
  if (!stream) {
    const r = await client.responses.create(body);
    return { response: r, items: r.output, events: [] as string[] };
  }
  const events: OpenAI.Responses.ResponseStreamEvent[] = [];
  for await (const ev of await client.responses.create({ ...body, stream: true })) events.push(ev);
  const items = events.flatMap((e) => (e.type === "response.output_item.done" ? [e.item] : []));
  const done = events.at(-1) as OpenAI.Responses.ResponseCompletedEvent;
  expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
  return { response: done.response, items, events: events.map((e) => e.type) };
}

/** Turn 1 → reasoning + function_call; turn 2, with everything replayed and the tool output → text. */
async function conversation(client: OpenAI, stream: boolean) {
  const t1 = await call(client, firstTurn, stream);
  const fc = t1.items.find((i): i is OpenAI.Responses.ResponseFunctionToolCall => i.type === "function_call");
  const input = [
    ...(firstTurn.input as unknown[]),
    ...t1.items,
    { type: "function_call_output", call_id: fc?.call_id ?? "", output: TOOL_OUTPUT },
  ] as OpenAI.Responses.ResponseInput;
  const t2 = await call(client, { ...firstTurn, input }, stream);
  return { t1, t2 };
}

/** Call ids are the engine's random ones, ids are per response, and sealed reasoning is per session. */
const comparable = (items: Item[]) =>
  items.map((i) => (i.type === "function_call" ? { ...i, call_id: "", id: "" } : i.type === "reasoning" ? { ...i, id: "", encrypted_content: "" } : { ...i, id: "" }));

describe("OpenAI Responses through the gateway", () => {
  const runs: Record<"stream" | "plain", { sid: string; t1: Awaited<ReturnType<typeof call>>; t2: Awaited<ReturnType<typeof call>> }> = {} as never;

  it.each([
    ["plain", false],
    ["stream", true],
  ] as const)("runs a two-turn tool conversation as Codex sends it (%s)", async (name, stream) => {
    const s = await openSession();
    const { t1, t2 } = await conversation(s.client, stream);
    runs[name] = { sid: s.id, t1, t2 };

    const r1 = t1.response;
    expect(r1).toMatchObject({ object: "response", status: "completed", model: "gpt-codex-test" });
    expect(r1.id).toMatch(/^resp_/);
    expect(t1.items.map((i) => i.type)).toEqual(["reasoning", "function_call"]);
    const [reasoning, fc] = t1.items as [OpenAI.Responses.ResponseReasoningItem, OpenAI.Responses.ResponseFunctionToolCall];
    expect(reasoning.summary).toEqual([{ type: "summary_text", text: expect.stringContaining(THINK) }]);
    expect(reasoning.encrypted_content).toBeTruthy();
    expect(fc).toMatchObject({ type: "function_call", name: "exec_command", status: "completed" });
    expect(JSON.parse(fc.arguments)).toEqual({ cmd: "echo hi > out.txt" });
    expect(r1.usage?.output_tokens_details.reasoning_tokens).toBeGreaterThan(0);
    expect(r1.output).toEqual(t1.items);

    const r2 = t2.response;
    expect(r2.status).toBe("completed");
    expect(t2.items.map((i) => i.type)).toEqual(["reasoning", "message"]);
    expect(r2.output_text ?? (t2.items[1] as OpenAI.Responses.ResponseOutputMessage).content[0]).toBeTruthy();
    expect((t2.items[1] as OpenAI.Responses.ResponseOutputMessage).content).toMatchObject([{ type: "output_text", text: ANSWER }]);
    // The engine's prefix cache served the repeated prompt.
    expect(r2.usage?.input_tokens_details.cached_tokens).toBeGreaterThan(0);
    if (stream) {
      expect(t1.events).toEqual([
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        ...t1.events.filter((e) => e === "response.reasoning_summary_text.delta"),
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        ...t1.events.filter((e) => e === "response.function_call_arguments.delta"),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
      ]);
      expect(t2.events).toContain("response.output_text.delta");
      expect(t2.events).toContain("response.content_part.done");
    }

    const recs = await records(s.id);
    expect(recs.map((r) => r.protocol)).toEqual(["openai_responses", "openai_responses"]);
    // The replayed turn is one assistant message with the reasoning we sealed, opened again.
    expect(recs[1]!.request.messages[2]).toEqual({
      role: "assistant",
      content: "",
      reasoning: recs[0]!.message.reasoning,
      tool_calls: [{ id: fc.call_id, type: "function", function: { name: "exec_command", arguments: fc.arguments } }],
    });
    // Hosted tools are not offered; the namespace is flattened.
    expect(recs[0]!.request.tools?.map((t) => t.function.name)).toEqual(["exec_command", "agents__spawn"]);

    // One trace, token-exact: it decodes to the whole conversation.
    const res = await fetch(`${h.url}/v1/sessions/${s.id}/trajectory`);
    const { traces } = (await res.json()) as { traces: Trace[] };
    expect(traces).toHaveLength(1);
    const t = traces[0]!;
    expect(t.completion_ids).toEqual(recs.map((r) => r.id));
    const text = getTokenizer().decode([...t.prompt_ids, ...t.response_ids], false);
    const head = text.slice(0, text.indexOf("<|im_start|>user"));
    expect(head.startsWith(`<|im_start|>system\n${SYSTEM}\n\n# Tools`)).toBe(true);
    expect(head).toContain('"name": "exec_command"');
    expect(head).toContain('"name": "agents__spawn"');
    expect(head).not.toContain("web_search");
    expect(text).toBe(
      head +
        `<|im_start|>user\n${USER}<|im_end|>\n` +
        `<|im_start|>assistant\n<think>\n${THINK}\n</think>\n\n` +
        `<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "echo hi > out.txt"}}\n</tool_call><|im_end|>\n` +
        `<|im_start|>user\n<tool_response>\n${TOOL_OUTPUT}\n</tool_response><|im_end|>\n` +
        `<|im_start|>assistant\n<think>\n${THINK2}\n</think>\n\n${ANSWER}<|im_end|>`,
    );
    const trained = t.response_ids.filter((_, i) => t.loss_mask[i] === 1);
    expect(trained).toEqual([...recs[0]!.output_ids, ...recs[1]!.output_ids]);
  });

  it("records the streamed and the unstreamed conversation identically", async () => {
    const [plain, streamed] = [await records(runs.plain.sid), await records(runs.stream.sid)];
    expect(streamed).toHaveLength(2);
    for (let i = 0; i < 2; i++) {
      expect(streamed[i]!.prompt_ids).toEqual(plain[i]!.prompt_ids);
      expect(streamed[i]!.output_ids).toEqual(plain[i]!.output_ids);
      expect(streamed[i]!.output_logprobs).toEqual(plain[i]!.output_logprobs);
    }
    expect(comparable(runs.stream.t1.items)).toEqual(comparable(runs.plain.t1.items));
    expect(comparable(runs.stream.t2.items)).toEqual(comparable(runs.plain.t2.items));
  });

  it("refuses a wrong key, a closed session, previous_response_id and a bad body in OpenAI's shape", async () => {
    const s = await openSession();
    const base = `${h.url}/s/${s.id}/v1`;
    const ask = (client: OpenAI, extra: Record<string, unknown> = {}) =>
      client.responses.create({ model: "m", input: "hi", ...extra } as OpenAI.Responses.ResponseCreateParamsNonStreaming).catch((e: unknown) => e);

    const denied = await ask(new OpenAI({ apiKey: "sk-wrong", baseURL: base, maxRetries: 0 }));
    expect(denied).toBeInstanceOf(OpenAI.AuthenticationError);
    expect((denied as InstanceType<typeof OpenAI.AuthenticationError>).status).toBe(401);

    const prev = await ask(s.client, { previous_response_id: "resp_123" });
    expect(prev).toBeInstanceOf(OpenAI.BadRequestError);
    const prevErr = prev as InstanceType<typeof OpenAI.BadRequestError>;
    expect(prevErr.param).toBe("previous_response_id");
    expect(prevErr.message).toMatch(/previous_response_id is not supported.*resend the whole conversation in input/);

    const bad = await ask(s.client, { input: [{ type: "function_call", call_id: "c1", arguments: "{}" }] });
    expect(bad).toBeInstanceOf(OpenAI.BadRequestError);
    expect((bad as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("input.0.name");
    expect(await records(s.id)).toEqual([]);

    const ok = await s.client.responses.create({ model: "m", input: "hi", max_output_tokens: 4 });
    expect(ok.status).toBe("incomplete");
    expect(ok.incomplete_details).toEqual({ reason: "max_output_tokens" });

    expect((await fetch(`${h.url}/v1/sessions/${s.id}/close`, { method: "POST" })).status).toBe(200);
    const closed = await ask(s.client);
    expect(closed).toBeInstanceOf(OpenAI.PermissionDeniedError);
  });

  it("a tool_choice naming a function that is not declared is a 400 naming tool_choice, and uses up none of the session's calls", async () => {
    const opened = await fetch(`${h.url}/v1/sessions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ limits: { max_llm_calls: 1 } }) });
    const s = (await opened.json()) as { id: string; token: string; urls: { openai: string } };
    const client = new OpenAI({ apiKey: s.token, baseURL: s.urls.openai, maxRetries: 0 });
    const tools: OpenAI.Responses.FunctionTool[] = [{ type: "function", name: "shell", parameters: { type: "object", properties: {} }, strict: false }];
    for (const tool_choice of [{ type: "function" as const, name: "no_such_tool" }, { type: "function" as const, name: "shell", namespace: "elsewhere" }]) {
      const refused = await client.responses.create({ model: "m", input: "hi", tools, tool_choice }).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(OpenAI.BadRequestError);
      expect(refused).toMatchObject({ param: "tool_choice.name", message: expect.stringMatching(/not declared/) });
    }
    expect((await client.responses.create({ model: "m", input: "hi", tools, tool_choice: { type: "function", name: "shell" }, max_output_tokens: 8 })).output.length).toBeGreaterThan(0);
    expect((await records(s.id)).map((r) => r.seq)).toEqual([0]);
  });

  it("answers an unreachable engine with 502 in OpenAI's shape, streaming or not", async () => {
    const p2 = `${h.prefix}-down`;
    const env = GatewayEnv.parse({ REDIS_URL: TEST_REDIS_URL, ROLLGATE_KEY_PREFIX: p2, ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: "http://127.0.0.1:9", dp_size: 1 }]) });
    const down = await buildGateway({ env, logger: pino({ level: "silent" }) });
    try {
      const s = (await down.inject({ method: "POST", url: "/v1/sessions", payload: {} })).json() as { id: string; token: string };
      for (const stream of [false, true]) {
        const res = await down.inject({
          method: "POST",
          url: `/s/${s.id}/v1/responses`,
          headers: { authorization: `Bearer ${s.token}`, "content-type": "application/json" },
          payload: { model: "m", input: "hi", stream },
        });
        expect(res.statusCode).toBe(502);
        expect(res.json().error).toMatchObject({ type: "api_error", message: expect.stringMatching(/engine/) });
      }
    } finally {
      await down.close();
      await dropPrefixes([p2]);
    }
  });
});

describe("OpenAI Responses logprobs (include: message.output_text.logprobs)", () => {
  // Characters the tokenizer splits over several tokens (🦜: three, 龘: three), so the text has
  // tokens that are not whole characters: the engine spells each piece as U+FFFD, as vLLM does.
  const TEXT = "Done \u2713 \u{1F99C} \u9F98 out.txt holds hi.";
  const body = {
    model: "m",
    input: `Say it.\n#sim: ${JSON.stringify([{ think: "Say it.", text: TEXT }])}`,
  } as OpenAI.Responses.ResponseCreateParamsNonStreaming;
  const asked = { ...body, include: ["message.output_text.logprobs"], top_logprobs: 2 } as OpenAI.Responses.ResponseCreateParamsNonStreaming;

  /** The record's text tokens: after `</think>` and the template's newlines, before the stop token. */
  function textSpan(rec: { output_ids: number[] }): [number, number] {
    const tok = getTokenizer();
    const pieces = rec.output_ids.map((id) => tok.decode([id], false));
    let a = pieces.indexOf("</think>") + 1;
    while (a < pieces.length && /^\n+$/.test(pieces[a]!)) a++;
    const b = pieces.lastIndexOf("<|im_end|>");
    expect(a).toBeGreaterThan(0);
    expect(b).toBe(pieces.length - 1);
    expect(tok.decode(rec.output_ids.slice(a, b), false)).toBe(TEXT);
    return [a, b];
  }

  type Lp = OpenAI.Responses.ResponseOutputText.Logprob;
  function expectRecords(logprobs: Lp[], rec: { output_ids: number[]; output_logprobs: number[] }) {
    const [a, b] = textSpan(rec);
    // One per text token, each the record's.
    expect(logprobs.map((l) => l.logprob)).toEqual(rec.output_logprobs.slice(a, b));
    const lossy = new TextDecoder("utf-8", { fatal: false });
    expect(logprobs.map((l) => l.token)).toEqual(rec.output_ids.slice(a, b).map((id) => lossy.decode(getTokenizer().tokenBytes(id))));
    expect(logprobs.map((l) => l.token).join("")).toContain("\uFFFD");
    for (const l of logprobs) {
      expect(l.top_logprobs).toHaveLength(2);
      expect(l.top_logprobs[0]).toMatchObject({ token: l.token, logprob: l.logprob });
    }
  }

  it("gives the text's logprobs, one per token, the record's (not streamed)", async () => {
    const s = await openSession();
    const r = await s.client.responses.create(asked);
    const msg = r.output.find((i): i is OpenAI.Responses.ResponseOutputMessage => i.type === "message")!;
    const part = msg.content[0] as OpenAI.Responses.ResponseOutputText;
    expect(part.text).toBe(TEXT);
    const [rec] = await records(s.id);
    expectRecords(part.logprobs!, rec!);

    // Without the include nothing changes.
    const plain = await s.client.responses.create(body);
    const plainMsg = plain.output.find((i): i is OpenAI.Responses.ResponseOutputMessage => i.type === "message")!;
    expect(plainMsg.content).toEqual([{ type: "output_text", text: TEXT, annotations: [], logprobs: [] }]);
  });

  it("streams them on the text deltas, the record's, and the same in the final response (streamed)", async () => {
    const s = await openSession();
    const events: OpenAI.Responses.ResponseStreamEvent[] = [];
    for await (const ev of await s.client.responses.create({ ...asked, stream: true })) events.push(ev);
    const deltas = events.filter((e): e is OpenAI.Responses.ResponseTextDeltaEvent => e.type === "response.output_text.delta");
    const streamed = deltas.flatMap((e) => e.logprobs) as Lp[];
    const [rec] = await records(s.id);
    expectRecords(streamed, rec!);
    const done = events.at(-1) as OpenAI.Responses.ResponseCompletedEvent;
    const msg = done.response.output.find((i): i is OpenAI.Responses.ResponseOutputMessage => i.type === "message")!;
    expect((msg.content[0] as OpenAI.Responses.ResponseOutputText).logprobs).toEqual(streamed);

    const plain: OpenAI.Responses.ResponseStreamEvent[] = [];
    for await (const ev of await s.client.responses.create({ ...body, stream: true })) plain.push(ev);
    const plainDeltas = plain.filter((e): e is OpenAI.Responses.ResponseTextDeltaEvent => e.type === "response.output_text.delta");
    expect(plainDeltas.map((e) => e.delta).join("")).toBe(TEXT);
    expect(plainDeltas.every((e) => e.logprobs.length === 0)).toBe(true);
  });
});
