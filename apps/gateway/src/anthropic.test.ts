/**
 * The official Anthropic SDK against the gateway (listening on a real port) and an in-process
 * engine-sim, on the real Redis under a test key prefix: a two-turn tool conversation streamed
 * and not, and the recorded trajectory is one token-exact trace.
 */
import Anthropic from "@anthropic-ai/sdk";
import { getTokenizer } from "@rollgate/engine-sim";
import { type CompletionRecord, type Trace } from "@rollgate/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startHarness, type Harness } from "./__fixtures__/harness.js";

let h: Harness;

beforeAll(async () => {
  h = await startHarness("anth", { dpSize: 1 });
});

afterAll(() => h?.close());

async function openSession(): Promise<{ id: string; token: string; client: Anthropic }> {
  const s = await h.openSession();
  return { ...s, client: new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 }) };
}

const records = (sid: string) => h.records(sid);

const SYSTEM = "You are a test agent.";
const THINK = "I should run the shell.";
const ANSWER = "Done: hello.txt holds hi.";
const script = [
  { think: THINK, tool_calls: [{ name: "bash", arguments: { command: "echo hi > hello.txt" } }] },
  { text: ANSWER },
];
const USER = `Create hello.txt containing hi.\n#sim: ${JSON.stringify(script)}`;
const tools: Anthropic.Tool[] = [
  {
    name: "bash",
    description: "Run a shell command",
    input_schema: { type: "object", properties: { command: { type: "string" } }, required: ["command"] },
  },
];
const firstTurn = {
  model: "claude-sonnet-test",
  max_tokens: 512,
  system: [{ type: "text" as const, text: SYSTEM, cache_control: { type: "ephemeral" as const } }],
  tools,
  thinking: { type: "enabled" as const, budget_tokens: 1024 },
  messages: [{ role: "user" as const, content: USER }],
};

/** Turn 1 → thinking + tool_use; turn 2 after the tool result → text. */
async function conversation(client: Anthropic, stream: boolean) {
  const send = (body: Anthropic.MessageCreateParamsNonStreaming) =>
    stream ? client.messages.stream(body).finalMessage() : client.messages.create(body);
  const m1 = await send(firstTurn);
  const toolUse = m1.content.find((b): b is Anthropic.ToolUseBlock => b.type === "tool_use");
  const m2 = await send({
    ...firstTurn,
    messages: [
      ...firstTurn.messages,
      { role: "assistant", content: m1.content },
      { role: "user", content: [{ type: "tool_result", tool_use_id: toolUse?.id ?? "", content: "(no output)" }] },
    ],
  });
  return { m1, m2 };
}

const withoutSignatures = (content: Anthropic.ContentBlock[]) =>
  content.map((b) => (b.type === "thinking" ? { ...b, signature: "" } : b.type === "tool_use" ? { ...b, id: "" } : b));

