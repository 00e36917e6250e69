#!/usr/bin/env node
// The `rollgate` command. A committed file (not dist/) so that `npm ci` on a fresh clone links
// node_modules/.bin/rollgate before anything is built; it runs the built CLI.
import "../dist/main.js";
