#!/usr/bin/env node
import { runCli } from "./cli.js";

const code = await runCli(process.argv.slice(2));
// Let stdout drain (a pipe may still hold output) before exiting with the code.
process.stdout.write("", () => process.exit(code));