describe("Anthropic Messages through the gateway", () => {
  const runs: Record<"stream" | "plain", { sid: string; m1: Anthropic.Message; m2: Anthropic.Message }> = {} as never;

  it.each([
    ["plain", false],
    ["stream", true],
  ] as const)("runs a two-turn tool conversation (%s)", async (name, stream) => {
    const s = await openSession();
    const { m1, m2 } = await conversation(s.client, stream);
    runs[name] = { sid: s.id, m1, m2 };

    expect(m1.model).toBe("claude-sonnet-test");
    expect(m1.stop_reason).toBe("tool_use");
    expect(m1.content.map((b) => b.type)).toEqual(["thinking", "tool_use"]);
    const [thinking, toolUse] = m1.content as [Anthropic.ThinkingBlock, Anthropic.ToolUseBlock];
    expect(thinking.thinking.trim()).toBe(THINK);
    expect(thinking.signature).not.toBe("");
    expect(toolUse).toMatchObject({ name: "bash", input: { command: "echo hi > hello.txt" } });
    expect(m1.usage.output_tokens).toBeGreaterThan(0);

    expect(m2.stop_reason).toBe("end_turn");
    expect(m2.content).toEqual([{ type: "text", text: ANSWER }]);
    // The engine's prefix cache served the repeated prompt: reported as a cache read.
    expect(m2.usage.cache_read_input_tokens).toBeGreaterThan(0);

    const recs = await records(s.id);
    expect(recs.map((r) => r.protocol)).toEqual(["anthropic_messages", "anthropic_messages"]);
    expect(recs[1]!.request.messages[2]).toMatchObject({ role: "assistant", content: "", reasoning: thinking.thinking });
    expect(m2.usage.input_tokens + (m2.usage.cache_read_input_tokens ?? 0)).toBe(recs[1]!.prompt_ids.length);

    // One trace, token-exact: it decodes to the whole conversation.
    const res = await fetch(`${h.url}/v1/sessions/${s.id}/trajectory`);
    const { traces } = (await res.json()) as { traces: Trace[] };
    expect(traces).toHaveLength(1);
    const t = traces[0]!;
    expect(t.completion_ids).toEqual(recs.map((r) => r.id));
    const tok = getTokenizer();
    const text = tok.decode([...t.prompt_ids, ...t.response_ids], false);
    const head = text.slice(0, text.indexOf("<|im_start|>user"));
    expect(head.startsWith(`<|im_start|>system\n${SYSTEM}\n\n# Tools`)).toBe(true);
    expect(head).toContain('"name": "bash"');
    expect(text).toBe(
      head +
        `<|im_start|>user\n${USER}<|im_end|>\n` +
        `<|im_start|>assistant\n<think>\n${THINK}\n</think>\n\n` +
        `<tool_call>\n{"name": "bash", "arguments": {"command": "echo hi > hello.txt"}}\n</tool_call><|im_end|>\n` +
        `<|im_start|>user\n<tool_response>\n(no output)\n</tool_response><|im_end|>\n` +
        `<|im_start|>assistant\n${ANSWER}<|im_end|>`,
    );
    // The model's own tokens are exactly the trainable ones.
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
      // Tool-call ids are the engine's random ones; everything else is the same message.
      const noIds = (m: CompletionRecord["message"]) => ({ ...m, tool_calls: m.tool_calls.map((c) => ({ ...c, id: "" })) });
      expect(noIds(streamed[i]!.message)).toEqual(noIds(plain[i]!.message));
    }
    expect(withoutSignatures(runs.stream.m1.content)).toEqual(withoutSignatures(runs.plain.m1.content));
    expect(runs.stream.m2.content).toEqual(runs.plain.m2.content);
  });

  it("counts tokens as the engine renders the prompt", async () => {
    const s = await openSession();
    await s.client.messages.create(firstTurn);
    const [rec] = await records(s.id);
    const { model, system, messages, thinking } = firstTurn;
    const counted = await s.client.messages.countTokens({ model, system, messages, thinking, tools });
    expect(counted.input_tokens).toBe(rec!.prompt_ids.length);
  });

  it("takes Bearer auth and ?beta=true, and refuses a wrong key, a closed session and a bad body in Anthropic's shape", async () => {
    const s = await openSession();
    const base = `${h.url}/s/${s.id}`;
    const bearer = new Anthropic({ apiKey: null, authToken: s.token, baseURL: base, maxRetries: 0 });
    const beta = await bearer.beta.messages.create({ model: "m", max_tokens: 16, messages: [{ role: "user", content: "hi" }] });
    expect(beta.type).toBe("message");

    const wrong = new Anthropic({ apiKey: "sk-ant-wrong", baseURL: base, maxRetries: 0 });
    const denied = await wrong.messages.create({ model: "m", max_tokens: 16, messages: [{ role: "user", content: "hi" }] }).catch((e: unknown) => e);
    expect(denied).toBeInstanceOf(Anthropic.AuthenticationError);
    expect((denied as InstanceType<typeof Anthropic.AuthenticationError>).status).toBe(401);

    const bad = await fetch(`${base}/v1/messages`, {
      method: "POST",
      headers: { "x-api-key": s.token, "content-type": "application/json", "anthropic-version": "2023-06-01" },
      body: JSON.stringify({ model: "m", max_tokens: 16, messages: [{ role: "user", content: [{ type: "text" }] }] }),
    });
    expect(bad.status).toBe(400);
    const body = (await bad.json()) as { type: string; error: { type: string; message: string } };
    expect(body.type).toBe("error");
    expect(body.error.type).toBe("invalid_request_error");
    expect(body.error.message).toContain("messages.0.content.0.text");

    const sdkBad = await s.client.messages
      .create({ model: "m", max_tokens: 16, messages: [], stream: true })
      .catch((e: unknown) => e);
    expect(sdkBad).toBeInstanceOf(Anthropic.BadRequestError);

    const badJson = await fetch(`${base}/v1/messages`, { method: "POST", headers: { "x-api-key": s.token, "content-type": "application/json" }, body: "{nope" });
    expect(badJson.status).toBe(400);
    expect(((await badJson.json()) as { error: { type: string } }).error.type).toBe("invalid_request_error");

    // An engine that refuses the call (engine-sim's Qwen3 takes no images): its status, in our shape, also when streaming.
    const image = { type: "image" as const, source: { type: "base64" as const, media_type: "image/png" as const, data: "iVBORw0KGgo=" } };
    for (const stream of [false, true]) {
      const refused = await s.client.messages
        .create({ model: "m", max_tokens: 16, stream, messages: [{ role: "user", content: [image, { type: "text", text: "what is it?" }] }] })
        .catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(Anthropic.BadRequestError);
      expect((refused as Error).message).toMatch(/engine/);
    }

    // Claude Code's connectivity probe: HEAD on the base URL, no credentials. 200, whatever the id.
    for (const sid of [s.id, "s-unknown"]) {
      const probe = await fetch(`${h.url}/s/${sid}`, { method: "HEAD" });
      expect(probe.status).toBe(200);
      expect(await probe.text()).toBe("");
    }

    expect((await records(s.id)).length).toBe(1);
    await fetch(`${h.url}/v1/sessions/${s.id}/close`, { method: "POST" });
    const closed = await s.client.messages.create({ model: "m", max_tokens: 16, messages: [{ role: "user", content: "hi" }] }).catch((e: unknown) => e);
    expect(closed).toBeInstanceOf(Anthropic.PermissionDeniedError);
  });
  it("a tool_choice naming a tool that is not declared is a 400 naming tool_choice, and uses up none of the session's calls", async () => {
    const opened = await fetch(`${h.url}/v1/sessions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ limits: { max_llm_calls: 1 } }) });
    const s = (await opened.json()) as { id: string; token: string; urls: { anthropic: string } };
    const client = new Anthropic({ apiKey: s.token, baseURL: s.urls.anthropic, maxRetries: 0 });
    const base = { model: "m", max_tokens: 8, tools, messages: [{ role: "user" as const, content: "hi" }] };
    const refused = await client.messages.create({ ...base, tool_choice: { type: "tool", name: "no_such_tool" } }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(Anthropic.BadRequestError);
    expect((refused as InstanceType<typeof Anthropic.BadRequestError>).message).toMatch(/tool_choice\.name: .*no_such_tool/);
    // The one call the session allows is still there.
    expect((await client.messages.create({ ...base, tool_choice: { type: "tool", name: tools[0]!.name } })).content.length).toBeGreaterThan(0);
    expect((await records(s.id)).map((r) => r.seq)).toEqual([0]);
  });
});
