#!/usr/bin/env bash
# Installs the pinned agent CLIs (package.json + package-lock.json here) into test/agents/node_modules,
# apart from the main dependency tree. Idempotent: a second run with the same lockfile does nothing.
# Install scripts are skipped (node-pty's node-gyp build, keytar, koffi, protobufjs: the CLIs run
# without them); the two that matter are run explicitly below. They are offline: each copies its
# platform's native binary from an optional dependency over a stub `bin/*.exe`, and without them
# `claude` and `opencode` only print "native binary not installed".
set -euo pipefail
cd "$(dirname "$0")"

stamp=node_modules/.rollgate-install-stamp
want=$(node -e 'const c=require("crypto"),f=require("fs");process.stdout.write(c.createHash("sha256").update(f.readFileSync("package-lock.json")).update(process.version).digest("hex"))')
bins=(claude codex gemini qwen opencode pi)

installed() {
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] || return 1
  for b in "${bins[@]}"; do [ -x "node_modules/.bin/$b" ] || return 1; done
}

if installed; then
  echo "agent CLIs: already installed"
else
  echo "agent CLIs: installing the pinned versions into test/agents/node_modules"
  flags=(--prefix . --ignore-scripts --no-audit --no-fund --loglevel=error)
  if ! npm ci "${flags[@]}" 2>ci.err; then
    # A registry mirror without the other platforms' optional binaries (opencode-darwin-*, …) leaves
    # them out of the lockfile, and `npm ci` refuses such a lockfile. `npm install` still installs
    # exactly the locked versions and integrity hashes; the lockfile itself is kept as committed.
    grep -q "EUSAGE" ci.err || { cat ci.err >&2; rm -f ci.err; exit 1; }
    echo "agent CLIs: npm ci refused the lockfile (optional binaries of other platforms missing); npm install from it"
    cp package-lock.json package-lock.json.orig
    npm install "${flags[@]}" || { mv package-lock.json.orig package-lock.json; exit 1; }
    mv package-lock.json.orig package-lock.json
  fi
  rm -f ci.err
  (cd node_modules/@anthropic-ai/claude-code && node install.cjs)
  (cd node_modules/opencode-ai && node postinstall.mjs)
  echo "$want" >"$stamp"
fi

# Each CLI must start offline on this Node: print the versions (HOME in a throwaway folder).
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
for b in "${bins[@]}"; do
  if ! v=$(HOME="$home" DO_NOT_TRACK=1 CI=1 timeout 60 "node_modules/.bin/$b" --version 2>&1 </dev/null) || [ -z "$v" ]; then
    echo "agent CLIs: $b --version failed:" >&2
    echo "$v" >&2
    exit 1
  fi
  v=$(printf '%s\n' "$v" | tail -n 1)
  echo "  $b: $v"
done
