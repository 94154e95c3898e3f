// The TypeScript SDK (compiled, dist/) against a live daemon;
// appliance/sdk_test.go runs it. Environment: HEARTH_SOCKET (the daemon's
// unix socket), HEARTH_TEST_ADDR and HEARTH_TEST_TOKEN (its TCP API),
// HEARTH_TEST_AGENT (an agent whose scripted model follows the prompts
// below). This one talks TCP with the token; the Python one, the socket.
// Exits non-zero naming the first check that failed.

import { APIError, Client, TERMINAL_STATUSES } from '../dist/index.js';

function check(ok, what) {
  if (!ok) throw new Error(what);
}

async function expectError(code, p) {
  try {
    await p;
  } catch (e) {
    check(e instanceof APIError, `${e}: not an APIError`);
    check(e.code === code, `error code ${e.code} (${e.message}), want ${code}`);
    return e;
  }
  throw new Error(`no error, want ${code}`);
}

const env = process.env;
const c = new Client({ addr: env.HEARTH_TEST_ADDR, token: env.HEARTH_TEST_TOKEN });
const agent = env.HEARTH_TEST_AGENT;
const text = new TextDecoder();
const eq = (a, b) => JSON.stringify(a) === JSON.stringify(b);

// Transport: the unix socket, a wrong token, the served document.
const unix = new Client({ socketPath: env.HEARTH_SOCKET });
check('store_ok' in (await unix.health()), 'health over the unix socket');
const e401 = await expectError('unauthorized', new Client({ addr: env.HEARTH_TEST_ADDR, token: 'not-the-token-0123456789' }).health());
check(e401.status === 401, `a wrong token: status ${e401.status}`);
check((await c.openapi()).includes('operationId: execSandbox'), 'GET /openapi.yaml lacks execSandbox');

// Sandboxes: exec streaming in order, stdin, files, jobs.
const sbx = await c.sandboxes.create({ id: 'ts-sdk', idle_timeout: '0' });
try {
  check(sbx.status === 'running', `created sandbox status ${sbx.status}`);
  check((await c.sandboxes.list()).some((s) => s.id === 'ts-sdk'), 'the sandbox is not listed');
  const frames = [];
  for await (const f of c.sandboxes.exec('ts-sdk', ['sh', '-c', 'echo one; sleep 0.3; echo two >&2; sleep 0.3; cat; exit 3'], { stdin: 'from stdin\n' })) frames.push(f);
  check(frames[0].started, `first frame ${JSON.stringify(frames[0])}, want started`);
  const streams = frames.filter((f) => f.stream).map((f) => [f.stream, text.decode(f.data)]);
  check(eq(streams, [['stdout', 'one\n'], ['stderr', 'two\n'], ['stdout', 'from stdin\n']]), `exec frames ${JSON.stringify(streams)}`);
  check(frames.at(-1).exit.code === 3, `last frame ${JSON.stringify(frames.at(-1))}, want exit 3`);

  // Streaming: the first line arrives while the command still runs.
  const start = performance.now();
  const at = {};
  for await (const f of c.sandboxes.exec('ts-sdk', ['sh', '-c', 'echo early; sleep 2; echo late'])) {
    if (f.stream === 'stdout') at[text.decode(f.data)] = performance.now() - start;
  }
  check(eq(Object.keys(at), ['early\n', 'late\n']), `streamed output ${JSON.stringify(at)}`);
  check(at['late\n'] - at['early\n'] > 1500, `early came ${at['late\n'] - at['early\n']}ms before late: not streamed`);

  const bytes = Uint8Array.from({ length: 256 }, (_, i) => i);
  const w = await c.sandboxes.writeFile('ts-sdk', '/tmp/data bin', bytes, '0600');
  check(w.size === 256, `writeFile ${JSON.stringify(w)}`);
  check(eq([...(await c.sandboxes.readFile('ts-sdk', '/tmp/data bin'))], [...bytes]), 'readFile bytes differ');
  const st = await c.sandboxes.stat('ts-sdk', '/tmp/data bin');
  check(st.size === 256 && st.mode === 0o600, `stat ${JSON.stringify(st)}`);
  check((await c.sandboxes.listDir('ts-sdk', '/tmp')).some((f) => f.name === 'data bin'), 'listDir lacks the file');
  await expectError('not_found', c.sandboxes.readFile('ts-sdk', '/no/such/file'));
  check(eq([...(await c.sandboxes.run('ts-sdk', ['cat', '/tmp/data bin'])).stdout], [...bytes]), 'run stdout');

  const paused = await c.sandboxes.pause('ts-sdk');
  check(paused.status === 'paused', `paused ${paused.status}`);
  await expectError('conflict', c.sandboxes.run('ts-sdk', ['true']));
  check((await c.sandboxes.resume('ts-sdk')).status === 'running', 'resumed');
  await c.sandboxes.run('ts-sdk', ['sh', '-c', 'echo kept > "$HOME/keep"']);
  const exposed = await c.sandboxes.expose('ts-sdk', 8000, { public: true });
  check(exposed.port === 8000 && exposed.url.startsWith('http://') && exposed.public_url, `exposed ${JSON.stringify(exposed)}`);
  check(eq((await c.sandboxes.ports('ts-sdk')).map((p) => p.port), [8000]), 'ports list');
  check(!(await c.sandboxes.revokePublic('ts-sdk', 8000)).public_url, 'public link revoked');
  await c.sandboxes.unexpose('ts-sdk', 8000);
  check((await c.sandboxes.ports('ts-sdk')).length === 0, 'port closed');
  const cp = await c.sandboxes.checkpoint('ts-sdk', 'cp1');
  check(cp.name === 'cp1', `checkpoint ${JSON.stringify(cp)}`);
  await c.sandboxes.run('ts-sdk', ['sh', '-c', 'rm "$HOME/keep"']);
  check(eq((await c.sandboxes.checkpoints('ts-sdk')).map((x) => x.name), ['cp1']), 'checkpoints list');
  check((await c.sandboxes.restore('ts-sdk', 'cp1')).status === 'running', 'restored');
  const back = await c.sandboxes.run('ts-sdk', ['sh', '-c', 'cat "$HOME/keep"']);
  check(text.decode(back.stdout) === 'kept\n', `after restore the file holds ${JSON.stringify(text.decode(back.stdout))} (${text.decode(back.stderr)})`);

  // The other transport streams too: exec over the unix socket.
  const r = await unix.sandboxes.run('ts-sdk', ['sh', '-c', 'echo over-unix']);
  check(r.code === 0 && text.decode(r.stdout) === 'over-unix\n', `exec over the unix socket ${JSON.stringify(r.exit)}`);

  const job = await c.sandboxes.startJob('ts-sdk', ['sh', '-c', 'echo job-out; sleep 300']);
  check(job.state === 'running', `job ${JSON.stringify(job)}`);
  check(eq((await c.sandboxes.jobs('ts-sdk')).map((j) => j.id), [job.id]), 'jobs list');
  const deadline = Date.now() + 30000;
  while (text.decode(await c.sandboxes.jobOutput('ts-sdk', job.id)) !== 'job-out\n') {
    check(Date.now() < deadline, "the job's output did not come within 30s");
    await new Promise((r) => setTimeout(r, 50));
  }
  const stopped = await c.sandboxes.stopJob('ts-sdk', job.id, '1s');
  check(stopped.state === 'cancelled', `stopped job ${JSON.stringify(stopped)}`);
  check((await c.sandboxes.job('ts-sdk', job.id)).state === 'cancelled', 'job state after stop');
  const jobOut = text.decode(await c.sandboxes.jobOutput('ts-sdk', job.id));
  check(jobOut === 'job-out\n', `job output after stop ${JSON.stringify(jobOut)}`);
} finally {
  await c.sandboxes.destroy('ts-sdk');
}
await expectError('not_found', c.sandboxes.get('ts-sdk'));

