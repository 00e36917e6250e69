/**
 * The vLLM releases that introduced behaviour the gateway probes for. engine-sim reports the version
 * it is told (`--vllm-version`) on `/version` and behaves like that release: a feature below its
 * threshold is absent the way it is on a real older server (an unknown request field is ignored,
 * an unknown query parameter is ignored).
 */

export const VLLM_FEATURES = {
  /** `POST /pause?mode=abort|wait|keep` (PR #32351, merged Jan 2026; 0.16.0 is the first release engine-sim assumes has it). Older: `mode` is ignored. */
  pauseModes: "0.16.0",
  /**
   * `--enable-return-routed-experts` (routed experts replay, R3): non-streamed chat and completions
   * answers carry `prompt_routed_experts` and `choices[].routed_experts` (PR #28284 added the capture,
   * Nov 2025; 0.21.0 is the first release whose documented OpenAI-server form engine-sim follows).
   * Older: the flag does not exist and the server refuses to start.
   */
  routedExperts: "0.21.0",
  /** Chat completions take a pre-tokenised prompt in `kv_transfer_params.prompt_token_ids` (PR #48145, merged 2026-07-29; first release known to include it: 0.28.0). */
  chatKvTransferPromptIds: "0.28.0",
  /** Chat completions take a first-class `prompt_token_ids` field (open PR #55771; engine-sim assumes it lands in 0.29.0). */
  chatPromptTokenIds: "0.29.0",
} as const;

export type VllmFeature = keyof typeof VLLM_FEATURES;

export const DEFAULT_VLLM_VERSION = "0.28.0";

/** The numeric release of a version string: "0.28.1.dev3+gabc" → [0, 28, 1]. */
export function releaseOf(version: string): number[] {
  const m = /^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?/.exec(version.trim());
  if (!m) throw new Error(`"${version}" is not a vLLM version (expected X.Y.Z)`);
  return [Number(m[1]), Number(m[2] ?? 0), Number(m[3] ?? 0)];
}

export function atLeast(version: string, min: string): boolean {
  const a = releaseOf(version);
  const b = releaseOf(min);
  for (let i = 0; i < 3; i++) if (a[i]! !== b[i]!) return a[i]! > b[i]!;
  return true;
}

export function vllmHas(version: string, feature: VllmFeature): boolean {
  return atLeast(version, VLLM_FEATURES[feature]);
}
