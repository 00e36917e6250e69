/**
 * What agents send, seen from the engine: every sampling parameter an agent sets must reach the
 * engine as sent (the recorded logprobs then describe the request the agent made), or be refused in
 * the agent's own protocol, naming the field, before anything is sampled. The real SDKs (openai,
 * @anthropic-ai/sdk, @google/genai; raw REST for Gemini's snake_case names, which the SDK never
 * sends) against a real gateway and an in-process engine-sim whose received bodies are captured.
 */
import { randomUUID } from "node:crypto";
import Anthropic from "@anthropic-ai/sdk";
import { buildEngineSim } from "@rollgate/engine-sim";
import { ApiError, FunctionCallingConfigMode, GoogleGenAI } from "@google/genai";
import type { FastifyInstance } from "fastify";
import OpenAI from "openai";
import { pino } from "pino";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { TEST_REDIS_URL, dropPrefixes, listenLocal } from "./__fixtures__/harness.js";
import { buildGateway } from "./app.js";
import { GatewayEnv } from "./env.js";

/** The generation requests engine-sim received (tokenize and the like left out). */
const generations: Record<string, unknown>[] = [];
let sim: FastifyInstance;
let app: FastifyInstance;
let url = "";
const prefix = `test-agent-params-${randomUUID().slice(0, 8)}`;

beforeAll(async () => {
  sim = buildEngineSim({ dpSize: 1, model: "Qwen/Qwen3-8B" });
  sim.addHook("preHandler", async (req) => {
    if (req.method === "POST" && (req.url === "/v1/chat/completions" || req.url === "/v1/completions")) generations.push(req.body as Record<string, unknown>);
  });
  const simUrl = await listenLocal(sim);
  app = await buildGateway({
    env: GatewayEnv.parse({
      REDIS_URL: TEST_REDIS_URL,
      ROLLGATE_KEY_PREFIX: prefix,
      ROLLGATE_ENGINES: JSON.stringify([{ kind: "vllm", url: simUrl, dp_size: 1, profile: "qwen3" }]),
      ROLLGATE_HEALTH_INTERVAL_S: "0",
    }),
    logger: pino({ level: "silent" }),
  });
  url = await listenLocal(app);
  // The engine's preflight sends generations of its own: let it finish before any test counts them.
  const engines = await fetch(`${url}/admin/engines?wait_s=60`);
  expect(engines.status).toBe(200);
});

afterAll(async () => {
  await app?.close();
  await sim?.close();
  await dropPrefixes([prefix]);
});

beforeEach(() => {
  generations.length = 0;
});

