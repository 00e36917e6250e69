import { randomUUID } from "node:crypto";
import type { Session } from "@rollgate/protocol";
import { tokenMatches } from "@rollgate/store";
import { fromOpenAIChat, openAIError, toOpenAIChatChunk, toOpenAIChatResponse } from "@rollgate/transforms";
import type { FastifyError, FastifyPluginAsync, FastifyReply, FastifyRequest } from "fastify";
import { ZodError } from "zod";
import { sessionToken } from "../auth.js";
import type { GatewayContext } from "../context.js";
import { EngineError } from "../engines/errors.js";
import { fastifyErrorStatus } from "../errors.js";
import { CallRejected } from "../llm/chat-call.js";

/** Agents send long histories: allow far more than Fastify's 1 MiB default. */
const AGENT_BODY_LIMIT = 64 * 1024 * 1024;

function openAIErrorType(status: number): string {
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 404) return "not_found_error";
  if (status >= 500) return "api_error";
  return "invalid_request_error";
}

/** Maps anything a call can throw to OpenAI's error shape, which the OpenAI SDKs surface as APIError. */
function sendOpenAIError(reply: FastifyReply, err: unknown) {
  if (err instanceof ZodError) {
    const issue = err.issues[0];
    const param = issue ? issue.path.map(String).join(".") : null;
    const message = err.issues.map((i) => `${i.path.map(String).join(".") || "body"}: ${i.message}`).join("; ");
    return reply.code(400).send(openAIError(message, "invalid_request_error", "invalid_value", param));
  }
  if (err instanceof CallRejected) return reply.code(err.status).send(openAIError(err.message, openAIErrorType(err.status), err.code));
  if (err instanceof EngineError) return reply.code(err.status).send(openAIError(err.message, openAIErrorType(err.status), `engine_${err.kind}`));
  const { status, message } = fastifyErrorStatus(err as FastifyError);
  return reply.code(status).send(openAIError(message, openAIErrorType(status), (err as FastifyError).code ?? null));
}

/** Authenticates the session token and returns the open session, or answers 401/403 itself. */
async function authorize(ctx: GatewayContext, req: FastifyRequest, reply: FastifyReply, sid: string): Promise<Session | null> {
  const token = sessionToken(req);
  const found = token ? await ctx.sessions.getForCall(sid) : null;
  if (!token || !found || !tokenMatches(token, found.tokenHash)) {
    // One answer for unknown session and wrong token: a sandbox learns nothing about other sessions.
    reply.code(401).send(openAIError("invalid session token", "authentication_error", "invalid_api_key"));
    return null;
  }
  if (found.session.state !== "open") {
    reply.code(403).send(openAIError(`session ${sid} is closed`, "permission_error", "session_closed"));
    return null;
  }
  return found.session;
}

/** The OpenAI-compatible agent routes of one session: `/s/:sid/v1/…`. */
export function openAIAgentRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (app) => {
    app.setErrorHandler((err, _req, reply) => sendOpenAIError(reply, err));

    app.get<{ Params: { sid: string } }>("/s/:sid/v1/models", async (req, reply) => {
      const session = await authorize(ctx, req, reply, req.params.sid);
      if (!session) return reply;
      const id = session.model ?? session.assignment?.served_model ?? "unknown";
      return { object: "list", data: [{ id, object: "model", created: 0, owned_by: "rollgate" }] };
    });

    app.post<{ Params: { sid: string } }>(
      "/s/:sid/v1/chat/completions",
      { bodyLimit: AGENT_BODY_LIMIT },
      async (req, reply) => {
        const session = await authorize(ctx, req, reply, req.params.sid);
        if (!session) return reply;
        let call;
        try {
          call = fromOpenAIChat(req.body);
        } catch (err) {
          return sendOpenAIError(reply, err);
        }
        const abort = new AbortController();
        reply.raw.on("close", () => {
          if (!reply.raw.writableFinished) abort.abort();
        });
        const prepared = await ctx.caller.prepare(session, "openai_chat", call.canonical, abort.signal);
        const out = {
          id: `chatcmpl-${randomUUID().replaceAll("-", "")}`,
          created: Math.floor(Date.now() / 1000),
          model: call.clientModel || prepared.engineCall.model,
          clientLogprobs: call.canonical.client_logprobs,
          includeUsage: call.includeUsage,
        };
        if (!call.canonical.stream) {
          const result = await ctx.caller.complete(prepared);
          return toOpenAIChatResponse(result, out);
        }
        // Streaming: open the engine stream first so an engine that refuses the call still gets a
        // proper HTTP error; once the first event arrives, switch to SSE.
        const events = ctx.caller.stream(prepared);
        const first = await events.next();
        reply.hijack();
        const raw = reply.raw;
        raw.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
        const send = (data: unknown) => raw.write(`data: ${JSON.stringify(data)}\n\n`);
        try {
          if (!first.done) {
            const c = toOpenAIChatChunk(first.value, out);
            if (c) send(c);
          }
          for (let next = await events.next(); !next.done; next = await events.next()) {
            const c = toOpenAIChatChunk(next.value, out);
            if (c) send(c);
          }
        } catch (err) {
          req.log.warn({ err }, "stream failed");
          const status = err instanceof EngineError ? err.status : 500;
          send(openAIError((err as Error).message, openAIErrorType(status), err instanceof EngineError ? `engine_${err.kind}` : null));
        }
        raw.end("data: [DONE]\n\n");
      },
    );
  };
}
