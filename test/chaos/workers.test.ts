/**
 * Chaos: worker processes SIGKILLed mid-rollout, several times during a 100-task batch (three
 * workers; each one killed is replaced). Lock and stalled intervals are short, so a dead worker's
 * rollouts are taken over within seconds. Every submitted task must end terminal — none stuck
 * queued or running — and every task's callback arrives.
 */
import { randomUUID } from "node:crypto";
import type { StartedChild } from "@rollgate/testkit";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startApp, stopChild } from "../support/apps.js";
import { apiClient } from "../support/http.js";
import { poll } from "../support/poll.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";
import { startTrainer } from "../support/trainer.js";
import { byStatus, startSimAndGateway, waitAllTerminal } from "./support.js";

const prefix = uniquePrefix("chaos-workers");
const procs: StartedChild[] = [];
let gatewayUrl = "";
const api = apiClient(() => gatewayUrl);
let n = 0;

async function worker(): Promise<StartedChild> {
  const w = await startApp("worker", [], {
    ROLLGATE_KEY_PREFIX: prefix,
    ROLLGATE_GATEWAY_URL: gatewayUrl,
    ROLLGATE_WORKER_NAME: `cw${n++}`,
    ROLLGATE_WORKER_CONCURRENCY: "4",
    ROLLGATE_JOB_LOCK_MS: "2000",
    ROLLGATE_STALLED_INTERVAL_MS: "1000",
    ROLLGATE_CALLBACK_BACKOFF_MS: "200",
  });
  procs.push(w);
  return w;
}

beforeAll(async () => {
  ({ gatewayUrl } = await startSimAndGateway(prefix, procs));
}, 60_000);

afterAll(async () => {
  await Promise.all(procs.map((p) => stopChild(p.proc, 5_000)));
  await dropPrefix(prefix);
});

describe("workers SIGKILLed during a batch", () => {
  it("100 tasks, 4 worker kills: 100 submitted, 100 terminal, none stuck, every callback delivered once per delivery id", async () => {
    const live: StartedChild[] = [await worker(), await worker(), await worker()];
    const trainer = await startTrainer();
    try {
      const groupId = `g-${randomUUID().slice(0, 8)}`;
      const task = {
        instruction: 'work, then answer\n#sim: [{"tool_calls": [{"name": "shell", "arguments": {"command": "echo hi"}}]}, {"text": "done"}]',
        // 0.5–2 s of work around two LLM calls: long enough that kills land mid-rollout.
        agent: { harness: "command", command: ["bash", "-c", "sleep 0.$((RANDOM % 9 + 1)); rollgate-example-agent; sleep 0.$((RANDOM % 9 + 1))"] },
        evaluator: { kind: "command", command: ["true"] },
        limits: { timeout_s: 60 },
        callback: { url: trainer.url, secret: "chaos" },
      };
      const res = await api("/v1/tasks/batch", { body: { group_id: groupId, n: 100, task } });
      expect(res.status).toBe(202);
      const ids = (res.body.tasks as { id: string }[]).map((t) => t.id);
      expect(ids).toHaveLength(100);

      // Kill a worker that is running something, four times, spread over the batch; replace each.
      let kills = 0;
      const killedWhileRunning: string[] = [];
      for (let k = 0; k < 4; k++) {
        await poll(async () => (await api(`/v1/tasks?group_id=${groupId}&status=running&limit=1000`)).body.tasks.length as number, (c) => c > 0, 30_000, 200);
        await new Promise((r) => setTimeout(r, 1_500 + k * 500));
        const running = (await api(`/v1/tasks?group_id=${groupId}&status=running&limit=1000`)).body.tasks as { worker: string; id: string }[];
        const names = new Set(running.map((t) => t.worker));
        const victim = live.find((w) => names.has(w.ready)) ?? live[0]!;
        killedWhileRunning.push(...running.filter((t) => t.worker === victim.ready).map((t) => t.id));
        victim.proc.kill("SIGKILL");
        kills++;
        live.splice(live.indexOf(victim), 1);
        live.push(await worker());
      }
      expect(kills).toBe(4);
      expect(killedWhileRunning.length).toBeGreaterThan(0);

      const records = await waitAllTerminal(api, ids, 240_000);
      const counts = byStatus(records);
      console.log(`chaos workers: ${JSON.stringify(counts)}; ${killedWhileRunning.length} rollouts were running on a killed worker`);
      // Submitted vs terminal: all 100 ended, none stuck in queued or running.
      expect(records.filter((r) => r.result !== null)).toHaveLength(100);
      expect(counts.queued ?? 0).toBe(0);
      expect(counts.running ?? 0).toBe(0);
      // A rollout interrupted by a kill is run again elsewhere (attempt 2+) and completes; one
      // stalled twice may end `failed` (worker_lost) — never silently lost.
      for (const r of records) {
        if (r.status !== "completed") expect(r.result!.error!.kind, JSON.stringify(r.result!.error)).toMatch(/worker_lost|infrastructure/);
      }
      expect(counts.completed ?? 0).toBeGreaterThanOrEqual(90);
      const retried = records.filter((r) => killedWhileRunning.includes(r.id));
      // (The running list is read just before the kill, so a few of those may have finished first.)
      expect(retried.filter((r) => r.result!.attempts >= 2).length).toBeGreaterThan(0);

      // Callbacks: one delivery id per task, every task delivered, each delivery id exactly once.
      await trainer.waitFor(100, 120_000);
      await poll(async () => new Set(trainer.received.map((d) => d.headers["x-rollgate-delivery"])).size, (c) => c >= 100, 30_000, 500);
      const taskDeliveries = trainer.received.filter((d) => d.headers["x-rollgate-event"] !== "group.completed");
      const byTask = new Map<string, Set<string>>();
      for (const d of taskDeliveries) {
        const id = (JSON.parse(d.rawBody) as { id: string }).id;
        byTask.set(id, (byTask.get(id) ?? new Set()).add(String(d.headers["x-rollgate-delivery"])));
      }
      expect([...byTask.keys()].sort()).toEqual([...ids].sort());
      const deliveryIds = taskDeliveries.map((d) => d.headers["x-rollgate-delivery"]);
      // A worker killed between a 2xx and recording it may send one delivery again (at-least-once):
      // the same delivery id, so the trainer can drop it. Never a second id for one task.
      expect([...byTask.values()].every((s) => s.size === 1)).toBe(true);
      expect(deliveryIds.length - new Set(deliveryIds).size).toBeLessThanOrEqual(kills);
    } finally {
      await trainer.close();
    }
  }, 300_000);
});
