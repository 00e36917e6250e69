/**
 * The writer of streamed answers (agent-common.ts corkedWriter), on a real socket: the first frame
 * of a tick (an agent's first token) is handed to the kernel when it is written, not when the tick
 * ends; the frames written after it in that tick leave together when it ends; the client gets
 * every frame, in order, after the headers.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";
import type { FastifyReply } from "fastify";
import { afterEach, describe, expect, it } from "vitest";
import { corkedWriter } from "./agent-common.js";

let server: http.Server | null = null;
afterEach(async () => {
  await new Promise((resolve) => server?.close(resolve) ?? resolve(undefined));
  server = null;
});

/** Serves one streamed answer written by `answer`; resolves with what the client received. */
async function exchange(answer: (res: http.ServerResponse) => Promise<void>): Promise<{ status: number; contentType: string; body: string }> {
  server = http.createServer((_req, res) => {
    void answer(res);
  });
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return new Promise((resolve, reject) => {
    http
      .get({ host: "127.0.0.1", port, path: "/" }, (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (c: string) => (body += c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, contentType: String(res.headers["content-type"]), body }));
      })
      .on("error", reject);
  });
}

const tick = () => new Promise<void>((resolve) => setImmediate(resolve));

describe("streamed answer writer", () => {
  it("hands a tick's first frame to the kernel at once and the rest of the tick's frames together at its end", async () => {
    /** Bytes still held in the process right after each write, and once the tick has ended. */
    const held: Record<string, number> = {};
    const got = await exchange(async (res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      const write = corkedWriter(res as unknown as FastifyReply["raw"]);
      write("data: 1\n\n");
      held.first = res.socket!.writableLength;
      write("data: 2\n\n");
      write("data: 3\n\n");
      held.rest = res.socket!.writableLength;
      await tick();
      held.afterTick = res.socket!.writableLength;
      // A later tick: its first frame leaves at once again.
      write("data: 4\n\n");
      held.nextFirst = res.socket!.writableLength;
      write("data: 5\n\n");
      res.end("data: [DONE]\n\n");
    });
    expect(held.first).toBe(0);
    expect(held.rest).toBeGreaterThan(0);
    expect(held.afterTick).toBe(0);
    expect(held.nextFirst).toBe(0);
    expect(got.status).toBe(200);
    expect(got.contentType).toBe("text/event-stream");
    expect(got.body).toBe("data: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\ndata: 5\n\ndata: [DONE]\n\n");
  });
});
