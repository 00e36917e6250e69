/**
 * The gateway's logs: captured from a pino logger on a writable stream (LOG_LEVEL debug, so
 * every request is logged), while agents call on every protocol with their session token in
 * each place SDKs put it. No line may hold a token; agent lines carry the session and task ids.
 */
import { randomUUID } from "node:crypto";
import { Writable } from "node:stream";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startSimFleet, type SimFleet } from "./__fixtures__/harness.js";
import { SessionTaskCache, maskUrl, redactingLogger, requestChildLogger } from "./observability/logging.js";

let fleet: SimFleet;

type Line = Record<string, unknown> & { msg?: string; reqId?: string; session_id?: string; task_id?: string };

function capture() {
  let text = "";
  const stream = new Writable({
    write(chunk: Buffer, _enc, done) {
      text += chunk.toString("utf8");
      done();
    },
  });
  return {
    logger: pino({ level: "debug" }, stream),
    text: () => text,
    lines: (): Line[] =>
      text
        .split("\n")
        .filter(Boolean)
        .map((l) => JSON.parse(l) as Line),
  };
}

const gateway = (logger: pino.Logger, env: Record<string, string> = {}) => fleet.gateway({ logger, env: { LOG_LEVEL: "debug", ...env } });

beforeAll(async () => {
  fleet = await startSimFleet("logs", { model: "Qwen/Qwen3-8B" });
});

afterAll(() => fleet.close());

