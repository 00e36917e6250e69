import type { FastifyReply, FastifyRequest } from "fastify";
import { z } from "zod";
import { sglangError, sglangOpenAIError, vllmError } from "../errors.js";
import type { Generation } from "../engine.js";
import type { SimKind, SimState } from "../state.js";

/** Raw JSON bodies, kept so tool schemas can be re-read with Python number semantics. */
const rawBodies = new WeakMap<FastifyRequest, string>();

export function setRawBody(req: FastifyRequest, raw: string): void {
  rawBodies.set(req, raw);
}

export function getRawBody(req: FastifyRequest): string | undefined {
  return rawBodies.get(req);
}

/** vLLM's envelope (`{error:{message,type,param,code}}`). */
export function sendError(reply: FastifyReply, status: number, message: string, param: string | null = null): FastifyReply {
  return reply.code(status).send(vllmError(message, status, param));
}

/** Which error envelope a route answers with. */
export type Envelope = "vllm" | "sglang-openai" | "sglang";

export function envelopeFor(kind: SimKind, openai: boolean): Envelope {
  return kind === "vllm" ? "vllm" : openai ? "sglang-openai" : "sglang";
}

export function errorBody(env: Envelope, status: number, message: string): unknown {
  if (env === "vllm") return vllmError(message, status);
  if (env === "sglang-openai") return sglangOpenAIError(message, status);
  return sglangError(message);
}

export function sendEnvError(reply: FastifyReply, env: Envelope, status: number, message: string): FastifyReply {
  return reply.code(status).send(errorBody(env, status, message));
}

/** One line per issue, like pydantic's validation error listing. */
export function formatZodError(err: z.ZodError): string {
  const lines = err.issues.map((i) => `${i.path.length ? i.path.join(".") : "body"}: ${i.message}`);
  return `${err.issues.length} validation error${err.issues.length === 1 ? "" : "s"}:\n  ${lines.join("\n  ")}`;
}

/** Aborts generation when the client goes away before the answer is complete. */
export function disconnectSignal(reply: FastifyReply): AbortController {
  const ac = new AbortController();
  reply.raw.on("close", () => {
    if (!reply.raw.writableFinished) ac.abort();
  });
  return ac;
}

/**
 * The disconnect fault: drop the connection mid-response. What was already written still reaches the
 * client (as from a server that died), then the socket closes without the end of the chunked body.
 */
export function cutConnection(reply: FastifyReply): void {
  const sock = reply.raw.socket;
  if (sock) sock.destroySoon();
  else reply.raw.destroy();
}

/** Python's `len()` of a string (code points), for offsets vLLM computes in Python. */
export function pyLen(s: string): number {
  let n = 0;
  for (const _ of s) n++;
  return n;
}

/** Runs every generation to its end (their tokens are collected on each). */
export async function runToEnd(sim: SimState, gens: readonly Generation[]): Promise<void> {
  await Promise.all(
    gens.map(async (g) => {
      for await (const _ of sim.engine.run(g)) {
        // collected on g
      }
    }),
  );
}

/**
 * The answer when a generation did not finish for the answer to be sent: the client left (499) or
 * a disconnect fault cuts the connection. Null when every one ran to an answer.
 */
export function endedEarly(gens: readonly Generation[], reply: FastifyReply): FastifyReply | null {
  if (gens.some((g) => g.outcome === "client")) return reply.code(499).send();
  if (gens.some((g) => g.outcome === "disconnect")) {
    cutConnection(reply);
    return reply;
  }
  return null;
}

/**
 * The request fields vLLM's chat and completions routes both take (its ChatCompletionRequest and
 * CompletionRequest repeat them), with SGLang's routing extras.
 */
export const OPENAI_REQUEST_FIELDS = {
  model: z.string().nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().nullish(), continuous_usage_stats: z.boolean().nullish() }).nullish(),
  max_tokens: z.number().int().nullish(),
  stop: z.union([z.string(), z.array(z.string())]).nullish(),
  stop_token_ids: z.array(z.number().int()).nullish(),
  include_stop_str_in_output: z.boolean().nullish(),
  skip_special_tokens: z.boolean().nullish(),
  prompt_logprobs: z.number().int().nullish(),
  return_token_ids: z.boolean().nullish(),
  return_tokens_as_token_ids: z.boolean().nullish(),
  n: z.number().int().nullish(),
  cache_salt: z.string().nullish(),
  request_id: z.string().nullish(),
  // SGLang extras.
  rid: z.string().nullish(),
  routed_dp_rank: z.number().int().nullish(),
  data_parallel_rank: z.number().int().nullish(),
};
