/**
 * Bodies over the limit on a real socket (a listening gateway, engine-sim, real Redis): the
 * client gets a readable 413 in its protocol's error shape, never a reset or a hung connection —
 * also when it sends its whole body before reading the answer (Python's http.client and
 * `requests` do), when the limit is crossed mid-stream, and when the body is chunked.
 */
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type Harness, startHarness } from "./__fixtures__/harness.js";

let h: Harness;
let sid = "";
let token = "";

beforeAll(async () => {
  h = await startHarness("body-limit");
  ({ id: sid, token } = await h.openSession());
});
afterAll(async () => {
  await h?.close();
});

interface Exchange {
  /** The first answer's status line and body, or null when none came. */
  status: number | null;
  body: string;
  /** Set when writing the body failed (EPIPE / ECONNRESET) or stalled. */
  writeError: string | null;
  /** Set when the socket ended in an error (a reset) rather than an orderly close. */
  readError: string | null;
  /** Whether a second request on the same connection was answered (keep-alive after the 413). */
  reused: boolean;
}

/**
 * Sends the request head and the whole body, awaiting each write, reading nothing until the last
 * byte is out (as Python's http.client does); then reads the answer and sends a GET /healthz on
 * the same connection.
 */
function writeAllThenRead(path: string, size: number, chunked: boolean): Promise<Exchange> {
  const port = Number(new URL(h.url).port);
  return new Promise((resolve) => {
    const sock = net.connect(port, "127.0.0.1");
    sock.pause();
    const out: Exchange = { status: null, body: "", writeError: null, readError: null, reused: false };
    sock.on("error", (e) => (out.writeError ??= e.message));
    const write = (b: Buffer | string) =>
      new Promise<void>((ok, fail) => {
        const stall = setTimeout(() => fail(new Error("the server stopped reading (write stalled 10 s)")), 10_000);
        const done = () => {
          clearTimeout(stall);
          ok();
        };
        if (sock.write(b)) done();
        else sock.once("drain", done);
      });
    const onConnect = async () => {
      const head =
        `POST ${path} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer ${token}\r\ncontent-type: application/json\r\n` +
        (chunked ? "transfer-encoding: chunked\r\n\r\n" : `content-length: ${size}\r\n\r\n`);
      try {
        await write(head);
        const piece = Buffer.alloc(1 << 20, 0x20);
        for (let sent = 0; sent < size; sent += piece.length) {
          if (sock.destroyed) throw new Error("socket closed while writing");
          const p = piece.subarray(0, Math.min(piece.length, size - sent));
          await write(chunked ? Buffer.concat([Buffer.from(`${p.length.toString(16)}\r\n`), p, Buffer.from("\r\n")]) : p);
        }
        if (chunked) await write("0\r\n\r\n");
      } catch (err) {
        out.writeError ??= (err as Error).message;
        sock.destroy();
        return resolve(out);
      }
      let text = "";
      sock.removeAllListeners("error");
      sock.on("error", (e) => (out.readError = e.message));
      sock.on("data", (b: Buffer) => {
        text += b.toString("latin1");
        if (out.status === null) {
          const first = /^HTTP\/1\.1 (\d{3})[^\r]*\r\n([\s\S]*?)\r\n\r\n/.exec(text);
          const len = Number(/content-length: (\d+)/i.exec(first?.[2] ?? "")?.[1] ?? -1);
          if (!first || len < 0 || text.length < first[0].length + len) return;
          out.status = Number(first[1]);
          out.body = text.slice(first[0].length, first[0].length + len);
          text = text.slice(first[0].length + len);
          if (/connection: close/i.test(first[2]!)) return;
          sock.write("GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n");
        }
        if (/^HTTP\/1\.1 200 /.test(text)) {
          out.reused = true;
          sock.destroy();
        }
      });
      sock.on("close", () => resolve(out));
      sock.resume();
      setTimeout(() => sock.destroy(), 10_000).unref();
    };
    // Every failure inside is caught and resolves the exchange, so nothing is left to reject.
    sock.on("connect", () => void onConnect());
  });
}

const MiB = 1 << 20;
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Json = Record<string, any>;
const routes = (): { name: string; path: string; size: number; shape: (b: Json) => void }[] => [
  { name: "POST /v1/tasks (trainer, 1 MiB)", path: "/v1/tasks", size: 16 * MiB, shape: (b) => expect(b.error).toMatchObject({ type: "payload_too_large" }) },
  { name: "POST /v1/sessions (trainer, 1 MiB)", path: "/v1/sessions", size: 16 * MiB, shape: (b) => expect(b.error).toMatchObject({ type: "payload_too_large" }) },
  {
    name: "chat completions (OpenAI, 64 MiB)",
    path: `/s/${sid}/v1/chat/completions`,
    size: 66 * MiB,
    shape: (b) => expect(b.error).toMatchObject({ type: "invalid_request_error", code: "request_too_large" }),
  },
  { name: "responses (OpenAI, 64 MiB)", path: `/s/${sid}/v1/responses`, size: 66 * MiB, shape: (b) => expect(b.error).toMatchObject({ code: "request_too_large" }) },
  { name: "messages (Anthropic, 64 MiB)", path: `/s/${sid}/v1/messages`, size: 66 * MiB, shape: (b) => expect(b).toMatchObject({ type: "error", error: { type: "request_too_large" } }) },
  {
    name: "generateContent (Gemini, 64 MiB)",
    path: `/s/${sid}/v1beta/models/m:generateContent`,
    size: 66 * MiB,
    shape: (b) => expect(b.error).toMatchObject({ code: 413, status: expect.any(String) }),
  },
];

describe("a body over the limit, on a real socket", () => {
  for (const chunked of [false, true]) {
    it(`${chunked ? "chunked" : "with content-length"}: every protocol's client reads a 413 in its own shape after sending everything, and the connection stays usable`, async () => {
      for (const r of routes()) {
        const x = await writeAllThenRead(r.path, r.size, chunked);
        expect(x.writeError, r.name).toBeNull();
        expect(x.status, r.name).toBe(413);
        const body = JSON.parse(x.body);
        r.shape(body);
        expect(JSON.stringify(body), r.name).toMatch(/size limit/);
        expect(x.readError, r.name).toBeNull();
        expect(x.reused, `${r.name}: the next request on the connection`).toBe(true);
      }
    }, 120_000);
  }

  it("a body just under the limit is read whole (a 400 about its content, not a 413)", async () => {
    const x = await writeAllThenRead("/v1/tasks", MiB - 64, false);
    expect(x.status).toBe(400);
    expect(JSON.parse(x.body).error.type).toBe("invalid_request");
  });
});
