import { randomUUID } from "node:crypto";
import {
  OpenAIResponsesRequest,
  ResponsesStreamEncoder,
  fromResponses,
  responsesSseFrame,
  toResponsesResponse,
  type ResponsesContext,
} from "@rollgate/transforms";
import type { FastifyPluginAsync } from "fastify";
import type { ZodTypeProvider } from "fastify-type-provider-zod";
import type { GatewayContext } from "../context.js";
import { sendOpenAIAuthFailure, sendOpenAIError } from "./openai-errors.js";
import {
  AGENT_BODY_LIMIT,
  authorizeSession,
  clientAbortSignal,
  agentFailure,
  agentSchema,
  isAuthFailure,
  rejectInvalid,
  startSse,
} from "./agent-common.js";

/** The OpenAI Responses route of one session: `POST /s/:sid/v1/responses` (streaming and not). */
export function responsesAgentRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (plain) => {
    const app = plain.withTypeProvider<ZodTypeProvider>();
    // Every failure answered here is checked for a lost call first (agentFailure).
    app.setErrorHandler(async (err, req, reply) => {
      await agentFailure(ctx, req, reply, err);
      return sendOpenAIError(reply, err);
    });

    const schema = agentSchema("OpenAI Responses", "OpenAI Responses API, streamed (Server-Sent Events) or not; stateless (`store` is always false).", OpenAIResponsesRequest);
    app.post("/s/:sid/v1/responses", { bodyLimit: AGENT_BODY_LIMIT, attachValidation: true, schema }, async (req, reply) => {
      const auth = await authorizeSession(ctx, req, req.params.sid, undefined, { takeSeq: true });
      if (isAuthFailure(auth)) return sendOpenAIAuthFailure(reply, auth);
      rejectInvalid(req);
      // Reasoning we hand out is sealed with the session's token hash; only this session can replay it.
      const call = fromResponses(req.body, { reasoningKey: auth.tokenHash });
      const prepared = await ctx.caller.prepare(auth, "openai_responses", call.canonical, clientAbortSignal(reply));
      const out: ResponsesContext = {
        id: `resp_${randomUUID().replaceAll("-", "")}`,
        createdAt: Math.floor(Date.now() / 1000),
        model: call.clientModel || prepared.engineCall.model,
        reasoningKey: auth.tokenHash,
        namespaced: call.namespaced,
        echo: call.echo,
        reasoningEnd: prepared.target.profile.reasoning_end,
        clientLogprobs: call.canonical.client_logprobs,
      };
      if (!call.canonical.stream) return toResponsesResponse(await ctx.caller.complete(prepared), out);

      // Open the engine stream before answering, so an engine that refuses the call still gets a
      // proper HTTP error; from the first event on, the answer is SSE.
      const events = ctx.caller.stream(prepared);
      const first = await events.next();
      const write = startSse(reply);
      const encoder = new ResponsesStreamEncoder(out);
      const send = (frames: ReturnType<ResponsesStreamEncoder["start"]>) => {
        for (const e of frames) write(responsesSseFrame(e));
      };
      send(encoder.start());
      try {
        for (let next = first; !next.done; next = await events.next()) send(encoder.push(next.value));
        send(encoder.end());
      } catch (err) {
        req.log.warn({ err }, "stream failed");
        const f = await agentFailure(ctx, req, reply, err);
        send(encoder.fail({ code: f.kind, message: f.message }));
      }
      reply.raw.end();
    });
  };
}
