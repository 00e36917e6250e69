/**
 * The official @google/genai SDK against the gateway (listening on a real port) + in-process
 * engine-sim, on the real Redis under a unique key prefix.
 */
import { GoogleGenAI, createFunctionResponsePartFromBase64, createFunctionResponsePartFromUri, createPartFromFunctionResponse, type Content, type GenerateContentResponse, type Part } from "@google/genai";
import { getTokenizer } from "@rollgate/engine-sim";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TEST_REDIS_URL, startHarness, type Harness } from "./__fixtures__/harness.js";
import { buildGateway } from "./app.js";
import { GatewayEnv } from "./env.js";

let h: Harness;

beforeAll(async () => {
  h = await startHarness("gemini", { dpSize: 1, model: "Qwen/Qwen3-8B" });
});

afterAll(() => h?.close());

const openSession = () => h.openSession();

const client = (s: { id: string; token: string }, key = s.token) => new GoogleGenAI({ apiKey: key, httpOptions: { baseUrl: `${h.url}/s/${s.id}` } });

const SCRIPT =
  'List the files, then summarise.\n#sim: [{"think": "I should list the files.", "tool_calls": [{"name": "run_shell", "arguments": {"command": "ls", "timeout": 5}}]}, {"think": "Two files.", "text": "There are two files."}]';
const USER: Content = { role: "user", parts: [{ text: SCRIPT }] };
const config = {
  systemInstruction: "You are a terse coding agent.",
  tools: [
    {
      functionDeclarations: [
        {
          name: "run_shell",
          description: "Run a shell command",
          parametersJsonSchema: { type: "object", properties: { command: { type: "string" }, timeout: { type: "integer" } }, required: ["command"] },
        },
      ],
    },
  ],
  thinkingConfig: { includeThoughts: true },
};

/** Folds streamed chunks into one model turn as Gemini CLI keeps it: thought parts dropped, texts merged. */
function foldStream(chunks: GenerateContentResponse[]): { content: Content; thought: string; finishReason?: string } {
  const parts: Part[] = [];
  let thought = "";
  let finishReason: string | undefined;
  for (const c of chunks) {
    const cand = c.candidates?.[0];
    if (cand?.finishReason) finishReason = cand.finishReason;
    for (const p of cand?.content?.parts ?? []) {
      if (p.thought) thought += p.text ?? "";
      else if (p.text !== undefined && parts.at(-1)?.text !== undefined && !p.thoughtSignature) parts.at(-1)!.text += p.text;
      else parts.push({ ...p });
    }
  }
  return { content: { role: "model", parts }, thought, ...(finishReason ? { finishReason } : {}) };
}

const records = (sid: string) => h.records(sid);

/** Plays the two-turn tool conversation; returns the session id and the final answer text. */
async function conversation(stream: boolean): Promise<{ sid: string; answer: string }> {
  const s = await openSession();
  const ai = client(s);
  const model = "gemini-2.5-flash";

  let modelTurn: Content;
  if (!stream) {
    const r1 = await ai.models.generateContent({ model, contents: [USER], config });
    const parts = r1.candidates![0]!.content!.parts!;
    expect(parts[0]).toMatchObject({ thought: true, text: "\nI should list the files.\n" });
    expect(r1.functionCalls).toEqual([{ id: expect.stringMatching(/\S/), name: "run_shell", args: { command: "ls", timeout: 5 } }]);
    expect(parts[1]!.thoughtSignature).toMatch(/\S/);
    expect(r1.candidates![0]!.finishReason).toBe("STOP");
    expect(r1.usageMetadata).toMatchObject({ thoughtsTokenCount: expect.any(Number), promptTokenCount: expect.any(Number) });
    expect(r1.modelVersion).toBe(model);
    modelTurn = r1.candidates![0]!.content!; // echoed whole, thought parts included
  } else {
    const chunks: GenerateContentResponse[] = [];
    for await (const c of await ai.models.generateContentStream({ model, contents: [USER], config })) chunks.push(c);
    const folded = foldStream(chunks);
    expect(folded.thought).toBe("\nI should list the files.\n");
    expect(folded.finishReason).toBe("STOP");
    // Like Gemini CLI: the history keeps the signed function call, not the thoughts.
    modelTurn = folded.content;
    expect(modelTurn.parts!.find((p) => p.functionCall)).toMatchObject({ functionCall: { name: "run_shell", args: { command: "ls", timeout: 5 } } });
  }
  const call = modelTurn.parts!.find((p) => p.functionCall)!.functionCall!;
  const toolTurn: Content = { role: "user", parts: [{ functionResponse: { id: call.id, name: call.name, response: { output: "a.txt\nb.txt" } } }] };
  const contents = [USER, modelTurn, toolTurn];

  let answer = "";
  if (!stream) {
    const r2 = await ai.models.generateContent({ model, contents, config });
    answer = r2.text ?? "";
  } else {
    for await (const c of await ai.models.generateContentStream({ model, contents, config })) answer += c.text ?? "";
  }
  return { sid: s.id, answer };
}

