import net from "node:net";
import { connectPair } from "./socket-pair.js";
import type { AddressInfo } from "node:net";

/**
 * A TCP proxy in front of a gateway that can be taken down and brought back: down, it resets
 * every open connection and every new one (a gateway restart or deploy, as a client sees it).
 */
export interface OutageProxy {
  url: string;
  down: () => void;
  up: () => void;
  /** How many requests whose line starts with `request` (e.g. "GET /v1/tasks/t-1/events") have come through. */
  seen: (request: string) => number;
  close: () => Promise<void>;
}

export interface OutageProxyOptions {
  /** Go down on its own when a request line starting with `request` (e.g. "POST /v1/tasks/batch") comes for the (`after` + 1)th time: that request never reaches the gateway. */
  downAfter?: { request: string; after: number };
}

export async function startOutageProxy(target: string, opts: OutageProxyOptions = {}): Promise<OutageProxy> {
  const { hostname, port } = new URL(target);
  const open = new Set<net.Socket>();
  let isDown = false;
  let seen = 0;
  /** What clients sent through, to count requests by their line. */
  let sent = "";
  const server = net.createServer((client) => {
    if (isDown) return void client.resetAndDestroy();
    const upstream = connectPair(client, hostname, Number(port), open);
    client.on("data", (chunk: Buffer) => {
      sent += chunk.toString("latin1");
      const watched = opts.downAfter;
      if (watched) seen += chunk.toString("latin1").split(`${watched.request} `).length - 1;
      if (watched && seen > watched.after) {
        down();
        return;
      }
      upstream.write(chunk);
    });
    upstream.pipe(client);
  });
  function down() {
    isDown = true;
    for (const s of open) s.resetAndDestroy();
  }
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    down,
    up: () => {
      isDown = false;
    },
    seen: (request) => sent.split(`${request}`).length - 1,
    close: () =>
      new Promise((resolve) => {
        for (const s of open) s.destroy();
        server.close(() => resolve());
      }),
  };
}
