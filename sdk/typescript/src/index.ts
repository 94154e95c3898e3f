// A client for the Hearth daemon's API: sandboxes, agents, workspace.
//
// The API is described by the daemon's OpenAPI document (GET
// /openapi.yaml; appliance/api/openapi.yaml in the repository). Every
// request goes through Client.call with a literal method and path template
// as in the document: appliance/sdk_test.go reads them from this file and
// fails if one is not in the document, or if an operation the SDK must
// cover is missing.
//
// Over TCP (the config's api.tcp, with the API token) it uses fetch only;
// over the daemon's unix socket, node:http (Node's own), loaded only then.

/** An error response: {"error":{"code","message"}} with its HTTP status. */
export class APIError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly step = '',
  ) {
    super(message);
    this.name = 'APIError';
  }
}

/** The statuses an execution ends in. */
export const TERMINAL_STATUSES = new Set(['completed', 'failed', 'budget_exceeded', 'timed_out', 'cancelled', 'interrupted']);

export const DEFAULT_SOCKET = '/var/lib/hearth/hearth.sock';

export interface ClientOptions {
  /** The daemon's unix socket (state_dir/hearth.sock). */
  socketPath?: string;
  /** host:port of the daemon's TCP API (the config's api.tcp); needs token. */
  addr?: string;
  /** The API token (the daemon's api.token_file). */
  token?: string;
  /** Milliseconds each call that does not stream may take; default 60000. */
  timeoutMs?: number;
}

export type Json = any; // eslint-disable-line @typescript-eslint/no-explicit-any

/** One frame of an exec's output. */
export interface ExecFrame {
  started?: { pid: number };
  stream?: 'stdout' | 'stderr';
  data?: Uint8Array;
  exit?: { code: number; signal?: string; timed_out?: boolean; error?: string };
}

export interface ExecOptions {
  stdin?: Uint8Array | string;
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  /** Go duration ("30s"); "0" none. */
  timeout?: string;
  signal?: AbortSignal;
}

export interface ExecResult {
  code: number;
  stdout: Uint8Array;
  stderr: Uint8Array;
  exit: NonNullable<ExecFrame['exit']>;
}

interface RawResponse {
  status: number;
  contentType: string;
  body: AsyncIterable<Uint8Array>;
}

interface CallOptions {
  params?: Record<string, string>;
  query?: Record<string, string | number | boolean | string[] | undefined>;
  json?: unknown;
  body?: Uint8Array;
  contentType?: string;
  accept?: string;
  stream?: boolean;
  signal?: AbortSignal;
}

const enc = new TextEncoder();
const dec = new TextDecoder();

function fillPath(template: string, params: Record<string, string> = {}): string {
  const out = template.replace(/\{(\w+)\}/g, (_, k: string) => {
    if (!(k in params)) throw new Error(`${template}: the path parameter ${k} is missing`);
    return encodeURIComponent(params[k]);
  });
  return out;
}

function queryString(q: CallOptions['query'] = {}): string {
  const sp = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) {
    if (v === undefined || v === '') continue;
    if (Array.isArray(v)) for (const x of v) sp.append(k, x);
    else sp.append(k, String(v));
  }
  const s = sp.toString();
  return s ? `?${s}` : '';
}

function b64encode(b: Uint8Array): string {
  let s = '';
  for (const x of b) s += String.fromCharCode(x);
  return btoa(s);
}

