/**
 * The vocabulary bound of trajectories comes from the engine's model profile: gpt-oss's ids (its
 * `<|start|>` is 200006) build a valid trajectory on the gpt-oss profile, and an engine entry's
 * declared `vocab_size` still rejects ids beyond it (422, naming the record).
 */
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
    // Qwen3 ids against a bound far below them: every trajectory must be refused, not mis-built.
    h = await startHarness("vocab-bound", {}, {}, undefined, { extends: "qwen3", vocab_size: 1000 });
  });
  afterAll(async () => h?.close());

  it("rejects ids beyond it with 422 trajectory_invalid naming the record", async () => {
    const sid = await oneCall(h);
    const [rec] = await h.records(sid);
    const res = await fetch(`${h.url}/v1/sessions/${sid}/trajectory`);
    expect(res.status).toBe(422);
    const body = (await res.json()) as { error: { type: string; message: string; details: { record_id: string } } };
    expect(body.error.type).toBe("trajectory_invalid");
    expect(body.error.message).toMatch(/is not a token id in \[0, 1000\)/);
    expect(body.error.details.record_id).toBe(rec!.id);
  });
});
