import { readFileSync } from "node:fs";

/** A chat template engine-sim ships (apps/engine-sim/templates/NAME.jinja; read from src/ and dist/ alike). */
export function bundledTemplate(name: string): string {
  return readFileSync(new URL(`../../templates/${name}.jinja`, import.meta.url), "utf8");
}
