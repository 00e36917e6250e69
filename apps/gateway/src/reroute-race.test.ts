/**
 * A session whose rank is drained, with several of its calls arriving at once (an agent and its
 * sub-agents, parallel tool calls answered together): every call finds the rank drained and moves
 * the session. It must move once. Before, each call took a slot on a new rank and gave one back on
 * the old one: ranks were counted busier than they are (least-loaded and affinity routing then skew
 * for good) and the old rank was counted idler than it is (another session's slot given back).
 */
import { getSimState } from "@rollgate/engine-sim";
import type { FastifyInstance } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startSimFleet, type SimFleet } from "./__fixtures__/harness.js";

let fleet: SimFleet;
let app: FastifyInstance;

beforeAll(async () => {
  fleet = await startSimFleet("reroute-race", { dpSize: 3 });
  app = await fleet.gateway({ env: { ROLLGATE_HEALTH_INTERVAL_S: "0.2", ROLLGATE_HEALTH_FAILURES: "1" } });
});
afterAll(async () => {
  getSimState(fleet.sim).setFault({ mode: "none" });
  await app.close();
  await fleet.close();
});

type Ranks = { dp_rank: number; healthy: boolean; sessions: number }[];
const ranks = async () => ((await app.inject({ url: "/admin/engines" })).json() as { engines: { ranks: Ranks }[] }).engines[0]!.ranks;
const open = async () => (await app.inject({ method: "POST", url: "/v1/sessions", payload: {} })).json() as { id: string; token: string };
const rankOf = async (id: string) => ((await app.inject({ url: `/v1/sessions/${id}` })).json() as { assignment: { dp_rank: number } }).assignment.dp_rank;
const chat = (s: { id: string; token: string }) =>
  app.inject({
    method: "POST",
    url: `/s/${s.id}/v1/chat/completions`,
    headers: { authorization: `Bearer ${s.token}`, "content-type": "application/json" },
    payload: { model: "m", messages: [{ role: "user", content: 'hi\n#sim: [{"text": "ok"}]' }] },
  });

describe("calls of one session that all find its rank drained", () => {
  it("move the session once: every rank's count of open sessions stays true, and all are zero once they close", async () => {
    const sessions = await Promise.all(Array.from({ length: 3 }, open));
    const moving = sessions[0]!;
    const rank = await rankOf(moving.id);
    getSimState(fleet.sim).setFault({ rank, mode: "down" });
    const deadline = Date.now() + 10_000;
    while ((await ranks())[rank]!.healthy && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    expect((await ranks())[rank]!.healthy).toBe(false);

    const answers = await Promise.all(Array.from({ length: 6 }, () => chat(moving)));
    expect(answers.map((a) => a.statusCode)).toEqual(Array(6).fill(200));
    const where = await Promise.all(sessions.map((s) => rankOf(s.id)));
    const counted = (await ranks()).map((r) => r.sessions);
    const truth = [0, 1, 2].map((r) => where.filter((w) => w === r).length);
    expect(counted, `sessions on ranks ${JSON.stringify(where)}`).toEqual(truth);

    getSimState(fleet.sim).setFault({ mode: "none" });
    for (const s of sessions) await app.inject({ method: "POST", url: `/v1/sessions/${s.id}/close` });
    expect((await ranks()).map((r) => r.sessions)).toEqual([0, 0, 0]);
  });
});