// Workspace: sessions, snapshots, restore, branch.
await c.workspace.createSession('ts-ws');
check((await c.workspace.sessions()).some((s) => s.ID === 'ts-ws'), 'session not listed');
const snap = await c.workspace.snapshot('ts-ws', 'first');
check(snap.name === 'first', `snapshot ${JSON.stringify(snap)}`);
check(eq((await c.workspace.snapshots('ts-ws')).map((s) => s.Name), ['first']), 'snapshots list');
await c.workspace.restore('ts-ws', 'first');
await c.workspace.branch('ts-ws', 'first', 'ts-ws-branch');
check((await c.workspace.sessions()).some((s) => s.ID === 'ts-ws-branch'), 'branch not listed');
await c.workspace.deleteSnapshot('ts-ws', 'first');
await c.workspace.deleteSession('ts-ws-branch');
await c.workspace.deleteSession('ts-ws');

// Agents: run, follow live, outputs, resume, cancel.
check((await c.agents.list()).some((a) => a.name === agent), `agent ${agent} not listed`);
const run = await c.agents.run(agent, 'write-report please');
check(['pending', 'running'].includes(run.status), `run without wait: ${run.status}`);
const types = [];
for await (const ev of c.agents.events(run.id)) types.push(ev.type);
check(types.includes('tool_call') && types.at(-1) === 'status', `live events ${types}`);
const done = await c.agents.get(run.id);
check(done.status === 'completed' && done.result === 'report written', `execution ${done.status}: ${done.result} ${done.error}`);
const outs = await c.agents.outputs(run.id);
check(outs.some((o) => o.path === 'outputs/report.md' && o.matched), `outputs ${JSON.stringify(outs)}`);
check(text.decode(await c.agents.output(run.id, 'report.md')) === '# test report\n', 'report.md content');
await expectError('bad_request', c.agents.output(run.id, '../.home/x'));
const page = await c.agents.eventPage(run.id, 0, 2);
check(page.events.length === 2 && !page.ended, `event page ${JSON.stringify(page)}`);

const resumed = await c.agents.resume(done.session, 'summarize it', { wait: true });
check(resumed.status === 'completed' && resumed.result === 'summary added' && resumed.previous === run.id, `resumed ${JSON.stringify(resumed)}`);
check((await c.agents.sessions({ agent })).some((s) => s.id === done.session), 'agent sessions');

const long = await c.agents.run(agent, 'sleep-long now');
for await (const ev of c.agents.events(long.id)) if (ev.type === 'tool_call') break;
const cancelled = await c.agents.cancel(long.id);
check(cancelled.status === 'cancelled' && TERMINAL_STATUSES.has(cancelled.status), `cancelled ${cancelled.status}`);
await expectError('conflict', c.agents.cancel(long.id));
const retried = await c.agents.retry(long.id, true);
check(retried.status === 'completed' && retried.previous === long.id, `retried ${retried.status} ${retried.previous}`);
const ids = (await c.agents.executions({ agent })).map((e) => e.id);
check(ids.includes(long.id) && ids.includes(run.id) && ids.includes(retried.id), 'executions list');
console.log('typescript sdk: ok');
