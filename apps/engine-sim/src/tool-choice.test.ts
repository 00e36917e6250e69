import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { FastifyInstance } from "fastify";
import { buildEngineSim } from "./app.js";
import { getTokenizer } from "./index.js";

// A forced tool choice (tool_choice "required" or a named function) as vLLM and SGLang answer it on
// the chat route: guided decoding makes the model write bare JSON after its reasoning, and the server
// builds tool_calls from that JSON (no tool parser). See guided.ts and docs/sim-policy.md.

const tok = getTokenizer();
const SCRIPT = '#sim: [{"think": "Look first.", "tool_calls": [{"name": "shell", "arguments": {"command": "ls", "n": 1.0}}]}, {"text": "ok"}]';
const TOOLS = [
  { type: "function", function: { name: "shell", parameters: { type: "object", properties: { command: { type: "string" } } } } },
  { type: "function", function: { name: "read", parameters: { type: "object" } } },
];
const NAMED = { type: "function", function: { name: "shell" } };
const ARGS = '{"command": "ls", "n": 1.0}';

function body(toolChoice: unknown, extra: Record<string, unknown> = {}, script = SCRIPT): string {
  const rest = JSON.stringify({ messages: [{ role: "user", content: `Go.\n${script}` }], tools: TOOLS, tool_choice: toolChoice, return_token_ids: true, ...extra });
  return rest;
}

async function post(app: FastifyInstance, payload: string) {
  return app.inject({ method: "POST", url: "/v1/chat/completions", payload, headers: { "content-type": "application/json" } });
}

/** The streamed deltas joined: reasoning, content, the calls (name + arguments) and the finish. */
function joinStream(raw: string) {
  const events = raw.split("\n\n").filter((s) => s.startsWith("data: {")).map((s) => JSON.parse(s.slice(6)) as { choices: { delta: Record<string, unknown>; finish_reason: string | null }[] });
  let reasoning = "";
  let content = "";
  let finish: string | null = null;
  let firstCallChunk = -1;
  let lastReasoningChunk = -1;
  const calls: { id: string; name: string; args: string }[] = [];
  events.forEach((e, k) => {
    const c = e.choices[0];
    if (!c) return;
    finish = c.finish_reason ?? finish;
    const r = (c.delta.reasoning ?? c.delta.reasoning_content) as string | null | undefined;
    if (r) {
      reasoning += r;
      lastReasoningChunk = k;
    }
    if (typeof c.delta.content === "string") content += c.delta.content;
    for (const t of (c.delta.tool_calls ?? []) as { index: number; id?: string; function: { name?: string; arguments?: string } }[]) {
      if (firstCallChunk < 0) firstCallChunk = k;
      const call = (calls[t.index] ??= { id: "", name: "", args: "" });
      if (t.id) call.id = t.id;
      call.name += t.function.name ?? "";
      call.args += t.function.arguments ?? "";
    }
  });
  return { reasoning, content, finish, calls, reasoningFirst: lastReasoningChunk < firstCallChunk };
}

describe.each(["vllm", "sglang"] as const)("qwen3 on %s", (kind) => {
  let app: FastifyInstance;
  beforeAll(async () => {
    app = buildEngineSim({ kind, family: "qwen3" });
    await app.ready();
  });
  afterAll(() => app.close());

  it("tool_choice required: the model thinks, then writes a JSON array of {name, parameters}; the server builds the calls from it", async () => {
    const res = await post(app, body("required"));
    expect(res.statusCode).toBe(200);
    const choice = res.json().choices[0];
    const json = `[{"name": "shell", "parameters": ${ARGS}}]`;
    // The ids are the tokenizer's ids of exactly that text (after the family's reasoning), then the end of turn.
    expect(tok.decode(choice.token_ids)).toBe(`<think>\nLook first.\n</think>\n\n${json}<|im_end|>`);
    expect(choice.message.tool_calls).toHaveLength(1);
    expect(choice.message.tool_calls[0].function).toEqual({ name: "shell", arguments: ARGS });
    expect(choice.message.content).toBe(kind === "vllm" ? "" : null);
    expect(choice.message[kind === "vllm" ? "reasoning" : "reasoning_content"]).toBe("\nLook first.\n");
    expect(choice.finish_reason).toBe("tool_calls");
  });

  it("a named function: vLLM's model writes only the arguments object (finish stop); SGLang's an array of one call (finish tool_calls)", async () => {
    const res = await post(app, body(NAMED));
    const choice = res.json().choices[0];
    const json = kind === "vllm" ? ARGS : `[{"name": "shell", "parameters": ${ARGS}}]`;
    expect(tok.decode(choice.token_ids)).toBe(`<think>\nLook first.\n</think>\n\n${json}<|im_end|>`);
    expect(choice.message.tool_calls.map((t: { function: unknown }) => t.function)).toEqual([{ name: "shell", arguments: ARGS }]);
    expect(choice.finish_reason).toBe(kind === "vllm" ? "stop" : "tool_calls");
  });

  it.each([["required"], [NAMED]])("streamed (tool_choice %j): reasoning first, then the call's name and arguments as deltas that join to the non-streamed call", async (tc) => {
    const res = await post(app, body(tc, { stream: true, return_token_ids: false }));
    const s = joinStream(res.body);
    expect(s.reasoning).toBe("\nLook first.\n");
    expect(s.content).toBe("");
    expect(s.calls).toHaveLength(1);
    expect(s.calls[0]!.name).toBe("shell");
    expect(s.calls[0]!.args).toBe(ARGS);
    expect(s.calls[0]!.id).not.toBe("");
    expect(s.reasoningFirst).toBe(true);
    expect(s.finish).toBe(kind === "vllm" && tc !== "required" ? "stop" : "tool_calls");
  });

  it("the auto choice still answers in the family's markup (hermes <tool_call>)", async () => {
    const res = await post(app, body("auto"));
    const choice = res.json().choices[0];
    expect(tok.decode(choice.token_ids)).toContain("<tool_call>\n");
    expect(choice.message.tool_calls[0].function.arguments).toBe(ARGS);
  });

  it("a step the grammar cannot produce (text beside the call, no call) is a 400 naming the step", async () => {
    const withText = await post(app, body("required", {}, '#sim: [{"text": "hi", "tool_calls": [{"name": "shell"}]}]'));
    expect(withText.statusCode).toBe(400);
    expect(JSON.stringify(withText.json())).toContain('engine-sim: step 0: with tool_choice \\"required\\" the model writes only');
    const noCall = await post(app, body(NAMED, {}, '#sim: [{"text": "hi"}]'));
    expect(noCall.statusCode).toBe(400);
    expect(JSON.stringify(noCall.json())).toContain('needs \\"tool_calls\\"');
  });

  it("a named function not in tools is refused", async () => {
    const res = await post(app, body({ type: "function", function: { name: "nope" } }));
    expect(res.statusCode).toBe(400);
    expect(JSON.stringify(res.json())).toContain("Tool 'nope' has not been passed in `tools`.");
  });
});
