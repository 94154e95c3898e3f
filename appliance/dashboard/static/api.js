// The /v1 API of the same origin. Errors are the API's
// {"error":{"code","message"}}, thrown as APIError; a 401 (no session,
// or a stale one, on TCP) also shows the sign-in banner.
//
// On TCP the page signs in by exchanging the API token (?token= in its
// address) for a session id, kept in this origin's localStorage and sent
// as a bearer token. Never a cookie: a browser sends a host's cookies to
// every port of it, so a page served on another port of the same host
// would be sent it; localStorage is this origin's alone.

export class APIError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const listeners = new Set();

// onStatus registers fn(ok, err), called after every request: the
// connection indicator and the banner follow it.
export function onStatus(fn) {
  listeners.add(fn);
}

function report(ok, err) {
  for (const fn of listeners) fn(ok, err);
}

const sessionKey = 'hearth_session';

// session is the id this browser signed in with, '' if none (the unix
// socket needs none).
export const session = () => localStorage.getItem(sessionKey) || '';

// sessionQuery is "?session=ID" for an EventSource, which cannot send a
// header; '' without a session.
export const sessionQuery = () => (session() ? `?session=${encodeURIComponent(session())}` : '');

// authFetch is fetch with the session as bearer token and no cookies.
export function authFetch(path, init = {}) {
  const headers = { ...(init.headers || {}) };
  if (session()) headers.Authorization = `Bearer ${session()}`;
  return fetch(path, { ...init, headers, credentials: 'omit' });
}

// signIn exchanges a ?token= in the page's address for a session; the
// token leaves the address (and its history entry) first.
export async function signIn() {
  const params = new URLSearchParams(location.search);
  const token = params.get('token');
  if (token === null) return;
  params.delete('token');
  const rest = params.toString();
  history.replaceState(null, '', location.pathname + (rest ? `?${rest}` : '') + location.hash);
  try {
    const resp = await fetch('/ui/session', {
      method: 'POST', credentials: 'omit', headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
      body: JSON.stringify({ token }),
    });
    if (resp.ok) {
      localStorage.setItem(sessionKey, (await resp.json()).session);
      return;
    }
    report(false, new APIError(resp.status, 'unauthorized', 'the token in the address was refused'));
  } catch (e) {
    report(false, new APIError(0, 'unreachable', `the daemon did not answer (${e.message})`));
  }
}

// signOut ends this browser's session.
export async function signOut() {
  try {
    await authFetch('/ui/logout', { method: 'POST' });
  } finally {
    localStorage.removeItem(sessionKey);
    report(false, new APIError(401, 'unauthorized', 'signed out'));
  }
}

async function request(method, path, body) {
  const init = { method, headers: { Accept: 'application/json' } };
  if (body instanceof FormData) {
    init.body = body; // multipart: the browser sets the type with its boundary
  } else if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await authFetch(path, init);
  } catch (e) {
    const err = new APIError(0, 'unreachable', `the daemon did not answer (${e.message}): is hearth up running?`);
    report(false, err);
    throw err;
  }
  if (resp.ok) {
    report(true);
    return resp.json();
  }
  let e = {};
  try {
    e = (await resp.json()).error || {};
  } catch {
    // not the API's JSON: keep the status line
  }
  const err = new APIError(resp.status, e.code || `http_${resp.status}`, e.message || `${resp.status} ${resp.statusText}`);
  report(resp.status !== 401, err);
  throw err;
}

export const get = (path) => request('GET', path);
export const post = (path, body = {}) => request('POST', path, body);

// postTask sends a delegate or resume request with input files as
// multipart/form-data: the JSON request first, then one "input" part per
// file, streamed by the browser (files up to 1 GiB in all).
export function postTask(path, req, files = []) {
  const form = new FormData();
  form.append('request', new Blob([JSON.stringify(req)], { type: 'application/json' }));
  for (const f of files) form.append('input', f, f.name);
  return request('POST', path, form);
}

// workspaceFileURL reads one file of a workspace session, typed by the
// daemon from its bytes (text/plain, a raster image, or bytes).
export const workspaceFileURL = (session, path) =>
  `/v1/workspace/sessions/${encodeURIComponent(session)}/files${query({ path })}`;

// query builds "?k=v&..." from the set values of params; arrays repeat.
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (Array.isArray(v)) v.forEach((x) => q.append(k, x));
    else if (v !== undefined && v !== null && v !== '') q.set(k, v);
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}

export const executionPath = (id) => `/v1/executions/${encodeURIComponent(id)}`;

// archiveURL is where a workspace session downloads from, as a .tar.gz
// or .zip taken from a snapshot (GET /v1/workspace/sessions/{id}/archive).
export function archiveURL(session, format) {
  return `/v1/workspace/sessions/${encodeURIComponent(session)}/archive?format=${encodeURIComponent(format)}`;
}

// outputURL is where an output file downloads from: its path relative to
// outputs/, with '/' written %2F, as the API wants.
export function outputURL(execution, path) {
  return `${executionPath(execution)}/outputs/${encodeURIComponent(path.replace(/^outputs\//, ''))}`;
}