function b64decode(s: string): Uint8Array {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

async function* readerIterable(stream: ReadableStream<Uint8Array> | null): AsyncIterable<Uint8Array> {
  if (!stream) return;
  const reader = stream.getReader();
  let done = false;
  try {
    for (;;) {
      const r = await reader.read();
      if (r.done) {
        done = true;
        return;
      }
      if (r.value) yield r.value;
    }
  } finally {
    // A caller that stops early (break) closes the connection.
    if (!done) await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}

/** Splits a byte stream into lines (without their "\n"). */
async function* lines(body: AsyncIterable<Uint8Array>): AsyncIterable<string> {
  let buf = '';
  const d = new TextDecoder();
  for await (const chunk of body) {
    buf += d.decode(chunk, { stream: true });
    let i: number;
    while ((i = buf.indexOf('\n')) >= 0) {
      yield buf.slice(0, i).replace(/\r$/, '');
      buf = buf.slice(i + 1);
    }
  }
  buf += d.decode();
  if (buf) yield buf;
}

async function collect(body: AsyncIterable<Uint8Array>): Promise<Uint8Array> {
  const parts: Uint8Array[] = [];
  let n = 0;
  for await (const c of body) {
    parts.push(c);
    n += c.length;
  }
  const out = new Uint8Array(n);
  let off = 0;
  for (const p of parts) {
    out.set(p, off);
    off += p.length;
  }
  return out;
}

function env(name: string): string | undefined {
  const p = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return p?.env?.[name] || undefined;
}

/**
 * A client for one daemon. With no option it uses $HEARTH_ADDR
 * (host:port) and $HEARTH_TOKEN when HEARTH_ADDR is set, as the hearth CLI
 * does, else the socket in $HEARTH_SOCKET, else /var/lib/hearth/hearth.sock.
 */
export class Client {
  readonly socketPath?: string;
  readonly addr?: string;
  readonly token?: string;
  readonly timeoutMs: number;
  readonly sandboxes: Sandboxes;
  readonly agents: Agents;
  readonly workspace: Workspace;

  constructor(opts: ClientOptions = {}) {
    let { socketPath, addr, token } = opts;
    if (!socketPath && !addr) {
      addr = env('HEARTH_ADDR');
      if (addr && !token) token = env('HEARTH_TOKEN');
      if (!addr) socketPath = env('HEARTH_SOCKET') ?? DEFAULT_SOCKET;
    }
    if (addr) {
      if (!token) throw new Error("a TCP address needs the API token: pass token, or set HEARTH_TOKEN (the daemon's api.token_file, by default <state_dir>/api.token)");
      if (addr.includes('://')) throw new Error(`addr ${addr}: give host:port, not a URL`);
    }
    this.socketPath = socketPath;
    this.addr = addr;
    this.token = token;
    this.timeoutMs = opts.timeoutMs ?? 60000;
    this.sandboxes = new Sandboxes(this);
    this.agents = new Agents(this);
    this.workspace = new Workspace(this);
  }

  private async send(method: string, path: string, headers: Record<string, string>, body: Uint8Array | undefined, signal: AbortSignal | undefined): Promise<RawResponse> {
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    if (this.addr) {
      const resp = await fetch(`http://${this.addr}${path}`, { method, headers, body: body as BodyInit | undefined, signal });
      return { status: resp.status, contentType: resp.headers.get('content-type') ?? '', body: readerIterable(resp.body) };
    }
    const http = await import('node:http');
    const socketPath = this.socketPath ?? DEFAULT_SOCKET;
    return new Promise((resolve, reject) => {
      const req = http.request({ socketPath, method, path, headers: { ...headers, Host: 'hearth' }, signal }, (res) => {
        resolve({ status: res.statusCode ?? 0, contentType: String(res.headers['content-type'] ?? ''), body: res });
      });
      req.on('error', (e: NodeJS.ErrnoException) => {
        if (e.code === 'ENOENT' || e.code === 'ECONNREFUSED') {
          reject(new Error(`the hearth daemon at ${socketPath} does not answer (${e.code}): start it with 'hearth up'`));
        } else reject(e);
      });
      if (body) req.write(body);
      req.end();
    });
  }

  /** One operation of the document: method and path template as there. */
  async call(method: string, template: string, o: CallOptions = {}): Promise<Json> {
    const path = fillPath(template, o.params) + queryString(o.query);
    const accept = o.accept ?? 'application/json';
    const headers: Record<string, string> = { Accept: accept };
    let body = o.body;
    if (o.json !== undefined) {
      body = enc.encode(JSON.stringify(o.json));
      headers['Content-Type'] = 'application/json';
    } else if (o.contentType) headers['Content-Type'] = o.contentType;
    // Streams are bounded by the caller's signal; the rest by timeoutMs.
    const signal = o.stream ? o.signal : AbortSignal.timeout(this.timeoutMs);
    const resp = await this.send(method, path, headers, body, signal);
    if (resp.status >= 400) {
      const raw = dec.decode(await collect(resp.body));
      let err: { code?: string; message?: string; step?: string } | undefined;
      try {
        err = JSON.parse(raw).error;
      } catch {
        err = undefined;
      }
      if (err) throw new APIError(resp.status, err.code ?? '', err.message ?? '', err.step ?? '');
      throw new APIError(resp.status, 'http', raw.trim() || `HTTP ${resp.status}`);
    }
    if (o.stream) return resp.body;
    const data = await collect(resp.body);
    if (accept === 'application/json' && resp.contentType.startsWith('application/json')) {
      return data.length ? JSON.parse(dec.decode(data)) : null;
    }
    return data;
  }

  /** The daemon's OpenAPI document, as YAML. */
  async openapi(): Promise<string> {
    return dec.decode(await this.call('GET', '/openapi.yaml', { accept: 'application/yaml' }));
  }

  health(): Promise<Json> {
    return this.call('GET', '/v1/health');
  }
}

/** Sandboxes: machines to run commands in (hearth sandboxes). */
export class Sandboxes {
  constructor(private readonly c: Client) {}

  /** Boots a sandbox (id, image, session, cpus, memory, env, idle_timeout, ...). */
  create(req: Record<string, unknown> = {}): Promise<Json> {
    return this.c.call('POST', '/v1/sandboxes', { json: req });
  }
  list(): Promise<Json[]> {
    return this.c.call('GET', '/v1/sandboxes');
  }
  get(id: string): Promise<Json> {
    return this.c.call('GET', '/v1/sandboxes/{id}', { params: { id } });
  }
  destroy(id: string): Promise<Json> {
    return this.c.call('DELETE', '/v1/sandboxes/{id}', { params: { id } });
  }
  pause(id: string): Promise<Json> {
    return this.c.call('POST', '/v1/sandboxes/{id}/pause', { params: { id } });
  }
  resume(id: string): Promise<Json> {
    return this.c.call('POST', '/v1/sandboxes/{id}/resume', { params: { id } });
  }

  /**
   * Runs argv, yielding its frames as they come: {started}, {stream, data}
   * in the order produced, and last {exit}. An error frame after the start
   * throws APIError.
   */
  async *exec(id: string, argv: string[], o: ExecOptions = {}): AsyncIterable<ExecFrame> {
    if (argv.length === 0) throw new Error('exec needs a command: argv is empty');
    const req: Record<string, unknown> = { argv };
    if (o.stdin !== undefined) req.stdin = b64encode(typeof o.stdin === 'string' ? enc.encode(o.stdin) : o.stdin);
    if (o.env) req.env = o.env;
    if (o.cwd) req.cwd = o.cwd;
    if (o.user) req.user = o.user;
    if (o.timeout) req.timeout = o.timeout;
    const body: AsyncIterable<Uint8Array> = await this.c.call('POST', '/v1/sandboxes/{id}/exec', {
      params: { id }, json: req, accept: 'application/x-ndjson', stream: true, signal: o.signal,
    });
    for await (const line of lines(body)) {
      if (!line.trim()) continue;
      const f = JSON.parse(line);
      if (f.error) throw new APIError(200, f.error.code ?? '', f.error.message ?? '');
      if (typeof f.data === 'string') f.data = b64decode(f.data);
      yield f as ExecFrame;
    }
  }

  /** exec, collected: the exit code and the whole output. */
  async run(id: string, argv: string[], o: ExecOptions = {}): Promise<ExecResult> {
    const out: Uint8Array[] = [];
    const err: Uint8Array[] = [];
    let exit: ExecResult['exit'] = { code: -1 };
    for await (const f of this.exec(id, argv, o)) {
      if (f.stream === 'stdout' && f.data) out.push(f.data);
      else if (f.stream === 'stderr' && f.data) err.push(f.data);
      else if (f.exit) exit = f.exit;
    }
    const join = async (parts: Uint8Array[]) => collect((async function* () { yield* parts; })());
    return { code: exit.code, stdout: await join(out), stderr: await join(err), exit };
  }

  /** Writes data to path in the sandbox, atomically; mode is octal ("0755"). */
  writeFile(id: string, path: string, data: Uint8Array | string, mode?: string): Promise<Json> {
    return this.c.call('PUT', '/v1/sandboxes/{id}/files', {
      params: { id }, query: { path, mode }, body: typeof data === 'string' ? enc.encode(data) : data, contentType: 'application/octet-stream',
    });
  }
  readFile(id: string, path: string): Promise<Uint8Array> {
    return this.c.call('GET', '/v1/sandboxes/{id}/files', { params: { id }, query: { path }, accept: 'application/octet-stream' });
  }
  stat(id: string, path: string): Promise<Json> {
    return this.c.call('GET', '/v1/sandboxes/{id}/files/stat', { params: { id }, query: { path } });
  }
  listDir(id: string, path: string): Promise<Json[]> {
    return this.c.call('GET', '/v1/sandboxes/{id}/files/list', { params: { id }, query: { path } });
  }

  /** Starts argv in the background (env, cwd, user); it outlives the call. */
  startJob(id: string, argv: string[], req: Record<string, unknown> = {}): Promise<Json> {
    return this.c.call('POST', '/v1/sandboxes/{id}/jobs', { params: { id }, json: { argv, ...req } });
  }
  jobs(id: string): Promise<Json[]> {
    return this.c.call('GET', '/v1/sandboxes/{id}/jobs', { params: { id } });
  }
  job(id: string, job: string): Promise<Json> {
    return this.c.call('GET', '/v1/sandboxes/{id}/jobs/{job}', { params: { id, job } });
  }
  jobOutput(id: string, job: string, stream: 'stdout' | 'stderr' = 'stdout'): Promise<Uint8Array> {
    return this.c.call('GET', '/v1/sandboxes/{id}/jobs/{job}/output', { params: { id, job }, query: { stream }, accept: 'application/octet-stream' });
  }
  stopJob(id: string, job: string, grace?: string): Promise<Json> {
    return this.c.call('POST', '/v1/sandboxes/{id}/jobs/{job}/stop', { params: { id, job }, json: grace ? { grace } : {} });
  }

  checkpoint(id: string, name?: string): Promise<Json> {
    return this.c.call('POST', '/v1/sandboxes/{id}/checkpoints', { params: { id }, json: name ? { name } : {} });
  }
  checkpoints(id: string): Promise<Json[]> {
    return this.c.call('GET', '/v1/sandboxes/{id}/checkpoints', { params: { id } });
  }
  restore(id: string, name: string): Promise<Json> {
    return this.c.call('POST', '/v1/sandboxes/{id}/checkpoints/{name}/restore', { params: { id, name } });
  }

  /**
   * Serves port of the sandbox at a preview URL on the daemon (it needs
   * api.tcp): url needs the API token as a bearer; with public, public_url
   * is a link anyone may open.
   */
  expose(id: string, port: number, opts: { public?: boolean } = {}): Promise<Json> {
    return this.c.call('POST', '/v1/sandboxes/{id}/ports', { params: { id }, json: opts.public ? { port, public: true } : { port } });
  }
  ports(id: string): Promise<Json[]> {
    return this.c.call('GET', '/v1/sandboxes/{id}/ports', { params: { id } });
  }
  unexpose(id: string, port: number): Promise<Json> {
    return this.c.call('DELETE', '/v1/sandboxes/{id}/ports/{port}', { params: { id, port: String(port) } });
  }
  revokePublic(id: string, port: number): Promise<Json> {
    return this.c.call('DELETE', '/v1/sandboxes/{id}/ports/{port}/public', { params: { id, port: String(port) } });
  }
}

/** Agents: delegate tasks, follow them, fetch their outputs. */
export class Agents {
  constructor(private readonly c: Client) {}

  list(): Promise<Json[]> {
    return this.c.call('GET', '/v1/agents');
  }

  /**
   * Delegates prompt to agent (session, outputs, limits, ...). With wait
   * the answer comes when it has ended; without, once it is accepted:
   * follow it with events().
   */
  run(agent: string, prompt: string, o: { wait?: boolean; inputs?: Record<string, Uint8Array | string>; [k: string]: unknown } = {}): Promise<Json> {
    const { inputs, ...rest } = o;
    const req: Record<string, unknown> = { agent, prompt, ...rest };
    if (inputs) {
      req.inputs = Object.fromEntries(Object.entries(inputs).map(([k, v]) => [k, b64encode(typeof v === 'string' ? enc.encode(v) : v)]));
    }
    return this.c.call('POST', '/v1/executions', { json: req });
  }
  get(id: string): Promise<Json> {
    return this.c.call('GET', '/v1/executions/{id}', { params: { id } });
  }
  executions(q: { agent?: string; session?: string; status?: string[]; limit?: number } = {}): Promise<Json[]> {
    return this.c.call('GET', '/v1/executions', { query: q });
  }

  /**
   * Follows the execution live (Server-Sent Events): every event after
   * seq `after`, then new ones as they happen, until its last.
   */
  async *events(id: string, after = 0, signal?: AbortSignal): AsyncIterable<Json> {
    const body: AsyncIterable<Uint8Array> = await this.c.call('GET', '/v1/executions/{id}/events', {
      params: { id }, query: { after: after || undefined }, accept: 'text/event-stream', stream: true, signal,
    });
    let data: string[] = [];
    for await (const line of lines(body)) {
      if (line === '') {
        if (data.length) yield JSON.parse(data.join('\n'));
        data = [];
        continue;
      }
      if (line.startsWith(':')) continue; // a keep-alive comment
      const i = line.indexOf(':');
      const field = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? '' : line.slice(i + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'data') data.push(value);
    }
  }
  /** A page of events as JSON: {events, next_after, ended}. */
  eventPage(id: string, after = 0, limit?: number): Promise<Json> {
    return this.c.call('GET', '/v1/executions/{id}/events', { params: { id }, query: { after, limit } });
  }
  /** Follows the execution to its end and returns it. */
  async wait(id: string): Promise<Json> {
    for await (const _ of this.events(id)) void _;
    return this.get(id);
  }
  cancel(id: string): Promise<Json> {
    return this.c.call('POST', '/v1/executions/{id}/cancel', { params: { id } });
  }
  retry(id: string, wait = false): Promise<Json> {
    return this.c.call('POST', '/v1/executions/{id}/retry', { params: { id }, json: wait ? { wait } : {} });
  }
  /** Continues an agent session with a new prompt; the agent keeps its conversation. */
  resume(session: string, prompt: string, o: { wait?: boolean; [k: string]: unknown } = {}): Promise<Json> {
    return this.c.call('POST', '/v1/sessions/{id}/resume', { params: { id: session }, json: { prompt, ...o } });
  }
  sessions(q: { agent?: string; limit?: number } = {}): Promise<Json[]> {
    return this.c.call('GET', '/v1/sessions', { query: q });
  }
  outputs(id: string): Promise<Json[]> {
    return this.c.call('GET', '/v1/executions/{id}/outputs', { params: { id } });
  }
  /** One file under the session's outputs/ ("report.md"). */
  output(id: string, path: string): Promise<Uint8Array> {
    return this.c.call('GET', '/v1/executions/{id}/outputs/{path}', { params: { id, path }, accept: 'application/octet-stream' });
  }
}

/** The workspace: sessions and their copy-on-write snapshots. */
export class Workspace {
  constructor(private readonly c: Client) {}

  sessions(): Promise<Json[]> {
    return this.c.call('GET', '/v1/workspace/sessions');
  }
  createSession(id: string): Promise<Json> {
    return this.c.call('POST', '/v1/workspace/sessions', { json: { id } });
  }
  deleteSession(id: string): Promise<Json> {
    return this.c.call('DELETE', '/v1/workspace/sessions/{id}', { params: { id } });
  }
  snapshots(session = ''): Promise<Json[]> {
    return this.c.call('GET', '/v1/workspace/snapshots', { query: { session } });
  }
  snapshot(session: string, name = ''): Promise<Json> {
    return this.c.call('POST', '/v1/workspace/snapshots', { json: { session, name } });
  }
  deleteSnapshot(session: string, name: string): Promise<Json> {
    return this.c.call('DELETE', '/v1/workspace/snapshots', { query: { session, name } });
  }
  restore(session: string, snapshot: string): Promise<Json> {
    return this.c.call('POST', '/v1/workspace/restore', { json: { session, snapshot } });
  }
  branch(session: string, snapshot: string, newSession: string): Promise<Json> {
    return this.c.call('POST', '/v1/workspace/branch', { json: { session, snapshot, new_session: newSession } });
  }
}
