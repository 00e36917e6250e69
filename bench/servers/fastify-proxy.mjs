// The floor for a Node proxy: a bare @fastify/http-proxy pass-through to $UPSTREAM, nothing else.
import proxy from "@fastify/http-proxy";
import Fastify from "fastify";

const upstream = process.env.UPSTREAM;
if (!upstream) throw new Error("UPSTREAM is required");
const app = Fastify({ logger: false, bodyLimit: 64 * 1024 * 1024 });
await app.register(proxy, { upstream, undici: { connections: 256, pipelining: 1, keepAliveTimeout: 60_000 } });
const close = () => app.close().then(() => process.exit(0));
const stop = () =>
  void close().catch((err) => {
    console.error(err);
    process.exit(1);
  });
process.once("SIGTERM", stop);
process.once("SIGINT", stop);
await app.listen({ port: 0, host: "127.0.0.1" });
console.log(`proxy ready: http://127.0.0.1:${/** @type {import("node:net").AddressInfo} */ (app.server.address()).port}`);
