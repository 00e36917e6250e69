import { randomUUID } from "node:crypto";
import {
  AnthropicRequest,
  AnthropicStreamEncoder,
  anthropicError,
  anthropicErrorType,
  fromValidAnthropic,
  toAnthropicResponse,
  type AnthropicCall,
} from "@rollgate/transforms";
import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from "fastify";
import type { ZodTypeProvider } from "fastify-type-provider-zod";
import { ZodError, type core } from "zod";
import type { GatewayContext } from "../context.js";
import { SidParams } from "./schemas.js";
import {
  AGENT_BODY_LIMIT,
  authorizeSession,
  clientAbortSignal,
  echoesAssistantTurn,
  agentFailure,
  agentSchema,
  failureOf,
  isAuthFailure,
  readSessionEarly,
  rejectInvalid,
  startSse,
  type AuthorizedSession,
} from "./agent-common.js";

type ZodIssue = core.$ZodIssue;

/**
 * One line per bad field. A union (string or blocks, one of several block types) reports only
 * "Invalid input" at its own path: descend into the branch that got further, so the message names
 * the block field that is wrong.
 */
function issueLines(issues: readonly ZodIssue[], prefix: PropertyKey[] = []): string[] {
  return issues.flatMap((i) => {
    const path = [...prefix, ...i.path];
    if (i.code === "invalid_union") {
      const deeper = i.errors.find((branch) => branch.some((b) => b.path.length > 0 || b.code !== "invalid_type"));
      if (deeper) return issueLines(deeper, path);
    }
    return [`${path.map(String).join(".") || "body"}: ${i.message}`];
  });
}

/** Any failure in Anthropic's error shape, which `@anthropic-ai/sdk` surfaces as the APIError of its status. */
function sendAnthropicError(reply: FastifyReply, err: unknown) {
  if (err instanceof ZodError) {
    const message = issueLines(err.issues).join("; ");
    return reply.code(400).send(anthropicError("invalid_request_error", message));
  }
  const f = failureOf(err);
  return reply.code(f.status).send(anthropicError(anthropicErrorType(f.status), f.message));
}

type SidRequest = FastifyRequest & { params: { sid: string } };

/** The session read of a call (`takeSeq`: one that goes to the engine); the same in readSessionEarly and the handler. */
const messagesRead = (req: FastifyRequest, takeSeq: boolean) => ({ takeSeq, history: takeSeq && echoesAssistantTurn(req.body) });

/** Authenticates and parses; answers the failure itself and returns null when there is one. */
async function authorizeAndParse(
  ctx: GatewayContext,
  req: SidRequest,
  reply: FastifyReply,
  takeSeq = false,
): Promise<{ auth: AuthorizedSession; call: AnthropicCall } | null> {
  const auth = await authorizeSession(ctx, req, req.params.sid, undefined, messagesRead(req, takeSeq));
  if (isAuthFailure(auth)) {
    await reply.code(auth.status).send(anthropicError(anthropicErrorType(auth.status), auth.message));
    return null;
  }
  rejectInvalid(req);
  // Both routes here declare AnthropicRequest as their body: it passed that schema on the way in
  // (rejectInvalid), so it is not parsed a second time.
  const call = fromValidAnthropic(req.body as AnthropicRequest, { reasoningKey: auth.tokenHash });
  if (call.droppedThinking > 0) {
    req.log.debug({ sid: req.params.sid, dropped: call.droppedThinking }, "dropped thinking blocks this session did not issue");
  }
  return { auth, call };
}

/** The Anthropic Messages routes of one session: `/s/:sid/v1/messages` (+ `count_tokens`). */
export function anthropicAgentRoutes(ctx: GatewayContext): FastifyPluginAsync {
  return async (plain) => {
    const app = plain.withTypeProvider<ZodTypeProvider>();
    // Every failure answered here is checked for a lost call first (agentFailure).
    app.setErrorHandler(async (err, req, reply) => {
      await agentFailure(ctx, req, reply, err);
      return sendAnthropicError(reply, err);
    });

    // Claude Code (2.1.1xx) probes `HEAD <ANTHROPIC_BASE_URL>` without credentials before its first
    // call. Answer that the gateway is there: an empty 200 for any session id (no auth, so it says
    // nothing about which sessions exist), and nothing is recorded.
    const probeSchema = { tags: ["agent"], summary: "Anthropic base URL probe", description: "An empty 200 for any session id, without credentials (Claude Code probes its base URL).", params: SidParams };
    app.head("/s/:sid", { schema: probeSchema, config: { swagger: { exposeHeadRoute: true } } }, async (_req, reply) => reply.code(200).send());

    const countSchema = agentSchema("Anthropic count_tokens", "Prompt tokens of a Messages request on the session's engine; records nothing.", AnthropicRequest);
    app.post("/s/:sid/v1/messages/count_tokens", { bodyLimit: AGENT_BODY_LIMIT, attachValidation: true, schema: countSchema }, async (req, reply) => {
      const ok = await authorizeAndParse(ctx, req, reply);
      if (!ok) return reply;
      const inputTokens = await ctx.caller.countTokens(ok.auth.session, ok.call.canonical, clientAbortSignal(reply));
      return { input_tokens: inputTokens };
    });

    const messagesSchema = agentSchema("Anthropic Messages", "Anthropic Messages, streamed (Server-Sent Events) or not.", AnthropicRequest);
    // The session read leaves before the body's schema check (readSessionEarly).
    const preValidation = readSessionEarly(ctx, (req) => messagesRead(req, true));
    app.post("/s/:sid/v1/messages", { bodyLimit: AGENT_BODY_LIMIT, attachValidation: true, schema: messagesSchema, preValidation }, async (req, reply) => {
      const ok = await authorizeAndParse(ctx, req, reply, true);
      if (!ok) return reply;
      const { auth, call } = ok;
      const prepared = await ctx.caller.prepare(auth, "anthropic_messages", call.canonical, clientAbortSignal(reply));
      const out = {
        id: `msg_${randomUUID().replaceAll("-", "")}`,
        model: call.clientModel || prepared.engineCall.model,
        reasoningKey: auth.tokenHash,
      };
      if (!call.canonical.stream) return toAnthropicResponse(await ctx.caller.complete(prepared), out);

      // Open the engine stream before answering, so an engine that refuses the call still gets
      // a proper HTTP error; from the first event on, the answer is SSE.
      const events = ctx.caller.stream(prepared);
      const first = await events.next();
      const write = startSse(reply);
      const encoder = new AnthropicStreamEncoder(out);
      try {
        for (let next = first; !next.done; next = await events.next()) {
          const frames = encoder.push(next.value);
          if (frames) write(frames);
        }
        write(encoder.end());
      } catch (err) {
        req.log.warn({ err }, "stream failed");
        const f = await agentFailure(ctx, req, reply, err);
        write(encoder.error(f.status, f.message));
      }
      reply.raw.end();
    });
  };
}
