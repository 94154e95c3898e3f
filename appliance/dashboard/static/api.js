// The /v1 API of the same origin. Errors are the API's
// {"error":{"code","message"}}, thrown as APIError; a 401 (the token
// cookie is missing or stale on TCP) also shows the sign-in banner.

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

async function request(method, path, body) {
  const init = { method, headers: { Accept: 'application/json' }, credentials: 'same-origin' };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
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

// outputURL is where an output file downloads from: its path relative to
// outputs/, with '/' written %2F, as the API wants.
export function outputURL(execution, path) {
  return `${executionPath(execution)}/outputs/${encodeURIComponent(path.replace(/^outputs\//, ''))}`;
}
