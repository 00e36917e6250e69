import { InlineProfile, ModelProfile, ProfileSpec } from "./profile.js";
import { PRESETS, PRESET_NAMES } from "./presets.js";

export type ResolvedProfile = { ok: true; profile: ModelProfile } | { ok: false; issues: string[] };

function unknownName(name: string): string {
  return `unknown profile "${name}" (presets: ${PRESET_NAMES.join(", ")})`;
}

/** An inline profile over its base: top-level fields replace, nested objects merge field by field. */
function overlay(base: ModelProfile, inline: InlineProfile): ModelProfile {
  const { extends: _base, thinking, engine_parsers, notes, ...flat } = inline;
  return {
    ...base,
    ...flat,
    name: inline.name ?? `${base.name}+inline`,
    thinking: { ...base.thinking, ...thinking },
    engine_parsers: {
      vllm: { ...base.engine_parsers.vllm, ...engine_parsers?.vllm },
      sglang: { ...base.engine_parsers.sglang, ...engine_parsers?.sglang },
    },
    notes: { ...base.notes, ...notes },
  };
}

/**
 * The profile an engine entry asks for: `spec` is `ROLLGATE_ENGINES[].profile` (a preset name, an
 * inline object, or absent for `default`), `vocabSize` its `vocab_size` override. Every problem is
 * listed, so a bad configuration is fixed in one go.
 */
export function resolveProfile(spec: unknown, vocabSize?: number): ResolvedProfile {
  const given = spec ?? "default";
  // Checked by kind, so an object's errors name its fields instead of "invalid union".
  const parsed = typeof given === "string" ? ProfileSpec.safeParse(given) : typeof given === "object" ? InlineProfile.safeParse(given) : null;
  if (!parsed) return { ok: false, issues: ["must be a profile name or an inline profile object"] };
  if (!parsed.success) {
    return { ok: false, issues: parsed.error.issues.map((i) => `${i.path.length ? `${i.path.join(".")}: ` : ""}${i.message}`) };
  }
  let profile: ModelProfile;
  if (typeof parsed.data === "string") {
    const preset = PRESETS[parsed.data];
    if (!preset) return { ok: false, issues: [unknownName(parsed.data)] };
    profile = preset;
  } else {
    const baseName = parsed.data.extends ?? "default";
    const base = PRESETS[baseName];
    if (!base) return { ok: false, issues: [`extends: ${unknownName(baseName)}`] };
    profile = overlay(base, parsed.data);
  }
  if (vocabSize !== undefined) profile = { ...profile, vocab_size: vocabSize };
  const checked = ModelProfile.safeParse(profile);
  if (!checked.success) return { ok: false, issues: checked.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`) };
  return { ok: true, profile: checked.data };
}

/** `resolveProfile` for callers that validated already: throws on a bad spec. */
export function profileOf(spec: unknown, vocabSize?: number): ModelProfile {
  const r = resolveProfile(spec, vocabSize);
  if (!r.ok) throw new Error(`bad model profile: ${r.issues.join("; ")}`);
  return r.profile;
}
