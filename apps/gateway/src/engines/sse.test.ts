/**
 * An engine's SSE stream read as JSON payloads, over a real HTTP connection: payloads in order
 * across split reads, an engine error or a non-JSON payload after the payloads before it, and a
 * reader that leaves early closing the engine's connection; the same for the callback reader.
 */
import { once } from "node:events";
import { createServer, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { Readable } from "node:stream";
import { request } from "undici";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EngineError } from "./errors.js";
import { sseEach, sseJson } from "./sse.js";

let server: Server;
let base = "";
let closedEarly: Promise<void> = Promise.resolve();

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function send(res: ServerResponse, frames: (string | Buffer)[]): Promise<void> {
  res.writeHead(200, { "content-type": "text/event-stream" });
  for (const f of frames) {
    res.write(f);
    await sleep(5);
  }
  res.end();
}

beforeAll(async () => {
  server = createServer((req, res) => {
    if (req.url === "/split") void send(res, ['data: {"n":', '1}\n\ndata: {"n":2}\n', "\ndata: [DONE]\n\n"]);
    if (req.url === "/error") void send(res, ['data: {"n":1}\n\ndata: {"error":{"message":"out of memory"}}\n\n', 'data: {"n":2}\n\n']);
    if (req.url === "/utf8") {
      // A leading byte-order mark, and characters of two and four bytes split across reads.
      const bytes = Buffer.from('\uFEFFdata: {"t":"h\u00e9llo \u{1F642}"}\n\n');
      const emoji = bytes.indexOf(Buffer.from("\u{1F642}"));
      void send(res, [bytes.subarray(0, 2), bytes.subarray(2, emoji + 2), bytes.subarray(emoji + 2)]);
    }
    if (req.url === "/garbage") void send(res, ['data: {"n":1}\n\ndata: {oops\n\n']);
    // Comments and keep-alives are no payloads; a payload after [DONE] is the engine's fault.
    if (req.url === "/after-done") void send(res, [': ping\r\n\r\ndata: {"n":1}\r\n\r\ndata: [DONE]\n\n: ping\n\n', 'data: {"n":2}\n\n']);
    if (req.url === "/endless") {
      res.writeHead(200, { "content-type": "text/event-stream" });
      const timer = setInterval(() => res.write('data: {"n":1}\n\n'), 5);
      closedEarly = once(res, "close").then(() => clearInterval(timer));
    }
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
});

/** What a reader of `path`'s body was given, and the error it ended with (null at a clean end). */
async function collect(path: string, readAll: (body: Readable, take: (json: unknown) => number) => Promise<void>): Promise<{ payloads: unknown[]; error: unknown }> {
  const res = await request(`${base}${path}`);
  const payloads: unknown[] = [];
  try {
    await readAll(res.body, (json) => payloads.push(json));
    return { payloads, error: null };
  } catch (error) {
    return { payloads, error };
  }
}

const read = (path: string) =>
  collect(path, async (body, take) => {
    for await (const p of sseJson(body)) take(p);
  });

describe("sseJson", () => {
  it("gives the payloads in order, whatever the reads split them into", async () => {
    expect(await read("/split")).toEqual({ payloads: [{ n: 1 }, { n: 2 }], error: null });
  });

  it("decodes UTF-8 split anywhere across reads and skips a leading byte-order mark", async () => {
    expect(await read("/utf8")).toEqual({ payloads: [{ t: "h\u00e9llo \u{1F642}" }], error: null });
  });

  it("fails on an engine error after the payloads before it", async () => {
    const { payloads, error } = await read("/error");
    expect(payloads).toEqual([{ n: 1 }]);
    expect(error).toBeInstanceOf(EngineError);
    expect(error).toMatchObject({ status: 502, kind: "rejected", message: expect.stringContaining("out of memory") });
  });

  it("fails on a payload that is not JSON", async () => {
    const { payloads, error } = await read("/garbage");
    expect(payloads).toEqual([{ n: 1 }]);
    expect(error).toMatchObject({ status: 502, kind: "bad_response", message: expect.stringContaining("not JSON") });
  });

  it("fails on a payload after [DONE], after the payloads before it (comments and CRLF framing are no payloads)", async () => {
    const { payloads, error } = await read("/after-done");
    expect(payloads).toEqual([{ n: 1 }]);
    expect(error).toMatchObject({ status: 502, kind: "bad_response", message: expect.stringContaining("after [DONE]") });
  });

  it("fails when the body is destroyed before its end, without an error of its own", async () => {
    const body = new Readable({ read() {} });
    body.push('data: {"n":1}\n\n');
    const payloads: unknown[] = [];
    const reading = (async () => {
      for await (const p of sseJson(body)) payloads.push(p);
    })();
    await sleep(5);
    body.destroy();
    await expect(reading).rejects.toMatchObject({ code: "ERR_STREAM_PREMATURE_CLOSE" });
    expect(payloads).toEqual([{ n: 1 }]);
  });

  it("closes the engine's connection when the reader leaves early", async () => {
    const res = await request(`${base}/endless`);
    let n = 0;
    for await (const _ of sseJson(res.body)) if (++n === 3) break;
    await closedEarly;
    expect(n).toBe(3);
  });
});

/** `onJson` sees each payload after it is taken, with how many were taken so far. */
const each = (path: string, onJson?: (json: unknown, n: number) => void) =>
  collect(path, (body, take) =>
    sseEach(body, (json) => {
      const n = take(json);
      onJson?.(json, n);
    }),
  );

describe("sseEach", () => {
  it("gives the payloads in order, whatever the reads split them into, and a byte-order mark and split UTF-8 alike", async () => {
    expect(await each("/split")).toEqual({ payloads: [{ n: 1 }, { n: 2 }], error: null });
    expect(await each("/utf8")).toEqual({ payloads: [{ t: "h\u00e9llo \u{1F642}" }], error: null });
  });

  it("fails on an engine error or a payload that is not JSON, after the payloads before it", async () => {
    const engineError = await each("/error");
    expect(engineError.payloads).toEqual([{ n: 1 }]);
    expect(engineError.error).toMatchObject({ status: 502, kind: "rejected", message: expect.stringContaining("out of memory") });
    const garbage = await each("/garbage");
    expect(garbage.payloads).toEqual([{ n: 1 }]);
    expect(garbage.error).toMatchObject({ status: 502, kind: "bad_response", message: expect.stringContaining("not JSON") });
  });

  it("fails when the body is destroyed before its end, without an error of its own", async () => {
    const body = new Readable({ read() {} });
    body.push('data: {"n":1}\n\n');
    const payloads: unknown[] = [];
    const reading = sseEach(body, (json) => payloads.push(json));
    await sleep(5);
    body.destroy();
    await expect(reading).rejects.toMatchObject({ code: "ERR_STREAM_PREMATURE_CLOSE" });
    expect(payloads).toEqual([{ n: 1 }]);
  });

  it("fails with what the callback threw, takes nothing after it, and closes the engine's connection", async () => {
    const thrown = new EngineError("bad chunk", 502, "bad_response");
    const { payloads, error } = await each("/endless", (_, n) => {
      if (n === 3) throw thrown;
    });
    await closedEarly;
    expect(error).toBe(thrown);
    expect(payloads).toHaveLength(3);
  });
});
