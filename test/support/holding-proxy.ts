import net from "node:net";
import { connectPair } from "./socket-pair.js";
import type { AddressInfo } from "node:net";

/**
 * A TCP proxy in front of a gateway that lets one kind of request through but holds it at a
 * chosen point, so a test can kill the client there: with `at: "answer"` the request reaches the
 * gateway (which acts on it) and its answer is kept from the client; with `at: "request"` the
 * request never reaches the gateway. Everything else passes untouched. Matched against the
 * request's first line (`match`, e.g. /^POST \/v1\/sessions /), or with `anywhere` against all of
 * a chunk the client sent (in front of Redis: a command by its arguments). A request matching `reset` never
 * reaches the gateway either: its connection is reset (the gateway failed, as the client sees it).
 */
export interface HoldingProxy {
  url: string;
  /** Each held request's first line and, for `at: "answer"`, the answer bytes held so far. */
  held: { request: string; answer: string }[];
  /**
   * Lets every request held `at: "request"` go on to the gateway, late (its bytes held so far,
   * then the rest); its answer still goes to the client and is also kept in `answer`.
   */
  release: () => void;
  close: () => Promise<void>;
}

export async function startHoldingProxy(target: string, opts: { match: RegExp; at: "request" | "answer"; reset?: RegExp; anywhere?: boolean }): Promise<HoldingProxy> {
  const { hostname, port } = new URL(target);
  const open = new Set<net.Socket>();
  const held: HoldingProxy["held"] = [];
  const releasers: (() => void)[] = [];
  const server = net.createServer((client) => {
    const upstream = connectPair(client, hostname, Number(port), open);
    // Once a connection holds, nothing more passes on it in the held direction.
    let holding: { request: string; answer: string } | null = null;
    let released = false;
    const kept: Buffer[] = [];
    releasers.push(() => {
      if (!holding || opts.at !== "request" || released) return;
      released = true;
      for (const c of kept.splice(0)) upstream.write(c);
    });
    client.on("data", (chunk: Buffer) => {
      const text = chunk.toString("latin1");
      const line = text.split("\r\n", 1)[0] ?? "";
      if (!holding && opts.reset?.test(line)) return void client.resetAndDestroy();
      if (!holding && opts.match.test(opts.anywhere ? text : line)) {
        holding = { request: opts.anywhere ? text : line, answer: "" };
        held.push(holding);
      }
      if (holding && opts.at === "request" && !released) return void kept.push(chunk);
      upstream.write(chunk);
    });
    upstream.on("data", (chunk: Buffer) => {
      if (holding && opts.at === "answer") holding.answer += chunk.toString("latin1");
      else {
        if (holding && released) holding.answer += chunk.toString("latin1");
        client.write(chunk);
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    held,
    release: () => releasers.forEach((r) => r()),
    close: () =>
      new Promise((resolve) => {
        for (const s of open) s.destroy();
        server.close(() => resolve());
      }),
  };
}
