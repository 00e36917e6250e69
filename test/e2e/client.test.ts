/**
 * The TypeScript SDK (@rollgate/client) against a real cluster with an API key: submit, batch,
 * groups, polling and callback waits, event streams with resume, trajectories in every format.
 */
import http from "node:http";
import { RollgateClient, RollgateError, TRAINER_FORMATS, signBody, signDelivery, startCallbackServer, verifyDelivery, type TaskEvent } from "@rollgate/client";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startCluster, type RunningCluster } from "../support/cluster.js";
import { startOutageProxy } from "../support/outage-proxy.js";
import { dropPrefix, uniquePrefix } from "../support/redis.js";
import { startTrainer } from "../support/trainer.js";

/** POSTs a body with exactly these headers; the status. */
function postRaw(url: string, body: string, headers: http.OutgoingHttpHeaders): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: "POST", headers }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode ?? 0));
    });
    req.on("error", reject);
    req.end(body);
  });
}

const task = (text: string, extra: Record<string, unknown> = {}) => ({
  instruction: `Create hello.txt.\n#sim: [{"tool_calls": [{"name": "shell", "arguments": {"command": "echo hello > hello.txt"}}]}, {"text": "${text}"}]`,
  agent: { harness: "command" as const, command: ["rollgate-example-agent"] },
  evaluator: { kind: "command" as const, command: ["bash", "-c", 'test "$(cat hello.txt)" = hello'] },
  limits: { timeout_s: 60 },
  ...extra,
});

