// Flat config: typescript-eslint's recommended rules on every workspace, plus the type-aware rules
// that catch promises nobody waits for (an unhandled rejection kills a Node process).
import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["**/dist/**", "**/node_modules/**", "**/.turbo/**", "bench/results/**", "test/agents/**/node_modules/**"] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      globals: { process: "readonly", console: "readonly", setTimeout: "readonly", clearTimeout: "readonly", setInterval: "readonly", clearInterval: "readonly", URL: "readonly", Buffer: "readonly", AbortController: "readonly", AbortSignal: "readonly", TextEncoder: "readonly", TextDecoder: "readonly", fetch: "readonly", structuredClone: "readonly", setImmediate: "readonly" },
      parserOptions: {
        // Each file is typed by the nearest tsconfig.json that includes it (its workspace's).
        // Plain scripts outside any tsconfig are typed by a default project.
        projectService: {
          allowDefaultProject: ["examples/react-agent/agent.mjs", "test/chaos/gc-on-signal.cjs", "test/matrix/render.mjs", "apps/worker/src/sandbox/__fixtures__/*.mjs"],
        },
        tsconfigRootDir: import.meta.dirname,
      },
    },
    rules: {
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      "@typescript-eslint/consistent-type-imports": "error",
      "@typescript-eslint/no-floating-promises": "error",
      "@typescript-eslint/no-misused-promises": "error",
    },
  },
);
