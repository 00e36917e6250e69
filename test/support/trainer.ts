import http from "node:http";
import type { AddressInfo } from "node:net";

export interface ReceivedCallback {
  headers: http.IncomingHttpHeaders;
  rawBody: string;
}

/** A tiny trainer: an HTTP server that records every callback it receives (and answers 200, or 503 to the first `failFirst`). */
export async function startTrainer(opts: { failFirst?: number } = {}): Promise<{
  url: string;
  received: ReceivedCallback[];
  waitFor: (n: number, timeoutMs?: number) => Promise<ReceivedCallback[]>;
  close: () => Promise<void>;
}> {
  const received: ReceivedCallback[] = [];
  const waiters: (() => void)[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      received.push({ headers: req.headers, rawBody: Buffer.concat(chunks).toString("utf8") });
      // A trainer that is briefly down answers 503 to its first deliveries.
      res.writeHead(received.length <= (opts.failFirst ?? 0) ? 503 : 200).end("ok");
      waiters.splice(0).forEach((w) => w());
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as AddressInfo;
  const waitFor = async (n: number, timeoutMs = 60_000) => {
    const deadline = Date.now() + timeoutMs;
    while (received.length < n) {
      if (Date.now() > deadline) throw new Error(`expected ${n} callbacks, got ${received.length}`);
      await new Promise<void>((r) => {
        waiters.push(r);
        setTimeout(r, 200);
      });
    }
    return received;
  };
  return {
    url: `http://127.0.0.1:${port}/rollouts`,
    received,
    waitFor,
    close: () => new Promise((r) => server.close(() => r())),
  };
}