describe("Gemini API through the gateway with @google/genai", () => {
  it("plays a two-turn function-calling conversation, streamed and not, with identical token-exact records", async () => {
    const plain = await conversation(false);
    const streamed = await conversation(true);
    expect(plain.answer.trim()).toBe("There are two files.");
    expect(streamed.answer.trim()).toBe("There are two files.");

    const a = await records(plain.sid);
    const b = await records(streamed.sid);
    expect(a).toHaveLength(2);
    expect(b).toHaveLength(2);
    for (let i = 0; i < 2; i++) {
      expect(a[i]!.protocol).toBe("gemini");
      expect(b[i]!.prompt_ids).toEqual(a[i]!.prompt_ids);
      expect(b[i]!.output_ids).toEqual(a[i]!.output_ids);
      expect(b[i]!.output_logprobs).toEqual(a[i]!.output_logprobs);
    }
    // The echoed turn carries the reasoning back (from the signature) so the engine re-renders it.
    expect(b[1]!.request.messages[2]).toMatchObject({ role: "assistant", content: "", reasoning: "\nI should list the files.\n" });

    for (const sid of [plain.sid, streamed.sid]) {
      const traj = (await (await fetch(`${h.url}/v1/sessions/${sid}/trajectory`)).json()) as {
        traces: { prompt_ids: number[]; response_ids: number[]; loss_mask: number[] }[];
      };
      expect(traj.traces).toHaveLength(1);
      const t = traj.traces[0]!;
      const recs = await records(sid);
      const text = getTokenizer().decode([...t.prompt_ids, ...t.response_ids], false);
      expect(text).toBe(getTokenizer().decode([...recs[1]!.prompt_ids, ...recs[1]!.output_ids], false));
      const expectedInOrder = [
        "<|im_start|>system\nYou are a terse coding agent.",
        '"name": "run_shell"',
        `<|im_start|>user\n${SCRIPT}<|im_end|>`,
        '<|im_start|>assistant\n<think>\nI should list the files.\n</think>\n\n<tool_call>\n{"name": "run_shell", "arguments": {"command": "ls", "timeout": 5}}\n</tool_call><|im_end|>',
        '<|im_start|>user\n<tool_response>\n{"output":"a.txt\\nb.txt"}\n</tool_response><|im_end|>',
        "<|im_start|>assistant\n<think>\nTwo files.\n</think>\n\nThere are two files.<|im_end|>",
      ];
      expect(text.startsWith("<|im_start|>system\n")).toBe(true);
      let at = 0;
      for (const piece of expectedInOrder) {
        const found = text.indexOf(piece, at);
        expect(found, piece).toBeGreaterThanOrEqual(at);
        at = found + piece.length;
      }
      expect(at).toBe(text.length);
      // Both model answers are trainable, the tool turn between them is not.
      expect(t.loss_mask.filter((m) => m === 1)).toHaveLength(recs[0]!.output_ids.length + recs[1]!.output_ids.length);
    }
  });

  it("a tool call whose arguments are JSON but not an object is given as {value: v} and, echoed back so, restored: the rollout stays one trace", async () => {
    // The policy writes the call itself (a model may: Gemini's args can only be an object).
    const rawCall = (args: string) => `<tool_call>\n{"name": "run_shell", "arguments": ${args}}\n</tool_call>`;
    for (const [args, value, stream] of [
      ["5", 5, false],
      ["[1, 2]", [1, 2], true],
      ['"text"', "text", false],
    ] as const) {
      const s = await openSession();
      const ai = client(s);
      const model = "gemini-2.5-flash";
      const user: Content = { role: "user", parts: [{ text: `Run it.\n#sim: ${JSON.stringify([{ text: rawCall(args) }, { text: "Ran it." }])}` }] };
      let modelTurn: Content;
      if (stream) {
        const chunks: GenerateContentResponse[] = [];
        for await (const c of await ai.models.generateContentStream({ model, contents: [user], config })) chunks.push(c);
        modelTurn = foldStream(chunks).content;
      } else {
        modelTurn = (await ai.models.generateContent({ model, contents: [user], config })).candidates![0]!.content!;
      }
      const call = modelTurn.parts!.find((p) => p.functionCall)!.functionCall!;
      expect(call, args).toMatchObject({ name: "run_shell", args: { value } });
      const toolTurn: Content = { role: "user", parts: [{ functionResponse: { id: call.id, name: call.name, response: { output: "ok" } } }] };
      const second = await ai.models.generateContent({ model, contents: [user, modelTurn, toolTurn], config });
      expect(second.text?.trim(), args).toBe("Ran it.");

      const recs = await records(s.id);
      expect(recs, args).toHaveLength(2);
      expect(recs[0]!.message.tool_calls.map((c) => c.function.arguments), args).toEqual([args]);
      // The echoed turn is the engine's own call again, not {"value": …}.
      expect(recs[1]!.request.messages[2], args).toMatchObject({ role: "assistant", tool_calls: [{ function: { name: "run_shell", arguments: args } }] });
      const traj = (await (await fetch(`${h.url}/v1/sessions/${s.id}/trajectory`)).json()) as { traces: { prompt_ids: number[]; response_ids: number[] }[] };
      expect(traj.traces, args).toHaveLength(1);
      expect([...traj.traces[0]!.prompt_ids, ...traj.traces[0]!.response_ids], args).toEqual([...recs[1]!.prompt_ids, ...recs[1]!.output_ids]);
    }
  });

  it("streams a JSON array without alt=sse and accepts ?key=", async () => {
    const s = await openSession();
    const res = await fetch(`${h.url}/s/${s.id}/v1beta/models/m:streamGenerateContent?key=${s.token}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ contents: [{ role: "user", parts: [{ text: '#sim: [{"text": "Hello there"}]' }] }] }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/application\/json/);
    const chunks = JSON.parse(await res.text()) as GenerateContentResponse[];
    expect(chunks.map((c) => c.candidates![0]!.content!.parts!.map((p) => p.text).join("")).join("")).toBe("Hello there");
    expect(chunks.at(-1)!.candidates![0]!.finishReason).toBe("STOP");
    expect(chunks.at(-1)!.usageMetadata!.totalTokenCount).toBeGreaterThan(0);
  });

  it("answers errors in Google's shape: wrong key 401, bad body 400, closed session 403, unknown method 404", async () => {
    const s = await openSession();
    const contents = [USER];
    await expect(client(s, "wrong-key").models.generateContent({ model: "m", contents })).rejects.toMatchObject({ name: "ApiError", status: 401 });
    await expect(client(s, "wrong-key").models.generateContentStream({ model: "m", contents })).rejects.toMatchObject({ status: 401 });
    await expect(client(s).models.generateContent({ model: "m", contents, config: { candidateCount: 2 } })).rejects.toMatchObject({
      status: 400,
      message: expect.stringMatching(/candidateCount/),
    });

    const post = (path: string, body: string, key = s.token) =>
      fetch(`${h.url}/s/${s.id}${path}`, { method: "POST", headers: { "content-type": "application/json", "x-goog-api-key": key }, body });
    const bad = await post("/v1beta/models/m:generateContent", JSON.stringify({ contents: [{ role: "user", parts: [{ functionCall: { args: {} } }] }] }));
    expect(bad.status).toBe(400);
    const badBody = (await bad.json()) as { error: { code: number; status: string; message: string } };
    expect(badBody.error).toMatchObject({ code: 400, status: "INVALID_ARGUMENT" });
    expect(badBody.error.message).toMatch(/contents\[0\]\.parts\[0\]\.functionCall\.name/);
    const badJson = await post("/v1beta/models/m:generateContent", "{nope");
    expect(badJson.status).toBe(400);
    expect(((await badJson.json()) as { error: { status: string } }).error.status).toBe("INVALID_ARGUMENT");
    const unknown = await post("/v1beta/models/m:embedContent", JSON.stringify({ contents }));
    expect(unknown.status).toBe(404);
    expect(((await unknown.json()) as { error: { status: string } }).error.status).toBe("NOT_FOUND");
    const wrong = await post("/v1beta/models/m:generateContent", JSON.stringify({ contents }), "nope");
    expect(((await wrong.json()) as { error: { status: string } }).error.status).toBe("UNAUTHENTICATED");
    expect(await records(s.id)).toEqual([]);

    await fetch(`${h.url}/v1/sessions/${s.id}/close`, { method: "POST" });
    await expect(client(s).models.generateContent({ model: "m", contents })).rejects.toMatchObject({ status: 403 });
  });

  it("a body Gemini's protocol cannot express uses up none of the session's calls, once the gateway knows the session", async () => {
    const opened = await fetch(`${h.url}/v1/sessions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ limits: { max_llm_calls: 2 } }) });
    const s = (await opened.json()) as { id: string; token: string };
    const contents = [{ role: "user", parts: [{ text: "hi" }] }];
    const generate = (body: unknown) =>
      fetch(`${h.url}/s/${s.id}/v1beta/models/m:generateContent`, { method: "POST", headers: { "content-type": "application/json", "x-goog-api-key": s.token }, body: JSON.stringify(body) });
    // The first call checks the token: later calls take their number in the session read, before the body is translated.
    expect((await generate({ contents })).status).toBe(200);
    expect((await generate({ contents: [{ role: "user", parts: [{ functionCall: { args: {} } }] }] })).status).toBe(400);
    expect((await generate({ contents: "hi" })).status).toBe(400);
    expect((await generate({ contents })).status).toBe(200);
    expect((await records(s.id)).map((r) => r.seq)).toEqual([0, 1]);
  });

  it("a function response's media parts reach the engine or are refused with 400, never left out", async () => {
    const s = await openSession();
    const ai = client(s);
    const callTurn: Content = { role: "model", parts: [{ functionCall: { id: "c1", name: "run_shell", args: { command: "cat shot.png" } } }] };
    const answer = (parts: Parameters<typeof createPartFromFunctionResponse>[3]): Content[] => [
      USER,
      callTurn,
      { role: "user", parts: [createPartFromFunctionResponse("c1", "run_shell", { output: "the screenshot" }, parts)] },
    ];
    // A PNG goes to the engine as an image of the tool's answer: this text-only engine refuses it in so many words.
    await expect(ai.models.generateContent({ model: "m", contents: answer([createFunctionResponsePartFromBase64("iVBORw0KGgo=", "image/png")]), config })).rejects.toMatchObject({
      status: 400,
      message: expect.stringMatching(/image_url/),
    });
    await expect(ai.models.generateContent({ model: "m", contents: answer([createFunctionResponsePartFromBase64("JVBERi0=", "application/pdf")]), config })).rejects.toMatchObject({
      status: 400,
      message: expect.stringMatching(/contents\[2\]\.parts\[0\]\.functionResponse\.parts\[0\]\.inlineData\.mimeType/),
    });
    await expect(ai.models.generateContent({ model: "m", contents: answer([createFunctionResponsePartFromUri("gs://bucket/shot.png", "image/png")]), config })).rejects.toMatchObject({
      status: 400,
      message: expect.stringMatching(/functionResponse\.parts\[0\]\.fileData/),
    });
    expect(await records(s.id)).toEqual([]);
    // Without parts the same answer is served, and the session goes on.
    expect((await ai.models.generateContent({ model: "m", contents: answer(undefined), config })).candidates).toHaveLength(1);
  });

  it("takes a system instruction in each form an agent sends: a string, parts, a Content with role user, system or none", async () => {
    const s = await openSession();
    const ai = client(s);
    const forms = [
      "Be terse.",
      { parts: [{ text: "Be terse." }] },
      { role: "user", parts: [{ text: "Be terse." }] },
      { role: "system", parts: [{ text: "Be terse." }] },
    ];
    for (const systemInstruction of forms) {
      expect((await ai.models.generateContent({ model: "m", contents: "hi", config: { systemInstruction, maxOutputTokens: 4 } })).candidates).toHaveLength(1);
    }
    const prompts = (await records(s.id)).map((r) => getTokenizer().decode(r.prompt_ids, false));
    expect(prompts).toHaveLength(forms.length);
    for (const p of prompts) expect(p).toBe(prompts[0]);
    expect(prompts[0]).toMatch(/^<\|im_start\|>system\nBe terse\.<\|im_end\|>/);
  });

  it("answers an unreachable engine with 502 UNAVAILABLE", async () => {
    const env = GatewayEnv.parse({ REDIS_URL: TEST_REDIS_URL, ROLLGATE_KEY_PREFIX: h.prefix, ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: "http://127.0.0.1:9", dp_size: 1 }]) });
    const down = await buildGateway({ env, logger: pino({ level: "silent" }) });
    try {
      const s = (await down.inject({ method: "POST", url: "/v1/sessions", payload: {} })).json() as { id: string; token: string };
      for (const action of ["generateContent", "streamGenerateContent?alt=sse"]) {
        const res = await down.inject({
          method: "POST",
          url: `/s/${s.id}/v1beta/models/m:${action}`,
          headers: { "x-goog-api-key": s.token },
          payload: { contents: [USER] },
        });
        expect(res.statusCode).toBe(502);
        expect(res.json().error).toMatchObject({ code: 502, status: "UNAVAILABLE" });
      }
    } finally {
      await down.close();
    }
  });

  it("counts tokens and lists the served model", async () => {
    const s = await openSession();
    const ai = client(s);
    const counted = await ai.models.countTokens({ model: "m", contents: "hello there" });
    expect(counted.totalTokens).toBeGreaterThan(2);
    const res = await fetch(`${h.url}/s/${s.id}/v1beta/models`, { headers: { "x-goog-api-key": s.token } });
    expect(((await res.json()) as { models: { name: string }[] }).models[0]!.name).toBe("models/Qwen/Qwen3-8B");
  });
});
