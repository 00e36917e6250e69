import type { CompletionRecord, Session } from "@rollgate/protocol";
import type { BuildOptions } from "@rollgate/trajectory";
import type { EngineRegistry } from "./engines/registry.js";

/**
 * How a session's trajectory is built, from the model profiles of the engines its records came
 * from: the vocabulary bound (the largest of them; none when any engine has none or is no longer
 * configured) and what is known of the chat template, for the wording of breaks.
 */
export function trajectoryOptions(
  registry: EngineRegistry,
  session: Pick<Session, "assignment"> & Partial<Pick<Session, "replay">>,
  records: readonly Pick<CompletionRecord, "engine">[],
): BuildOptions {
  const engines = new Set(records.map((r) => registry.indexOf(r.engine)));
  if (session.assignment) engines.add(session.assignment.engine);
  let vocabSize: number | null = 0;
  for (const i of engines) {
    const size = registry.profiles[i]?.vocab_size ?? null;
    vocabSize = size === null || vocabSize === null ? null : Math.max(vocabSize, size);
  }
  const profile = registry.profiles[session.assignment?.engine ?? [...engines][0] ?? -1];
  return {
    vocabSize: engines.size === 0 ? null : vocabSize,
    ...(session.replay?.train ? { trainReplayed: true } : {}),
    ...(profile
      ? {
          template: {
            profile: profile.name,
            toolResultWrappers: profile.tool_result_wrappers,
            reasoningDropped: profile.notes.reasoning_dropped,
            generationPromptDropped: profile.notes.generation_prompt_dropped,
            rerendered: profile.notes.rerendered,
          },
        }
      : {}),
  };
}
