/**
 * The model family × agent matrix, as measured: each suite run that takes an agent through a
 * family writes one cell file under test/artifacts/matrix/cells (gitignored), passed or failed,
 * and `node test/matrix/render.mjs` turns the cells into the README's table. A cell is the last
 * measurement of its (family, agent, protocol, kind, variant); cells never run are "not run".
 */
import { mkdir, writeFile } from "node:fs/promises";
import path from "node:path";
import type { Preflight } from "@rollgate/protocol";
import { REPO_ROOT } from "./cluster.js";

export const MATRIX_CELLS_DIR = path.join(REPO_ROOT, "test", "artifacts", "matrix", "cells");

export interface MatrixCell {
  family: string;
  /** `example-agent` or a harness preset (`claude-code`, `codex`, …). */
  agent: string;
  /** The wire protocol the agent spoke. */
  protocol: string;
  kind: "vllm" | "sglang";
  /** What else tells two runs of the same agent apart (`streamed`, `not streamed`), or "". */
  variant: string;
  /** The agent's version, when it is a pinned CLI. */
  version?: string;
  /** Every assertion of the run held. */
  passed: boolean;
  llm_calls: number | null;
  traces: number | null;
  /** The reasons of the trajectory's breaks (prefix_merging), one per break. */
  breaks: string[];
  /** Every trainable token is the engine's output id with its logprob (null: not got that far). */
  exact: boolean | null;
  /** The first line of the failure, when it failed. */
  error?: string;
  suite: string;
  measured_at: string;
}

export type CellKey = Pick<MatrixCell, "family" | "agent" | "protocol" | "kind" | "variant" | "suite"> & { version?: string };
export type Measurement = Partial<Pick<MatrixCell, "llm_calls" | "traces" | "breaks" | "exact">>;

const slug = (k: CellKey) => [k.family, k.agent, k.protocol, k.kind, k.variant].filter(Boolean).join("--").replace(/[^A-Za-z0-9.-]+/g, "-");

export async function writeCell(cell: MatrixCell): Promise<void> {
  await mkdir(MATRIX_CELLS_DIR, { recursive: true });
  await writeFile(path.join(MATRIX_CELLS_DIR, `${slug(cell)}.json`), `${JSON.stringify(cell, null, 2)}\n`);
}

/**
 * Runs one cell's test body and records its cell whatever happens: `note` keeps what has been
 * measured so far, so a failed cell still says how far it got. The body's error is rethrown.
 */
export async function measureCell(key: CellKey, body: (note: (m: Measurement) => void) => Promise<void>): Promise<void> {
  let m: Measurement = {};
  const note = (more: Measurement) => {
    m = { ...m, ...more };
  };
  const base = { ...key, llm_calls: null, traces: null, breaks: [], exact: null, measured_at: new Date().toISOString() };
  try {
    await body(note);
  } catch (err) {
    await writeCell({ ...base, ...m, passed: false, error: String((err as Error)?.message ?? err).split("\n")[0]!.slice(0, 300) });
    throw err;
  }
  await writeCell({ ...base, ...m, passed: true });
}

export const MATRIX_PREFLIGHT_DIR = path.join(REPO_ROOT, "test", "artifacts", "matrix", "preflight");

/** An engine's preflight (`GET /admin/engines`) as measured on a family, for the README's preflight table. */
export async function writePreflight(family: string, preflight: Preflight): Promise<void> {
  await mkdir(MATRIX_PREFLIGHT_DIR, { recursive: true });
  const { checked_at: _at, url: _url, ...stable } = preflight;
  await writeFile(path.join(MATRIX_PREFLIGHT_DIR, `${family}--${preflight.kind}.json`), `${JSON.stringify({ family, ...stable, measured_at: new Date().toISOString() }, null, 2)}\n`);
}