describe("gateway logs", () => {
  it("never contain a session token or the API key, on any protocol; agent lines carry session and task ids", async () => {
    const out = capture();
    const apiKey = `admin-${randomUUID()}`;
    const app = await gateway(out.logger, { ROLLGATE_API_KEY: apiKey });
    const admin = { authorization: `Bearer ${apiKey}` };
    const opened = await app.inject({ method: "POST", url: "/v1/sessions", headers: admin, payload: { metadata: { task_id: "t-logs-1" } } });
    expect(opened.statusCode).toBe(201);
    const s = opened.json() as { id: string; token: string };
    const plain = (await app.inject({ method: "POST", url: "/v1/sessions", headers: admin, payload: {} })).json() as { id: string; token: string };

    const calls = [
      // OpenAI Chat Completions: Bearer.
      app.inject({
        method: "POST",
        url: `/s/${s.id}/v1/chat/completions`,
        headers: { authorization: `Bearer ${s.token}` },
        payload: { messages: [{ role: "user", content: "hi" }], max_tokens: 4 },
      }),
      // OpenAI streamed.
      app.inject({
        method: "POST",
        url: `/s/${s.id}/v1/chat/completions`,
        headers: { authorization: `Bearer ${s.token}` },
        payload: { messages: [{ role: "user", content: "hi" }], max_tokens: 4, stream: true },
      }),
      // Responses: Bearer.
      app.inject({
        method: "POST",
        url: `/s/${s.id}/v1/responses`,
        headers: { authorization: `Bearer ${s.token}` },
        payload: { input: "hi", max_output_tokens: 16 },
      }),
      // Anthropic Messages: x-api-key.
      app.inject({
        method: "POST",
        url: `/s/${s.id}/v1/messages`,
        headers: { "x-api-key": s.token },
        payload: { model: "m", max_tokens: 4, messages: [{ role: "user", content: "hi" }] },
      }),
      // Gemini: ?key= (in the URL Fastify logs) and x-goog-api-key.
      app.inject({
        method: "POST",
        url: `/s/${s.id}/v1beta/models/gemini-x:generateContent?key=${s.token}`,
        payload: { contents: [{ role: "user", parts: [{ text: "hi" }] }], generationConfig: { maxOutputTokens: 4 } },
      }),
      app.inject({
        method: "POST",
        url: `/s/${s.id}/v1beta/models/gemini-x:streamGenerateContent?alt=sse&key=${s.token}`,
        payload: { contents: [{ role: "user", parts: [{ text: "hi" }] }], generationConfig: { maxOutputTokens: 4 } },
      }),
      app.inject({
        method: "POST",
        url: `/s/${s.id}/v1beta/models/gemini-x:generateContent`,
        headers: { "x-goog-api-key": s.token },
        payload: { contents: [{ role: "user", parts: [{ text: "hi" }] }], generationConfig: { maxOutputTokens: 4 } },
      }),
      // A session without a task.
      app.inject({
        method: "POST",
        url: `/s/${plain.id}/v1/chat/completions`,
        headers: { authorization: `Bearer ${plain.token}` },
        payload: { messages: [{ role: "user", content: "hi" }], max_tokens: 4 },
      }),
    ];
    for (const res of await Promise.all(calls)) expect(res.statusCode, res.body).toBe(200);
    // Refusals and a route that does not exist, still with the token in the URL.
    expect((await app.inject({ method: "POST", url: `/s/${s.id}/v1/messages`, headers: { "x-api-key": `${s.token}x` }, payload: {} })).statusCode).toBe(401);
    expect((await app.inject({ method: "GET", url: `/s/${s.id}/no/such/route?key=${s.token}` })).statusCode).toBe(404);
    expect((await app.inject({ method: "GET", url: `/nowhere?key=${s.token}&x=1` })).statusCode).toBe(404);
    // The admin key given as ?key= to bull-board, and a trainer route with a wrong key.
    expect((await app.inject({ method: "GET", url: `/admin/queues/api/queues?key=${apiKey}` })).statusCode).toBe(200);
    expect((await app.inject({ method: "GET", url: `/v1/sessions/${s.id}`, headers: { authorization: `Bearer ${s.token}` } })).statusCode).toBe(401);
    await app.close();

    const text = out.text();
    const lines = out.lines();
    expect(lines.length).toBeGreaterThan(20);
    expect(text).not.toContain(s.token);
    expect(text).not.toContain(plain.token);
    expect(text).not.toContain(apiKey);
    expect(text).toContain("key=[REDACTED]");

    // Every request line has a reqId; every line of an agent request names its session.
    const requestLines = lines.filter((l) => l.reqId);
    expect(requestLines.length).toBeGreaterThan(10);
    const byReq = new Map<string, Line[]>();
    for (const l of requestLines) byReq.set(l.reqId!, [...(byReq.get(l.reqId!) ?? []), l]);
    let agentRequests = 0;
    for (const [, ls] of byReq) {
      const url = (ls.find((l) => l.req) as { req?: { url?: string } } | undefined)?.req?.url ?? "";
      if (!url.startsWith("/s/")) continue;
      agentRequests++;
      const sid = url.split("/")[2];
      for (const l of ls) expect(l.session_id, JSON.stringify(l)).toBe(sid);
      // The task id from the session's metadata is on the completion line of every request of
      // that session (the first request's "incoming" line comes before the session is read).
      const done = ls.find((l) => l.msg === "request completed");
      expect(done, JSON.stringify(ls)).toBeTruthy();
      if (sid === s.id) expect(done!.task_id, JSON.stringify(done)).toBe("t-logs-1");
      else expect(done!.task_id).toBeUndefined();
    }
    expect(agentRequests).toBe(calls.length + 2);
    // Trainer routes name their session too.
    expect(requestLines.some((l) => l.session_id === s.id && (l.req as { url?: string } | undefined)?.url === `/v1/sessions/${s.id}`)).toBe(true);
  });

  it("a request's logger writes the lines its pino child would, made only when it first logs", async () => {
    const out = capture();
    const parent = out.logger.child({});
    parent.level = "info";
    const tasks = new SessionTaskCache(async () => ({ metadata: { task_id: "t-lazy" } }) as never);
    await tasks.taskOf("s-lazy");
    let made = 0;
    const counting = Object.assign(Object.create(parent) as pino.Logger, {
      child: (...args: Parameters<pino.Logger["child"]>) => {
        made++;
        return parent.child(...args);
      },
    });
    const factory = requestChildLogger(tasks);
    const rawReq = { url: "/s/s-lazy/v1/chat/completions" } as never;
    const quiet = factory(counting, { reqId: "req-1" }, {}, rawReq);
    quiet.debug("below the level");
    expect(made).toBe(0);
    expect(out.text()).toBe("");
    const log = factory(counting, { reqId: "req-2" }, {}, rawReq);
    log.warn({ detail: 1 }, "a warning");
    log.info("and more");
    expect(made).toBe(1);
    expect(out.lines().map(({ reqId, session_id, task_id, detail, msg }) => ({ reqId, session_id, task_id, detail, msg }))).toEqual([
      { reqId: "req-2", session_id: "s-lazy", task_id: "t-lazy", detail: 1, msg: "a warning" },
      { reqId: "req-2", session_id: "s-lazy", task_id: "t-lazy", detail: undefined, msg: "and more" },
    ]);
    expect((log.child({ extra: true }) as pino.Logger).bindings()).toMatchObject({ reqId: "req-2", session_id: "s-lazy", task_id: "t-lazy", extra: true });
    // A route's own level (Fastify's logLevel route option) holds over the parent's.
    const verbose = factory(counting, { reqId: "req-3" }, { level: "debug" }, rawReq);
    expect(verbose.level).toBe("debug");
    verbose.debug("route at debug");
    expect(out.lines().at(-1)).toMatchObject({ reqId: "req-3", msg: "route at debug", task_id: "t-lazy" });
  });

  it("redacts secrets in objects logged through the gateway logger, and masks credential query parameters", () => {
    let text = "";
    const log = redactingLogger(
      pino(
        { level: "info" },
        new Writable({
          write(c: Buffer, _e, d) {
            text += c.toString();
            d();
          },
        }),
      ),
    );
    log.info({ headers: { authorization: "Bearer tok-1", "x-api-key": "tok-2", "x-goog-api-key": "tok-3" } }, "headers");
    log.info({ req: { method: "GET", url: "/s/x/v1beta/models?key=tok-4&alt=sse", headers: { authorization: "Bearer tok-5" } } }, "a request");
    log.info({ session: { id: "s-1", token: "tok-6" }, callback: { url: "http://x", secret: "tok-7" } }, "objects");
    for (const t of ["tok-1", "tok-2", "tok-3", "tok-4", "tok-5", "tok-6", "tok-7"]) expect(text).not.toContain(t);
    expect(text).toContain("s-1");
    expect(text).toContain("alt=sse");
    expect(maskUrl("/a?key=1&b=2&token=3#k")).toBe("/a?key=[REDACTED]&b=2&token=[REDACTED]#k");
    expect(maskUrl("/a?monkey=1")).toBe("/a?monkey=1");
  });
});
