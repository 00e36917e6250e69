/**
 * Chaos: one of two gateway replicas SIGKILLed while agents are mid-session. The agents are
 * OpenAI SDK clients (maxRetries) behind a round-robin TCP balancer the test runs; their calls in
 * flight on the dead replica fail, the SDK retries, and the balancer sends the retries to the
 * live replica. Every agent finishes its conversation, and every session's trajectory builds:
 * one chain holding every turn, token-exact (the builder checks its invariants).
 */
import type { CompletionRecord } from "@rollgate/protocol";
import type { StartedChild } from "@rollgate/testkit";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";
import { apiClient } from "../support/http.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";
import { startBalancer, type Balancer } from "./support.js";

const prefix = uniquePrefix("chaos-gw");
const procs: StartedChild[] = [];
let gwA: StartedChild;
let gwB: StartedChild;
let lb: Balancer;
const api = apiClient(() => gwA.ready);

beforeAll(async () => {
  // 15 ms a token: each call takes a while, so the kill lands on calls in flight.
  const engine = await startApp("engine-sim", ["--port", "0", "--dp", "2", "--tpot-ms", "15"], {});
  procs.push(engine);
  const env = { ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: engine.ready, dp_size: 2, profile: "qwen3" }]) };
  gwA = await startApp("gateway", ["--port", "0"], env);
  gwB = await startApp("gateway", ["--port", "0"], env);
  procs.push(gwA, gwB);
  lb = await startBalancer([gwA.ready, gwB.ready]);
}, 60_000);

afterAll(async () => {
  await lb?.close();
  await Promise.all(procs.map((p) => stopChild(p.proc, 5_000)));
  await dropPrefix(prefix);
});

const TURNS = 6;
const AGENTS = 12;

describe("a gateway replica SIGKILLed mid-session", () => {
  it("agents retry through the balancer onto the live replica; every conversation ends and every trajectory is one coherent chain", async () => {
    const steps = [
      ...Array.from({ length: TURNS - 1 }, (_, i) => ({ tool_calls: [{ name: "ls", arguments: { dir: `d${i}` } }], tokens: 24 })),
      { text: "done" },
    ];
    const tools: OpenAI.ChatCompletionTool[] = [{ type: "function", function: { name: "ls", parameters: { type: "object" } } }];
    const sessions = await Promise.all(Array.from({ length: AGENTS }, async () => (await api("/v1/sessions", { body: {} })).body as { id: string; token: string }));
    let calls = 0;
    const agent = async (s: { id: string; token: string }) => {
      // New connection per request (no keep-alive), so each retry is balanced anew.
      const client = new OpenAI({ baseURL: `${lb.url}/s/${s.id}/v1`, apiKey: s.token, maxRetries: 6, timeout: 30_000, defaultHeaders: { connection: "close" } });
      const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: `go\n#sim: ${JSON.stringify(steps)}` }];
      for (let turn = 0; turn < TURNS; turn++) {
        const res = await client.chat.completions.create({ model: "m", messages, tools });
        calls++;
        const msg = res.choices[0]!.message;
        messages.push(msg);
        for (const call of msg.tool_calls ?? []) messages.push({ role: "tool", tool_call_id: call.id, content: "a.txt b.txt" });
      }
      return messages.at(-1);
    };
    const running = sessions.map(agent);
    // Let the agents get going on both replicas, then kill one.
    const t0 = Date.now();
    while (calls < AGENTS && Date.now() - t0 < 30_000) await new Promise((r) => setTimeout(r, 50));
    expect(lb.counts[1]).toBeGreaterThan(0);
    gwB.proc.kill("SIGKILL");
    const finals = await Promise.all(running);
    for (const m of finals) expect(m).toMatchObject({ role: "assistant", content: "done" });

    for (const s of sessions) {
      const traj = await api(`/v1/sessions/${s.id}/trajectory`);
      expect(traj.status, JSON.stringify(traj.body).slice(0, 300)).toBe(200);
      const recs = (await api(`/v1/sessions/${s.id}/completions`)).body.completions as CompletionRecord[];
      // Every turn recorded; a call the dead replica had recorded before dying may appear twice (a sibling), never less.
      expect(recs.length).toBeGreaterThanOrEqual(TURNS);
      const longest = Math.max(...(traj.body.traces as { completion_ids: string[] }[]).map((t) => t.completion_ids.length));
      expect(longest).toBe(TURNS);
      // One rank for the whole session, records in order.
      expect(new Set(recs.map((r) => r.dp_rank)).size).toBe(1);
      const seqs = recs.map((r) => r.seq);
      expect([...seqs].sort((x, y) => x - y)).toEqual(seqs);
    }
  }, 120_000);
});
