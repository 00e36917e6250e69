/**
 * The vocabulary bound of trajectories comes from the engine's model profile: gpt-oss's ids (its
 * `<|start|>` is 200006) build a valid trajectory on the gpt-oss profile, and an engine entry's
 * declared `vocab_size` refuses an answer with ids beyond it: the call fails, nothing is recorded
 * (a stored record beyond it still fails its trajectory: packages/trajectory's invariants).
 */
import type { Session } from "@rollgate/protocol";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startHarness, type Harness } from "./__fixtures__/harness.js";

const sdk = (h: Harness, s: { id: string; token: string }) => new OpenAI({ baseURL: `${h.url}/s/${s.id}/v1`, apiKey: s.token, maxRetries: 0 });
const SCRIPT = `#sim: ${JSON.stringify([{ think: "short", text: "Hello." }])}`;

async function oneCall(h: Harness) {
  const s = await h.openSession();
  await sdk(h, s).chat.completions.create({ model: "m", messages: [{ role: "user", content: `hi\n${SCRIPT}` }] });
  return s.id;
}

describe("gpt-oss on its profile (vocabulary 201,088)", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness("vocab-gptoss", { family: "gpt-oss", startDate: "2026-01-05" });
  });
  afterAll(async () => h?.close());

  it("ids above Qwen3's 151,935 build a valid trajectory", async () => {
    const sid = await oneCall(h);
    const [rec] = await h.records(sid);
    expect(Math.max(...rec!.prompt_ids, ...rec!.output_ids)).toBeGreaterThan(151_935);
    const res = await fetch(`${h.url}/v1/sessions/${sid}/trajectory`);
    expect(res.status).toBe(200);
    const traj = (await res.json()) as { traces: { response_ids: number[] }[] };
    expect(traj.traces).toHaveLength(1);
    expect(traj.traces[0]!.response_ids).toEqual(rec!.output_ids);
  });
});

describe("a declared vocabulary (ROLLGATE_ENGINES[].profile with vocab_size)", () => {
  let h: Harness;
  beforeAll(async () => {
    // Qwen3 ids against a bound far below them: no call may be recorded with them.
    h = await startHarness("vocab-bound", {}, {}, undefined, { extends: "qwen3", vocab_size: 1000 });
  });
  afterAll(async () => h?.close());

  it("an answer with ids beyond it fails the call (502, a lost call naming the id) and nothing is recorded", async () => {
    const s = await h.openSession();
    const call = sdk(h, s).chat.completions.create({ model: "m", messages: [{ role: "user", content: `hi\n${SCRIPT}` }] });
    await expect(call).rejects.toMatchObject({ status: 502 });
    expect(await h.records(s.id)).toEqual([]);
    const session = (await (await fetch(`${h.url}/v1/sessions/${s.id}`)).json()) as Session;
    expect(session.lost_calls).toMatchObject({ count: 1, first: { kind: "engine_bad_response", message: expect.stringMatching(/is not a token id in \[0, 1000\)/) } });
  });
});
