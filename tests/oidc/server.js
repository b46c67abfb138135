// A real OpenID provider (the certified `oidc-provider` package) for the portal's single sign-on tests
// and for the demo (`PORTAL_DEV_SSO=1 make run`). Test-only: it keeps users in memory and has an
// admin API under /__test/ that a production provider would never have.
//
//   node server.js --port 0        prints "listening <issuer>" once it serves (port 0: any free one)
//
// Admin API (JSON in, JSON out):
//   POST /__test/client  {client_id, client_secret, redirect_uris, post_logout_redirect_uris}
//   POST /__test/users   {sub, email, email_verified, name, preferred_username, groups}  (create or replace)
//   POST /__test/rotate  a new signing key; the old one stays published for tokens already issued
//   POST /__test/mode    {mode}: how the next token responses are spoilt: "" (none), "bad-signature",
//                        "wrong-audience", "expired", "wrong-nonce", "wrong-issuer"
//   GET  /__test/state   the current kid, client, mode and the number of end_session calls
import http from 'node:http';
import { parseArgs } from 'node:util';

import * as jose from 'jose';
import Provider from 'oidc-provider';

const { values: args } = parseArgs({
  options: { port: { type: 'string', default: '0' }, host: { type: 'string', default: '127.0.0.1' } },
});

const state = {
  keys: [], // private JWKs, the signing one first
  users: new Map([
    ['demo-sso', { sub: 'demo-sso', email: 'sso@example.org', email_verified: true, name: 'Sam Sso',
      preferred_username: 'sam', groups: ['gpu-acme-members'] }],
  ]),
  client: {
    client_id: 'portal', client_secret: 'portal-test-secret',
    redirect_uris: ['http://127.0.0.1:8000/oidc/callback/', 'http://localhost:8000/oidc/callback/'],
    post_logout_redirect_uris: ['http://127.0.0.1:8000/accounts/login/', 'http://localhost:8000/accounts/login/'],
  },
  mode: '',
  endSessions: 0,
};

let issuer = '';
let provider = null;

async function newKey() {
  const { privateKey } = await jose.generateKeyPair('RS256', { extractable: true });
  const jwk = await jose.exportJWK(privateKey);
  jwk.kid = `k${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`;
  jwk.alg = 'RS256';
  jwk.use = 'sig';
  return jwk;
}

function page(title, body) {
  return `<!DOCTYPE html><html><head><meta charset="utf-8"><title>${title}</title></head>
<body><main><h1>${title}</h1>${body}</main></body></html>`;
}

