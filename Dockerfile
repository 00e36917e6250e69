# One image for every rollgate app (gateway, worker, engine-sim); compose picks the command.
FROM node:22-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json turbo.json tsconfig.json tsconfig.base.json ./
COPY packages packages
COPY apps apps
COPY examples examples
COPY test/package.json test/package.json
RUN npm ci --no-audit --no-fund && npm run build && npm prune --omit=dev

FROM node:22-bookworm-slim
ENV NODE_ENV=production HOST=0.0.0.0
WORKDIR /app
COPY --from=build --chown=node:node /app /app
USER node
CMD ["node", "apps/gateway/dist/main.js", "--help"]
