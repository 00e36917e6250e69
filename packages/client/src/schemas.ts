import { CompletionRecord, CreateSessionRequest, TaskAccepted, TaskRecord } from "@rollgate/protocol";
import { z } from "zod";

/** Answers of routes whose envelope has no schema of its own in protocol (they wrap protocol types). */
export const BatchAccepted = z.object({ tasks: z.array(TaskAccepted) });
export const TaskPageSchema = z.object({ tasks: z.array(TaskRecord), next_cursor: z.string().nullable() });
export const CancelAnswer = z.object({ id: z.string(), status: z.string() });
export const CompletionsAnswer = z.object({ session_id: z.string(), completions: z.array(CompletionRecord) });
export const CreateSessionRequestInput = CreateSessionRequest;