function build() {
  const configuration = {
    clients: [{
      ...state.client,
      grant_types: ['authorization_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_post',
    }],
    jwks: { keys: state.keys },
    claims: {
      openid: ['sub'],
      email: ['email', 'email_verified'],
      profile: ['name', 'preferred_username'],
      groups: ['groups'],
    },
    scopes: ['openid', 'email', 'profile', 'groups'],
    pkce: { required: () => true },
    features: {
      devInteractions: { enabled: false },
      rpInitiatedLogout: {
        enabled: true,
        logoutSource: async (ctx, form) => {
          ctx.body = page('Sign out of the test provider', `${form}
<button autofocus type="submit" form="op.logoutForm" value="yes" name="logout">Yes, sign me out</button>`);
        },
        postLogoutSuccessSource: async (ctx) => { ctx.body = page('Signed out', '<p>You are signed out.</p>'); },
      },
    },
    cookies: { keys: ['test-provider-cookie-key'] },
    ttl: { IdToken: 600, AccessToken: 600, AuthorizationCode: 120, Session: 3600, Interaction: 600, Grant: 3600 },
    interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
    // Every client gets every scope it asks for: the test provider has no consent screen.
    loadExistingGrant: async (ctx) => {
      const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
      grant.addOIDCScope('openid email profile groups');
      await grant.save();
      return grant;
    },
    findAccount: async (ctx, id) => {
      const user = state.users.get(id);
      if (!user) return undefined;
      return { accountId: id, claims: async () => ({ ...user, groups: [...(user.groups || [])] }) };
    },
    renderError: async (ctx, out) => { ctx.type = 'html'; ctx.body = page('Provider error', `<pre>${JSON.stringify(out)}</pre>`); },
  };
  const built = new Provider(issuer, configuration);
  built.use(async (ctx, next) => {
    if (ctx.path === '/session/end' || ctx.path === '/session/end/confirm') state.endSessions += ctx.method === 'POST' ? 1 : 0;
    await next();
    if (ctx.path === '/token' && state.mode && ctx.body && ctx.body.id_token) {
      ctx.body = { ...ctx.body, id_token: await spoil(ctx.body.id_token, state.mode) };
    }
  });
  return built;
}

async function spoil(idToken, mode) {
  const [header64, payload64, signature] = idToken.split('.');
  if (mode === 'bad-signature') {
    const payload = JSON.parse(Buffer.from(payload64, 'base64url'));
    payload.groups = ['gpu-acme-admins']; // what a forger would want
    return `${header64}.${Buffer.from(JSON.stringify(payload)).toString('base64url')}.${signature}`;
  }
  const header = JSON.parse(Buffer.from(header64, 'base64url'));
  const payload = JSON.parse(Buffer.from(payload64, 'base64url'));
  const now = Math.floor(Date.now() / 1000);
  if (mode === 'wrong-audience') payload.aud = 'another-client';
  if (mode === 'expired') { payload.iat = now - 7200; payload.exp = now - 3600; }
  if (mode === 'wrong-nonce') payload.nonce = 'not-the-nonce-the-portal-sent';
  if (mode === 'wrong-issuer') payload.iss = 'http://evil.example';
  // Signed with the provider's real key: only the claim checks can catch these.
  const key = await jose.importJWK(state.keys[0], 'RS256');
  return new jose.CompactSign(Buffer.from(JSON.stringify(payload))).setProtectedHeader(header).sign(key);
}

async function readJson(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const text = Buffer.concat(chunks).toString() || '{}';
  return JSON.parse(text);
}

function send(res, status, body, type = 'application/json') {
  res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
  res.end(type === 'application/json' ? JSON.stringify(body) : body);
}

async function admin(req, res, path) {
  if (req.method === 'GET' && path === '/__test/state') {
    return send(res, 200, { kid: state.keys[0].kid, kids: state.keys.map((k) => k.kid), client: state.client,
      mode: state.mode, end_sessions: state.endSessions, issuer });
  }
  if (req.method !== 'POST') return send(res, 405, { error: 'POST' });
  const body = await readJson(req);
  if (path === '/__test/client') {
    state.client = { ...state.client, ...body };
    provider = build();
  } else if (path === '/__test/users') {
    if (!body.sub) return send(res, 400, { error: 'sub is required' });
    state.users.set(body.sub, body);
  } else if (path === '/__test/rotate') {
    state.keys = [await newKey(), state.keys[0]];
    provider = build();
  } else if (path === '/__test/mode') {
    state.mode = body.mode || '';
  } else {
    return send(res, 404, { error: 'unknown' });
  }
  return send(res, 200, { ok: true, kid: state.keys[0].kid });
}

async function interaction(req, res, uid) {
  const details = await provider.interactionDetails(req, res);
  if (req.method === 'GET') {
    const known = [...state.users.keys()].map((sub) => `<li>${sub}</li>`).join('');
    return send(res, 200, page('Sign in to the test provider', `
<form method="post" action="/interaction/${uid}">
  <label for="login">Login</label> <input id="login" name="login" autofocus>
  <button type="submit">Continue</button>
</form><p>Known logins:</p><ul>${known}</ul>`), 'text/html');
  }
  const form = new URLSearchParams(Buffer.concat(await (async () => {
    const chunks = []; for await (const c of req) chunks.push(c); return chunks;
  })()).toString());
  const login = form.get('login') || '';
  if (!state.users.has(login)) {
    return send(res, 200, page('Sign in to the test provider', `<p role="alert">No such login: ${login.replace(/[<>&"]/g, '')}</p>
<form method="post" action="/interaction/${uid}"><label for="login">Login</label> <input id="login" name="login">
<button type="submit">Continue</button></form>`), 'text/html');
  }
  void details;
  return provider.interactionFinished(req, res, { login: { accountId: login } }, { mergeWithLastSubmission: false });
}

async function main() {
  state.keys = [await newKey()];
  const server = http.createServer(async (req, res) => {
    try {
      const path = new URL(req.url, 'http://x').pathname;
      if (path.startsWith('/__test/')) return await admin(req, res, path);
      const match = path.match(/^\/interaction\/([^/]+)$/);
      if (match) return await interaction(req, res, match[1]);
      return provider.callback()(req, res);
    } catch (err) {
      return send(res, 500, { error: String(err && err.message) });
    }
  });
  server.listen(Number(args.port), args.host, () => {
    issuer = `http://${args.host}:${server.address().port}`;
    provider = build();
    console.log(`listening ${issuer}`);
  });
  const stop = () => server.close(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main();
