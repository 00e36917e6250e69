#!/usr/bin/env node
import { parseArgs } from "node:util";
import closeWithGrace from "close-with-grace";
import { buildGateway } from "./app.js";
import { loadGatewayEnv } from "./env.js";

const HELP = `rollgate-gateway: the rollgate HTTP gateway (task, session and agent-facing LLM routes)

Usage: rollgate-gateway [--port N] [--host H]

Options:
  --port N    listen port (env PORT, default 8080; 0 picks a free one)
  --host H    listen address (env HOST, default 127.0.0.1; 0.0.0.0 in containers)
  -h, --help  this text

Environment:
  REDIS_URL                 redis://host:port[/db] (default redis://127.0.0.1:6379)
  ROLLGATE_ENGINES          required: JSON list of {kind: "vllm"|"sglang", url, dp_size, model?, profile?, vocab_size?}
                            (profile: a model family preset such as "qwen3", "llama3", "gpt-oss", or an inline object)
  ROLLGATE_PUBLIC_URL       how sandboxes reach this gateway (default: the listen address)
  ROLLGATE_API_KEY          when set, trainer and admin routes require "Authorization: Bearer <key>"
  ROLLGATE_KEY_PREFIX       prefix of every Redis key and queue (default rg)
  ROLLGATE_ENGINE_TIMEOUT_S upstream timeout per engine call (default 600)
  ROLLGATE_ENGINE_CONNECTIONS connections per engine URL at most; more calls in flight wait (default 4096)
  ROLLGATE_ROUTING          least_loaded (default) | affinity | round_robin: how sessions pick a rank
  ROLLGATE_AFFINITY_MAX_SKEW  affinity: sessions over the least-loaded rank before a group moves on (16)
  ROLLGATE_CONTINUATION     auto (default) | token_in | render: when a call continues a recorded one token-in
  ROLLGATE_SESSION_RATE     agent calls per second per session, all replicas together (default 0 = no limit); over it: 429 + retry-after
  ROLLGATE_SESSION_BURST    calls a session may make at once after being idle (default 2 x the rate, at least 1)
  ROLLGATE_ROLLOUT_ATTEMPTS the infrastructure retry budget: attempts per rollout (default 3); a rollout that lost an LLM call is retried within it
  ROLLGATE_ROLLOUT_BACKOFF_MS delay before a rollout's second attempt, doubled after (default 2000)
  ROLLGATE_RESULT_TTL_S     how long results are kept (default 7 days); set it as the workers' is
  LOG_LEVEL                 fatal|error|warn|info|debug|trace|silent (default info)

Prints "gateway ready: <url>" once listening.`;

const { values } = parseArgs({
  options: { port: { type: "string" }, host: { type: "string" }, help: { type: "boolean", short: "h" } },
});
if (values.help) {
  console.log(HELP);
  process.exit(0);
}

let env;
try {
  env = loadGatewayEnv({ ...process.env, ...(values.port ? { PORT: values.port } : {}), ...(values.host ? { HOST: values.host } : {}) });
} catch (err) {
  console.error(`rollgate-gateway: ${(err as Error).message}`);
  process.exit(2);
}
const app = await buildGateway({ env });
closeWithGrace({ delay: 10_000 }, async ({ err }) => {
  if (err) app.log.error({ err }, "shutting down after an error");
  await app.close();
});
// Thousands of agents (re)connect at once after a pause or at a batch's start: Node's default
// accept queue (511) overflows, and a dropped SYN costs its agent a 1 s retransmit. The kernel caps
// it at net.core.somaxconn.
await app.listen({ port: env.PORT, host: env.HOST, backlog: 8192 });
const addr = app.server.address();
const port = addr && typeof addr === "object" ? addr.port : env.PORT;
console.log(`gateway ready: http://${env.HOST}:${port}`);
