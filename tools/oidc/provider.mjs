// A real OpenID provider for the query service's access tests (npm `oidc-provider`, panva, MIT; pinned by
// tools/oidc/package-lock.json and installed into .tools/oidc by `make tools`).
//
//   node tools/oidc/provider.mjs --modules DIR/node_modules --keys FILE [--port N] [--patient ID]
//
// Listens on 127.0.0.1 (port 0 = any free port) and prints one JSON line on stdout once it serves:
// {"issuer": "http://127.0.0.1:PORT"}. The signing keys (an RSA and an EC P-256 key, as private JWKs) are read
// from FILE, or made and written there when it does not exist, so a second provider started on the same file signs
// with the same keys under another issuer.
//
// Clients (client-credentials grant, HTTP Basic client authentication, secret = the client id + "-secret"):
//   app        scope patient/*.read, its tokens carry `patient` = --patient (default p1)
//   backend    scope system/*.read
//   teamapp    scope patient/*.read, its tokens carry `patients` = [--patient, "p9"] (a care team's list)
//   nobody     no clinical scope
//   shortlived like app, tokens live 2 seconds
// Resources (the `resource` parameter picks the token's audience and algorithm):
//   urn:clinstream (default)  aud "clinstream", RS256
//   urn:clinstream:es         aud "clinstream", ES256
//   urn:other                 aud "other", RS256
// POST /_test/rotate makes a new RSA key that signs from then on (the old one stays published), as a key rotation
// at a real provider does, without restarting.
import { readFileSync, writeFileSync, existsSync } from 'node:fs';
import { generateKeyPairSync, randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith('--') ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
const modules = args.modules;
const pkg = JSON.parse(readFileSync(join(modules, 'oidc-provider', 'package.json'), 'utf8'));
const entry = typeof pkg.exports === 'string' ? pkg.exports : pkg.exports?.['.']?.import ?? pkg.exports?.['.']?.default ?? pkg.exports?.['.'] ?? pkg.main;
const { default: Provider } = await import(pathToFileURL(join(modules, 'oidc-provider', entry)).href);

function newKey(type) {
  const { privateKey } = type === 'RSA'
    ? generateKeyPairSync('rsa', { modulusLength: 2048 })
    : generateKeyPairSync('ec', { namedCurve: 'P-256' });
  return { ...privateKey.export({ format: 'jwk' }), kid: randomUUID(), use: 'sig', alg: type === 'RSA' ? 'RS256' : 'ES256' };
}

let keys;
if (existsSync(args.keys)) {
  keys = JSON.parse(readFileSync(args.keys, 'utf8'));
} else {
  keys = { keys: [newKey('RSA'), newKey('EC')] };
  writeFileSync(args.keys, JSON.stringify(keys));
}

const patient = args.patient ?? 'p1';
const claims = { app: { patient }, shortlived: { patient }, teamapp: { patients: [patient, 'p9'] } };
const resources = {
  'urn:clinstream': { audience: 'clinstream', alg: 'RS256' },
  'urn:clinstream:es': { audience: 'clinstream', alg: 'ES256' },
  'urn:other': { audience: 'other', alg: 'RS256' },
};
const client = (id, scope) => ({
  client_id: id, client_secret: `${id}-secret`, grant_types: ['client_credentials'], redirect_uris: [],
  response_types: [], token_endpoint_auth_method: 'client_secret_basic', scope,
});

function provider(issuer) {
  const p = new Provider(issuer, {
    clients: [
      client('app', 'patient/*.read'), client('backend', 'system/*.read'), client('teamapp', 'patient/*.read'),
      client('nobody', 'openid'), client('shortlived', 'patient/*.read'),
    ],
    jwks: keys,
    scopes: ['openid', 'patient/*.read', 'system/*.read'],
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => 'urn:clinstream',
        useGrantedResource: () => true,
        getResourceServerInfo: (_ctx, indicator) => {
          const r = resources[indicator];
          if (!r) throw new Provider.errors.InvalidTarget();
          return {
            scope: 'openid patient/*.read system/*.read', audience: r.audience, accessTokenFormat: 'jwt',
            accessTokenTTL: 600, jwt: { sign: { alg: r.alg } },
          };
        },
      },
    },
    ttl: { ClientCredentials: (_ctx, token) => (token.clientId === 'shortlived' ? 2 : 600) },
    extraTokenClaims: (_ctx, token) => claims[token.clientId],
  });
  p.proxy = false;
  return p;
}

let current;
const server = createServer((req, res) => {
  if (req.method === 'POST' && req.url === '/_test/rotate') {
    const fresh = newKey('RSA');
    keys = { keys: [fresh, ...keys.keys] };
    current = provider(issuer).callback();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ kid: fresh.kid }));
    return;
  }
  current(req, res);
});
let issuer;
server.listen(Number(args.port ?? 0), '127.0.0.1', () => {
  issuer = `http://127.0.0.1:${server.address().port}`;
  current = provider(issuer).callback();
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
});
process.on('SIGTERM', () => process.exit(0));