const openSession = async () => {
  const res = await fetch(`${url}/v1/sessions`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  return (await res.json()) as { id: string; token: string };
};
const openai = (s: { id: string; token: string }) => new OpenAI({ apiKey: s.token, baseURL: `${url}/s/${s.id}/v1`, maxRetries: 0 });
const anthropic = (s: { id: string; token: string }) => new Anthropic({ apiKey: s.token, baseURL: `${url}/s/${s.id}`, maxRetries: 0 });
const gemini = (s: { id: string; token: string }) => new GoogleGenAI({ apiKey: s.token, httpOptions: { baseUrl: `${url}/s/${s.id}` } });

/** The one generation the engine received for the last call. */
function generation(): Record<string, unknown> {
  expect(generations).toHaveLength(1);
  return generations[0]!;
}

const SAMPLING_KEYS = ["temperature", "top_p", "top_k", "min_p", "max_tokens", "stop", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty"];
const samplingOf = (body: Record<string, unknown>) => Object.fromEntries(SAMPLING_KEYS.filter((k) => body[k] !== undefined).map((k) => [k, body[k]]));

const VLLM_SAMPLING = { top_k: 3, min_p: 0.05, repetition_penalty: 1.3, seed: 11, stop: ["QQQ"], presence_penalty: 0.25, frequency_penalty: 0.5 };

describe("sampling parameters reach the engine as the agent sent them", () => {
  it("OpenAI chat: OpenAI's own and vLLM's extensions (repetition_penalty included)", async () => {
    const s = await openSession();
    const body = { model: "m", messages: [{ role: "user" as const, content: "hi" }], temperature: 0.7, top_p: 0.9, max_completion_tokens: 6, ...VLLM_SAMPLING };
    await openai(s).chat.completions.create(body as OpenAI.ChatCompletionCreateParamsNonStreaming);
    expect(samplingOf(generation())).toEqual({ temperature: 0.7, top_p: 0.9, max_tokens: 6, ...VLLM_SAMPLING });
  });

  it("OpenAI Responses: temperature, top_p, max_output_tokens and vLLM's extensions", async () => {
    const s = await openSession();
    const body = { model: "m", input: "hi", temperature: 0.7, top_p: 0.9, max_output_tokens: 6, ...VLLM_SAMPLING };
    await openai(s).responses.create(body as OpenAI.Responses.ResponseCreateParamsNonStreaming);
    expect(samplingOf(generation())).toEqual({ temperature: 0.7, top_p: 0.9, max_tokens: 6, ...VLLM_SAMPLING });
  });

  it("Anthropic: temperature, top_p, top_k, stop_sequences, max_tokens; thinking disabled turns the template's thinking off", async () => {
    const s = await openSession();
    // This SDK's types no longer list the sampling fields; the Messages API still takes them.
    const body = { model: "m", max_tokens: 6, messages: [{ role: "user", content: "hi" }], temperature: 0.7, top_p: 0.9, top_k: 3, stop_sequences: ["QQQ"], thinking: { type: "disabled" } };
    await anthropic(s).messages.create(body as Anthropic.MessageCreateParamsNonStreaming);
    const sent = generation();
    expect(samplingOf(sent)).toEqual({ temperature: 0.7, top_p: 0.9, top_k: 3, max_tokens: 6, stop: ["QQQ"] });
    expect(sent.chat_template_kwargs).toEqual({ enable_thinking: false });
  });

  it("Gemini: generationConfig's sampling fields", async () => {
    const s = await openSession();
    const config = { temperature: 0.7, topP: 0.9, topK: 3, maxOutputTokens: 6, stopSequences: ["QQQ"], seed: 11, presencePenalty: 0.25, frequencyPenalty: 0.5, thinkingConfig: { thinkingBudget: 0 } };
    await gemini(s).models.generateContent({ model: "m", contents: "hi", config });
    const sent = generation();
    expect(samplingOf(sent)).toEqual({ temperature: 0.7, top_p: 0.9, top_k: 3, max_tokens: 6, stop: ["QQQ"], seed: 11, presence_penalty: 0.25, frequency_penalty: 0.5 });
    expect(sent.chat_template_kwargs).toEqual({ enable_thinking: false });
  });
});

describe("the session's sampling and the agent's", () => {
  it("the session's pinned values win and its max_tokens caps, while the agent's stop strings still end its answers", async () => {
    const res = await fetch(`${url}/v1/sessions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ sampling: { temperature: 1, max_tokens: 5, stop: ["</answer>"] } }),
    });
    const s = (await res.json()) as { id: string; token: string };
    // A ReAct-style agent: it stops the model before it writes the observation itself.
    await openai(s).chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }], temperature: 0.2, max_tokens: 50, stop: ["Observation:", "</answer>"] });
    expect(samplingOf(generation())).toEqual({ temperature: 1, max_tokens: 5, stop: ["</answer>", "Observation:"] });
  });
});

describe("tool restrictions reach the engine", () => {
  it("a forced tool call with no tool the engine can call is a 400 in every protocol, not a text answer", async () => {
    const s = await openSession();
    const chatErr = await openai(s).chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 4, tool_choice: "required" }).catch((e: unknown) => e);
    expect((chatErr as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("tool_choice");
    expect((chatErr as Error).message).toMatch(/forces a tool call, but no function tool is offered to the engine/);
    const respErr = await openai(s)
      .responses.create({ model: "m", input: "hi", max_output_tokens: 4, tools: [{ type: "web_search" }], tool_choice: "required" })
      .catch((e: unknown) => e);
    expect((respErr as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("tool_choice");
    const anthErr = await anthropic(s)
      .messages.create({ model: "m", max_tokens: 4, messages: [{ role: "user", content: "hi" }], tools: [{ type: "web_search_20250305", name: "web_search" }], tool_choice: { type: "any" } })
      .catch((e: unknown) => e);
    expect(anthErr).toBeInstanceOf(Anthropic.BadRequestError);
    expect((anthErr as Error).message).toMatch(/tool_choice: forces a tool call/);
    const gemErr = await gemini(s)
      .models.generateContent({ model: "m", contents: "hi", config: { tools: [{ googleSearch: {} }], toolConfig: { functionCallingConfig: { mode: FunctionCallingConfigMode.ANY } } } })
      .catch((e: unknown) => e);
    expect((gemErr as ApiError).status).toBe(400);
    expect((gemErr as Error).message).toMatch(/toolConfig\.functionCallingConfig\.mode: forces a tool call/);
    expect(generations).toEqual([]);
    // Letting the model choose with nothing to call is no constraint: answered, and no tool_choice reaches the engine.
    await openai(s).chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 4, tool_choice: "auto" });
    expect(generation()).not.toHaveProperty("tool_choice");
  });

  it("Responses allowed_tools: only the allowed functions are offered; an allowed tool never declared is a 400", async () => {
    const s = await openSession();
    const fn = (name: string) => ({ type: "function" as const, name, parameters: { type: "object", properties: {} }, strict: false });
    const ask = (allowed: { type: "function"; name: string }[]) =>
      openai(s).responses.create({
        model: "m",
        input: "hi",
        max_output_tokens: 4,
        tools: [fn("read_file"), fn("delete_everything")],
        tool_choice: { type: "allowed_tools", mode: "required", tools: allowed },
      });
    await ask([{ type: "function", name: "read_file" }]).catch(() => undefined);
    const sent = generation();
    expect((sent.tools as { function: { name: string } }[]).map((t) => t.function.name)).toEqual(["read_file"]);
    expect(sent.tool_choice).toBe("required");
    generations.length = 0;
    const err = await ask([{ type: "function", name: "write_file" }]).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("tool_choice.tools.0.name");
    expect(generations).toEqual([]);
  });
});

describe("a parameter the gateway cannot honour is refused in the caller's protocol, naming it, and nothing is sampled", () => {
  // [field, a value asking for something the gateway cannot do, the neutral value it accepts]
  const CHAT: [string, unknown, unknown][] = [
    ["logit_bias", { "1234": 100 }, {}],
    ["response_format", { type: "json_object" }, { type: "text" }],
    ["response_format", { type: "json_schema", json_schema: { name: "x", schema: { type: "object" } } }, { type: "text" }],
    ["modalities", ["text", "audio"], ["text"]],
    ["functions", [{ name: "read_file", parameters: { type: "object" } }], []],
    ["function_call", "auto", null],
    ["min_tokens", 4, 0],
    ["ignore_eos", true, false],
    ["stop_token_ids", [151643], []],
    ["bad_words", ["error"], []],
    ["allowed_token_ids", [1, 2, 3], null],
    ["guided_json", { type: "object" }, null],
    ["guided_choice", ["yes", "no"], null],
    ["structured_outputs", { json: { type: "object" } }, null],
    ["best_of", 2, 1],
    ["use_beam_search", true, false],
    ["chat_template", "{{ messages }}", null],
    ["add_generation_prompt", false, true],
    ["continue_final_message", true, false],
    ["truncate_prompt_tokens", 8, null],
  ];

  it.each(CHAT)("OpenAI chat: %s", async (field, asking, neutral) => {
    const s = await openSession();
    const ask = (value: unknown) =>
      openai(s).chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 4, [field]: value } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    const err = await ask(asking).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).param).toBe(field);
    expect((err as Error).message).toMatch(new RegExp(`${field}.*(not supported|only)`));
    expect(generations).toEqual([]);
    // Its neutral value asks for nothing and is accepted.
    await ask(neutral);
    expect(generation()).toBeDefined();
  });

  it("OpenAI Responses: text.format json_schema / json_object (text is accepted)", async () => {
    const s = await openSession();
    const ask = (format: unknown) => openai(s).responses.create({ model: "m", input: "hi", max_output_tokens: 4, text: { format } } as OpenAI.Responses.ResponseCreateParamsNonStreaming);
    for (const format of [{ type: "json_schema", name: "answer", schema: { type: "object" }, strict: true }, { type: "json_object" }]) {
      const err = await ask(format).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expect((err as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("text.format");
      expect((err as Error).message).toMatch(/text\.format: structured output is not supported/);
    }
    expect(generations).toEqual([]);
    await ask({ type: "text" });
    expect(generation()).toBeDefined();
  });

  it("Anthropic: output_config.format and the beta output_format", async () => {
    const s = await openSession();
    const format = { type: "json_schema" as const, schema: { type: "object", properties: { a: { type: "string" } } } };
    const base = { model: "m", max_tokens: 4, messages: [{ role: "user" as const, content: "hi" }] };
    for (const extra of [{ output_config: { format } }, { output_format: format }]) {
      const err = await anthropic(s).messages.create({ ...base, ...extra } as Anthropic.MessageCreateParamsNonStreaming).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(Anthropic.BadRequestError);
      expect((err as InstanceType<typeof Anthropic.BadRequestError>).error).toMatchObject({
        type: "error",
        error: { type: "invalid_request_error", message: expect.stringMatching(/output_(config\.)?format: structured output is not supported/) },
      });
    }
    expect(generations).toEqual([]);
    await anthropic(s).messages.create({ ...base, output_config: { effort: "low" } });
    expect(generation()).toBeDefined();
  });

  it("Gemini: responseMimeType application/json, responseSchema, responseJsonSchema, responseModalities beyond TEXT", async () => {
    const s = await openSession();
    const refused: [string, Record<string, unknown>][] = [
      ["responseMimeType", { responseMimeType: "application/json" }],
      ["responseSchema", { responseSchema: { type: "OBJECT", properties: { a: { type: "STRING" } } } }],
      ["responseJsonSchema", { responseJsonSchema: { type: "object" } }],
      ["responseModalities", { responseModalities: ["TEXT", "IMAGE"] }],
    ];
    for (const [field, config] of refused) {
      const err = await gemini(s).models.generateContent({ model: "m", contents: "hi", config: { maxOutputTokens: 4, ...config } }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(ApiError);
      expect((err as ApiError).status).toBe(400);
      expect((err as Error).message).toMatch(new RegExp(`generationConfig\\.${field}: .*(not supported|only TEXT)`));
      expect((err as Error).message).toMatch(/INVALID_ARGUMENT/);
    }
    expect(generations).toEqual([]);
    await gemini(s).models.generateContent({ model: "m", contents: "hi", config: { maxOutputTokens: 4, responseMimeType: "text/plain", responseModalities: ["TEXT" as never] } });
    expect(generation()).toBeDefined();
  });
});

describe("content the engines cannot take is refused in the caller's protocol, naming the part", () => {
  it("OpenAI chat: audio and file parts (Responses names its part types the same way)", async () => {
    const s = await openSession();
    const parts = [
      { type: "input_audio", input_audio: { data: "AAAA", format: "wav" } },
      { type: "file", file: { file_id: "file-1" } },
    ];
    for (const part of parts) {
      const err = await openai(s)
        .chat.completions.create({ model: "m", messages: [{ role: "user", content: [{ type: "text", text: "listen" }, part] }] } as OpenAI.ChatCompletionCreateParamsNonStreaming)
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expect((err as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("messages.0.content.1.type");
      expect((err as Error).message).toContain(`unsupported content part type "${part.type}"; expected text or image_url`);
    }
    const err = await openai(s)
      .responses.create({ model: "m", input: [{ role: "user", content: [{ type: "input_file", file_id: "file-1" }] }] })
      .catch((e: unknown) => e);
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("input.0.content.0.type");
    expect((err as Error).message).toContain('unsupported content part type "input_file"');
    expect(generations).toEqual([]);
  });
});

describe("images must come inline: the engine would fetch a URL itself, and the rollout would not hold the image", () => {
  const URL_ = "http://169.254.169.254/latest/meta-data/";
  const INLINE = "data:image/png;base64,AAAA";
  /** Whether the one generation the engine got carries the inline image (engine-sim, text-only, then refuses it). */
  const engineGotInline = () => JSON.stringify(generation().messages).includes(INLINE);

  it("OpenAI chat and Responses", async () => {
    const s = await openSession();
    const chat = (url: string) =>
      openai(s).chat.completions.create({ model: "m", messages: [{ role: "user", content: [{ type: "text", text: "look" }, { type: "image_url", image_url: { url } }] }] });
    const err = await chat(URL_).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("messages.0.content.1.image_url.url");
    expect((err as Error).message).toMatch(/images by URL are not supported: send the image inline \(a data: URL\)/);
    const resp = (url: string) => openai(s).responses.create({ model: "m", input: [{ role: "user", content: [{ type: "input_image", image_url: url, detail: "auto" }] }] });
    const rerr = await resp(URL_).catch((e: unknown) => e);
    expect((rerr as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("input.0.content.0.image_url");
    expect((rerr as Error).message).toMatch(/images by URL are not supported/);
    expect(generations).toEqual([]);
    await chat(INLINE).catch(() => undefined);
    expect(engineGotInline()).toBe(true);
  });

  it("Anthropic (a url source) and Gemini (fileData)", async () => {
    const s = await openSession();
    const err = await anthropic(s)
      .messages.create({ model: "m", max_tokens: 4, messages: [{ role: "user", content: [{ type: "image", source: { type: "url", url: URL_ } }] }] })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.BadRequestError);
    expect((err as Error).message).toMatch(/messages\.0\.content\.0\.source: images by URL are not supported: send the image inline \(a base64 source\)/);
    const gerr = await gemini(s)
      .models.generateContent({ model: "m", contents: [{ role: "user", parts: [{ text: "look" }, { fileData: { mimeType: "image/png", fileUri: URL_ } }] }] })
      .catch((e: unknown) => e);
    expect((gerr as ApiError).status).toBe(400);
    expect((gerr as Error).message).toMatch(/contents\[0\]\.parts\[1\]\.fileData: images by URL are not supported: send the image inline \(inlineData\)/);
    expect(generations).toEqual([]);
    await gemini(s).models.generateContent({ model: "m", contents: [{ role: "user", parts: [{ inlineData: { mimeType: "image/png", data: "AAAA" } }] }] }).catch(() => undefined);
    expect(engineGotInline()).toBe(true);
  });
});

describe("Gemini's snake_case field names (proto3 JSON; Google's REST examples send them)", () => {
  const post = async (s: { id: string; token: string }, body: unknown) => {
    const res = await fetch(`${url}/s/${s.id}/v1beta/models/gemini-test:generateContent`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-goog-api-key": s.token },
      body: JSON.stringify(body),
    });
    return { status: res.status, body: (await res.json()) as { error?: { code: number; message: string; status: string } } };
  };
  const TOOL_SCHEMA = { type: "object", properties: { file_path: { type: "string" } }, required: ["file_path"] };

  it("reach the engine exactly as their camelCase forms do: system prompt, replayed call and its response, tools, sampling", async () => {
    const camel = {
      systemInstruction: { parts: [{ text: "You are terse." }] },
      contents: [
        { role: "user", parts: [{ text: "read it" }] },
        { role: "model", parts: [{ functionCall: { name: "read_file", args: { file_path: "a.txt" } } }] },
        { role: "user", parts: [{ functionResponse: { name: "read_file", response: { file_text: "hello" } } }] },
      ],
      tools: [{ functionDeclarations: [{ name: "read_file", parametersJsonSchema: TOOL_SCHEMA }] }],
      toolConfig: { functionCallingConfig: { mode: "AUTO" } },
      generationConfig: { maxOutputTokens: 5, topK: 3, stopSequences: ["QQQ"], thinkingConfig: { thinkingBudget: 0 } },
    };
    const snake = {
      system_instruction: { parts: [{ text: "You are terse." }] },
      contents: [
        { role: "user", parts: [{ text: "read it" }] },
        { role: "model", parts: [{ function_call: { name: "read_file", args: { file_path: "a.txt" } } }] },
        { role: "user", parts: [{ function_response: { name: "read_file", response: { file_text: "hello" } } }] },
      ],
      tools: [{ function_declarations: [{ name: "read_file", parameters_json_schema: TOOL_SCHEMA }] }],
      tool_config: { function_calling_config: { mode: "AUTO" } },
      generation_config: { max_output_tokens: 5, top_k: 3, stop_sequences: ["QQQ"], thinking_config: { thinking_budget: 0 } },
    };
    const seen = async (body: unknown) => {
      const s = await openSession();
      generations.length = 0;
      const res = await post(s, body);
      expect(res.status).toBe(200);
      const { messages, tools, chat_template_kwargs } = generation();
      return { messages, tools, chat_template_kwargs, sampling: samplingOf(generation()) };
    };
    const fromCamel = await seen(camel);
    expect(fromCamel.sampling).toEqual({ max_tokens: 5, top_k: 3, stop: ["QQQ"] });
    expect((fromCamel.messages as { role: string }[]).map((m) => m.role)).toEqual(["system", "user", "assistant", "tool"]);
    expect(await seen(snake)).toEqual(fromCamel);

    // countTokens counts the same prompt, its wrapper under either name too.
    const s = await openSession();
    const count = async (body: unknown) => {
      const res = await fetch(`${url}/s/${s.id}/v1beta/models/gemini-test:countTokens`, { method: "POST", headers: { "content-type": "application/json", "x-goog-api-key": s.token }, body: JSON.stringify(body) });
      expect(res.status).toBe(200);
      return ((await res.json()) as { totalTokens: number }).totalTokens;
    };
    const camelCount = await count({ generateContentRequest: camel });
    expect(await count({ generate_content_request: snake })).toBe(camelCount);
    expect(await count(snake)).toBe(camelCount);
  });

  it("a field under both names, or a part holding only fields the gateway does not read, is a 400 naming it", async () => {
    const s = await openSession();
    const both = await post(s, { contents: [{ parts: [{ text: "hi" }] }], generationConfig: { maxOutputTokens: 5, max_output_tokens: 50 } });
    expect(both.status).toBe(400);
    expect(both.body.error).toMatchObject({ code: 400, status: "INVALID_ARGUMENT", message: expect.stringMatching(/generationConfig\.max_output_tokens: .*same field/) });
    const unread = await post(s, { contents: [{ parts: [{ text: "hi" }, { inlineDatas: { mimeType: "image/png", data: "AAAA" } }] }] });
    expect(unread.status).toBe(400);
    expect(unread.body.error?.message).toMatch(/contents\[0\]\.parts\[1\]\.inlineDatas: unsupported part field/);
    expect(generations).toEqual([]);
  });
});

describe("a thinking setting the provider's API has no value for is a 400 naming it, not a guess", () => {
  it("Gemini thinkingLevel: an unknown level is refused; THINKING_LEVEL_UNSPECIFIED leaves the template's default", async () => {
    const s = await openSession();
    const ask = (thinkingLevel: string) => gemini(s).models.generateContent({ model: "m", contents: "hi", config: { maxOutputTokens: 4, thinkingConfig: { thinkingLevel: thinkingLevel as never } } });
    const err = await ask("ULTRA").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ApiError);
    expect((err as ApiError).status).toBe(400);
    expect((err as Error).message).toMatch(/generationConfig\.thinkingConfig\.thinkingLevel/);
    expect(generations).toEqual([]);
    await ask("THINKING_LEVEL_UNSPECIFIED");
    const sent = generation();
    expect(sent.chat_template_kwargs).toBeUndefined();
    expect(sent.reasoning_effort).toBeUndefined();
    generations.length = 0;
    await ask("low");
    expect(generation().chat_template_kwargs).toEqual({ enable_thinking: true });
  });

  it("Anthropic thinking.type: only enabled, adaptive and disabled", async () => {
    const s = await openSession();
    const base = { model: "m", max_tokens: 4, messages: [{ role: "user" as const, content: "hi" }] };
    const err = await anthropic(s).messages.create({ ...base, thinking: { type: "turbo" } } as never).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.BadRequestError);
    expect((err as Error).message).toMatch(/thinking\.type/);
    expect(generations).toEqual([]);
    await anthropic(s).messages.create({ ...base, thinking: { type: "adaptive" } });
    expect(generation().chat_template_kwargs).toEqual({ enable_thinking: true });
  });

  it("OpenAI Responses reasoning.effort: only the SDK's efforts", async () => {
    const s = await openSession();
    const ask = (effort: string) => openai(s).responses.create({ model: "m", input: "hi", max_output_tokens: 4, reasoning: { effort: effort as never } });
    const err = await ask("turbo").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("reasoning.effort");
    expect(generations).toEqual([]);
    await ask("minimal");
    expect(generation().chat_template_kwargs).toEqual({ enable_thinking: false });
  });
});