describe("@rollgate/client", () => {
  const prefix = uniquePrefix("sdk");
  const apiKey = "sdk-key";
  let cluster: RunningCluster;
  let client: RollgateClient;
  beforeAll(async () => {
    cluster = await startCluster({ ROLLGATE_KEY_PREFIX: prefix, ROLLGATE_API_KEY: apiKey });
    client = new RollgateClient({ baseUrl: cluster.url, apiKey });
  }, 90_000);
  afterAll(async () => {
    await cluster?.stop();
    await dropPrefix(prefix);
  });

  it("submits a task, streams its events, waits for the result by polling, and reads its trajectory in every format", async () => {
    const id = `sdk-one-${prefix.slice(-8)}`;
    expect(await client.submitTask(task("one", { id }))).toEqual({ id, status: "queued" });
    // Idempotent on the id.
    expect((await client.submitTask(task("one", { id }))).id).toBe(id);

    const events: TaskEvent[] = [];
    for await (const e of client.streamEvents(id)) events.push(e);
    expect(events[0]!.type).toBe("queued");
    expect(events.at(-1)!.type).toBe("terminal");
    expect(events.filter((e) => e.type === "llm_call")).toHaveLength(2);
    // Resuming after an event id gives exactly the events after it.
    const resumed: TaskEvent[] = [];
    for await (const e of client.streamEvents(id, { lastEventId: events[1]!.id })) resumed.push(e);
    expect(resumed.map((e) => e.id)).toEqual(events.slice(2).map((e) => e.id));

    const result = await client.waitForResult(id, { intervalMs: 100, timeoutMs: 30_000 });
    expect(result).toMatchObject({ id, status: "completed", reward: 1 });

    const traj = await client.getTaskTrajectory(id);
    expect(traj.traces).toHaveLength(1);
    expect(traj.stats.records).toBe(2);
    for (const format of TRAINER_FORMATS.filter((f) => f !== "rollgate")) {
      const local = await client.getTrajectory(result.session_id!, { format });
      // What the gateway's ?format= answers, envelope and all (as the Python client returns it).
      const res = await fetch(`${cluster.url}/v1/sessions/${result.session_id}/trajectory?format=${format}`, { headers: { authorization: `Bearer ${apiKey}` } });
      const server = (await res.json()) as { format: string; samples: unknown[] };
      expect(server.format).toBe(format);
      expect(local).toEqual(server);
      expect(local.lost_calls).toEqual({ count: 0, first: null });
    }
    const verl = await client.getTrajectory(result.session_id!, { format: "verl", builder: "per_request" });
    expect(verl).toMatchObject({ builder: "per_request", format: "verl" });
    expect(verl.samples).toHaveLength(2);
    expect(verl.samples[0]!.response_mask.every((m) => m === 1)).toBe(true);
  }, 60_000);

  it("a task's trajectory is built by the task's own builder, as its result's is", async () => {
    const id = `sdk-pr-${prefix.slice(-8)}`;
    await client.submitTask(task("per request", { id, trajectory: { builder: "per_request" } }));
    const result = await client.waitForResult(id, { intervalMs: 100, timeoutMs: 30_000 });
    expect(result.trajectory!.builder).toBe("per_request");
    const traj = await client.getTaskTrajectory(id);
    expect(traj.builder).toBe("per_request");
    expect(traj.traces).toEqual(result.trajectory!.traces);
    // Asked for, another builder still wins.
    expect((await client.getTaskTrajectory(id, { builder: "prefix_merging" })).traces).toHaveLength(1);
  }, 60_000);

  it("submits a GRPO group and receives every signed callback (and the group's) on the callback server", async () => {
    const secret = "sdk-secret";
    const server = await startCallbackServer({ secret });
    try {
      const groupId = `g-sdk-${prefix.slice(-8)}`;
      const accepted = await client.submitGroup({
        group_id: groupId,
        n: 3,
        task: task("grouped", { callback: { url: server.url, secret } }),
        group_callback: { url: server.url, secret },
      });
      expect(accepted.map((a) => a.id)).toEqual([0, 1, 2].map((k) => `${groupId}-${k}`));
      const results = await Promise.all(accepted.map((a) => server.waitForResult(a.id, { timeoutMs: 60_000 })));
      expect(results.every((r) => r.status === "completed" && r.reward === 1)).toBe(true);
      const group = await server.waitForGroup(groupId, { timeoutMs: 60_000 });
      expect(group.tasks.map((t) => t?.id).sort()).toEqual(accepted.map((a) => a.id).sort());
      expect(server.deliveries.map((d) => d.event).sort()).toEqual(["group.completed", "task.completed", "task.completed", "task.completed"]);

      // A forgery is refused with 401 and never reaches the waiters.
      const body = JSON.stringify({ ...results[0], reward: 99 });
      const timestamp = Math.floor(Date.now() / 1000);
      const forgedHeaders = { "x-rollgate-event": "task.completed", "x-rollgate-delivery": "d-forged", "x-rollgate-timestamp": String(timestamp) };
      const forgedSignature = signDelivery({ deliveryId: "d-forged", event: "task.completed", timestamp, body }, "wrong");
      const forged = await fetch(server.url, { method: "POST", headers: { ...forgedHeaders, "x-rollgate-signature-v2": forgedSignature }, body });
      expect(forged.status).toBe(401);
      expect(server.rejected()).toBe(1);

      const listed = [];
      for await (const t of client.listTasks({ group_id: groupId, limit: 2 })) listed.push(t.id);
      expect(listed.sort()).toEqual(accepted.map((a) => a.id).sort());
      const polled = await client.waitForResults(accepted.map((a) => a.id), { intervalMs: 100, timeoutMs: 10_000 });
      expect(polled.map((r) => r.id)).toEqual(accepted.map((a) => a.id));
    } finally {
      await server.close();
    }
  }, 90_000);

  it("a worker's real delivery is taken as sent, and refused re-sent under a fresh delivery id, another event or with only its body-only signature", async () => {
    const secret = "replay-secret";
    const capture = await startTrainer();
    const server = await startCallbackServer({ secret });
    try {
      const [accepted] = await client.submitBatch([task("captured", { callback: { url: capture.url, secret } })]);
      const [got] = await capture.waitFor(1, 60_000);
      expect(JSON.parse(got!.rawBody).id).toBe(accepted!.id);
      const h = got!.headers;
      expect(h["x-rollgate-timestamp"]).toMatch(/^[0-9]+$/);
      expect(Math.abs(Number(h["x-rollgate-timestamp"]) - Date.now() / 1000)).toBeLessThan(300);
      expect(verifyDelivery(got!.rawBody, h, secret)).toBeNull();
      // The previous release's header is still sent, for receivers not yet upgraded.
      expect(h["x-rollgate-signature"]).toBe(signBody(got!.rawBody, secret));

      const sent = {
        "content-type": "application/json",
        "x-rollgate-event": h["x-rollgate-event"],
        "x-rollgate-delivery": h["x-rollgate-delivery"],
        "x-rollgate-timestamp": h["x-rollgate-timestamp"],
        "x-rollgate-signature-v2": h["x-rollgate-signature-v2"],
        "x-rollgate-signature": h["x-rollgate-signature"],
      };
      expect(await postRaw(server.url, got!.rawBody, sent)).toBe(200);
      expect(await postRaw(server.url, got!.rawBody, { ...sent, "x-rollgate-delivery": "d-fresh" })).toBe(401);
      expect(await postRaw(server.url, got!.rawBody, { ...sent, "x-rollgate-event": "task.failed" })).toBe(401);
      const { "x-rollgate-signature-v2": _v2, "x-rollgate-timestamp": _ts, ...legacyOnly } = sent;
      expect(await postRaw(server.url, got!.rawBody, { ...legacyOnly, "x-rollgate-delivery": "d-legacy" })).toBe(401);
      expect(server.deliveries.map((d) => d.deliveryId)).toEqual([h["x-rollgate-delivery"]]);
      expect(server.rejected()).toBe(3);
    } finally {
      await server.close();
      await capture.close();
    }
  }, 90_000);

  it("cancels a task, and reports errors as RollgateError with the server's body", async () => {
    const [sleeper] = await client.submitBatch([
      { instruction: "wait", agent: { harness: "command", command: ["bash", "-c", "sleep 30"] }, evaluator: { kind: "none" }, limits: { timeout_s: 60 } },
    ]);
    // Cancel once it runs (a cancel in the instant a worker picks a job up is the fleet tests' business).
    const deadline = Date.now() + 20_000;
    while ((await client.getTask(sleeper!.id)).status !== "running" && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    expect((await client.cancelTask(sleeper!.id)).status).toMatch(/^cancell(ed|ing)$/);
    const cancelled = await client.waitForResult(sleeper!.id, { intervalMs: 100, timeoutMs: 20_000 });
    expect(cancelled.status).toBe("cancelled");

    const invalid = (await client.submitTask({ instruction: "x" } as never).catch((e: unknown) => e)) as RollgateError;
    expect(invalid).toBeInstanceOf(RollgateError);
    expect(invalid.status).toBe(400);
    expect(invalid.type).toBe("invalid_request");
    expect(invalid.details).toEqual(expect.arrayContaining([expect.objectContaining({ path: "agent" })]));

    const missing = (await client.getTask("no-such").catch((e: unknown) => e)) as RollgateError;
    expect([missing.status, missing.type]).toEqual([404, "not_found"]);

    const noKey = (await new RollgateClient({ baseUrl: cluster.url }).getTask("x").catch((e: unknown) => e)) as RollgateError;
    expect([noKey.status, noKey.type]).toEqual([401, "unauthorized"]);

    const down = (await new RollgateClient({ baseUrl: "http://127.0.0.1:9" }).getTask("x").catch((e: unknown) => e)) as RollgateError;
    expect(down.unreachable).toBe(true);
  }, 60_000);

  it("a wait and an event stream ride out a gateway that stops answering for a while", async () => {
    // A gateway restart or deploy while a trainer waits for its rollouts: the polls (and the
    // stream) find nothing answering for longer than a stream's old five reconnects (~11 s).
    const proxy = await startOutageProxy(cluster.url);
    try {
      const viaProxy = new RollgateClient({ baseUrl: proxy.url, apiKey });
      const [accepted] = await viaProxy.submitBatch([
        { instruction: "wait", agent: { harness: "command", command: ["bash", "-c", "sleep 3"] }, evaluator: { kind: "none" }, limits: { timeout_s: 60 } },
      ]);
      const id = accepted!.id;
      const events: TaskEvent[] = [];
      let firstEvent!: () => void;
      const gotFirst = new Promise<void>((r) => (firstEvent = r));
      const streamed = (async () => {
        for await (const e of viaProxy.streamEvents(id)) {
          events.push(e);
          firstEvent();
        }
      })();
      const waited = viaProxy.waitForResult(id, { intervalMs: 100 });
      await gotFirst;
      proxy.down();
      await new Promise((r) => setTimeout(r, 14_000));
      proxy.up();
      expect((await waited).status).toBe("completed");
      await streamed;
      expect(events.at(-1)!.type).toBe("terminal");
      expect(new Set(events.map((e) => e.id)).size).toBe(events.length);
      // Errors that are not an outage still end a wait at once.
      await expect(viaProxy.waitForResult("no-such-task", { intervalMs: 100 })).rejects.toMatchObject({ status: 404 });
    } finally {
      await proxy.close();
    }
  }, 60_000);
});
