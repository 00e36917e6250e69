import { randomUUID } from "node:crypto";
import { OpenAIChatRequest, fromValidOpenAIChat, openAIError, toOpenAIChatChunk, toOpenAIChatResponse } from "@rollgate/transforms";
import type { FastifyPluginAsync, FastifyRequest } from "fastify";
import type { ZodTypeProvider } from "fastify-type-provider-zod";
import type { GatewayContext } from "../context.js";
import { openAIErrorType, sendOpenAIAuthFailure, sendOpenAIError } from "./openai-errors.js";
import {
  AGENT_BODY_LIMIT,
  authorizeSession,
  clientAbortSignal,
  echoesAssistantTurn,
  agentFailure,
  agentSchema,
  isAuthFailure,
  readSessionEarly,
  rejectInvalid,
  startSse,
} from "./agent-common.js";

/** The OpenAI Chat Completions routes of one session: `/s/:sid/v1/…`. */
export function openAIAgentRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (plain) => {
    const app = plain.withTypeProvider<ZodTypeProvider>();
    // Every failure answered here is checked for a lost call first (agentFailure).
    app.setErrorHandler(async (err, req, reply) => {
      await agentFailure(ctx, req, reply, err);
      return sendOpenAIError(reply, err);
    });

    const modelsSchema = agentSchema("The served model (OpenAI shape)", "The session's model, as OpenAI's model list.");
    app.get("/s/:sid/v1/models", { schema: modelsSchema }, async (req, reply) => {
      const auth = await authorizeSession(ctx, req, req.params.sid);
      if (isAuthFailure(auth)) return sendOpenAIAuthFailure(reply, auth);
      const id = auth.session.model ?? auth.session.assignment?.served_model ?? "unknown";
      return { object: "list", data: [{ id, object: "model", created: 0, owned_by: "rollgate" }] };
    });

    const chatSchema = agentSchema("OpenAI Chat Completions", "OpenAI Chat Completions, streamed (`stream: true`, Server-Sent Events) or not.", OpenAIChatRequest);
    // The session read leaves before the body's schema check (readSessionEarly), with the options the handler gives.
    const chatRead = (req: FastifyRequest) => ({ takeSeq: true, history: echoesAssistantTurn(req.body) });
    const preValidation = readSessionEarly(ctx, chatRead);
    app.post("/s/:sid/v1/chat/completions", { bodyLimit: AGENT_BODY_LIMIT, attachValidation: true, schema: chatSchema, preValidation }, async (req, reply) => {
      const auth = await authorizeSession(ctx, req, req.params.sid, undefined, chatRead(req));
      if (isAuthFailure(auth)) return sendOpenAIAuthFailure(reply, auth);
      rejectInvalid(req);
      // The body passed its schema on the way in (rejectInvalid): not parsed a second time.
      const call = fromValidOpenAIChat(req.body);
      const prepared = await ctx.caller.prepare(auth, "openai_chat", call.canonical, clientAbortSignal(reply));
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
        const f = await agentFailure(ctx, req, reply, err);
        send(openAIError(f.message, openAIErrorType(f.status), f.kind));
      }
      reply.raw.end("data: [DONE]\n\n");
    });
  };
}
