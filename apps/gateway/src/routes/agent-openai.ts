import { randomUUID } from "node:crypto";
import { fromOpenAIChat, openAIError, toOpenAIChatChunk, toOpenAIChatResponse } from "@rollgate/transforms";
import type { FastifyPluginAsync, FastifyReply } from "fastify";
import { ZodError } from "zod";
import type { GatewayContext } from "../context.js";
import {
  AGENT_BODY_LIMIT,
  authorizeSession,
  clientAbortSignal,
  failureOf,
  isAuthFailure,
  startSse,
  type AuthFailure,
} from "./agent-common.js";

function openAIErrorType(status: number): string {
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 404) return "not_found_error";
  if (status >= 500) return "api_error";
  return "invalid_request_error";
}

/** Any failure in OpenAI's error shape, which the OpenAI SDKs surface as APIError. */
function sendOpenAIError(reply: FastifyReply, err: unknown) {
  if (err instanceof ZodError) {
    const issue = err.issues[0];
    const param = issue ? issue.path.map(String).join(".") : null;
    const message = err.issues.map((i) => `${i.path.map(String).join(".") || "body"}: ${i.message}`).join("; ");
    return reply.code(400).send(openAIError(message, "invalid_request_error", "invalid_value", param));
  }
  const f = failureOf(err);
  return reply.code(f.status).send(openAIError(f.message, openAIErrorType(f.status), f.kind));
}

function sendAuthFailure(reply: FastifyReply, f: AuthFailure) {
  const code = f.kind === "invalid_token" ? "invalid_api_key" : f.kind;
  return reply.code(f.status).send(openAIError(f.message, openAIErrorType(f.status), code));
}

/** The OpenAI Chat Completions routes of one session: `/s/:sid/v1/…`. */
export function openAIAgentRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (app) => {
    app.setErrorHandler((err, _req, reply) => sendOpenAIError(reply, err));

    app.get<{ Params: { sid: string } }>("/s/:sid/v1/models", async (req, reply) => {
      const auth = await authorizeSession(ctx, req, req.params.sid);
      if (isAuthFailure(auth)) return sendAuthFailure(reply, auth);
      const id = auth.session.model ?? auth.session.assignment?.served_model ?? "unknown";
      return { object: "list", data: [{ id, object: "model", created: 0, owned_by: "rollgate" }] };
    });

    app.post<{ Params: { sid: string } }>("/s/:sid/v1/chat/completions", { bodyLimit: AGENT_BODY_LIMIT }, async (req, reply) => {
      const auth = await authorizeSession(ctx, req, req.params.sid);
      if (isAuthFailure(auth)) return sendAuthFailure(reply, auth);
      const call = fromOpenAIChat(req.body);
      const prepared = await ctx.caller.prepare(auth.session, "openai_chat", call.canonical, clientAbortSignal(reply));
      const out = {
        id: `chatcmpl-${randomUUID().replaceAll("-", "")}`,
        created: Math.floor(Date.now() / 1000),
        model: call.clientModel || prepared.engineCall.model,
        clientLogprobs: call.canonical.client_logprobs,
        includeUsage: call.includeUsage,
      };
      if (!call.canonical.stream) return toOpenAIChatResponse(await ctx.caller.complete(prepared), out);

      // Open the engine stream before answering, so an engine that refuses the call still gets
      // a proper HTTP error; from the first event on, the answer is SSE.
      const events = ctx.caller.stream(prepared);
      const first = await events.next();
      const write = startSse(reply);
      const send = (data: unknown) => write(`data: ${JSON.stringify(data)}\n\n`);
      try {
        for (let next = first; !next.done; next = await events.next()) {
          const c = toOpenAIChatChunk(next.value, out);
          if (c) send(c);
        }
      } catch (err) {
        req.log.warn({ err }, "stream failed");
        const f = failureOf(err);
        send(openAIError(f.message, openAIErrorType(f.status), f.kind));
      }
      reply.raw.end("data: [DONE]\n\n");
    });
  };
}
