// One execution: what it is and costs, Cancel and Retry, its output
// files, and its event stream rendered as the events arrive (Server-Sent
// Events from the API, resumed with Last-Event-ID if the connection
// drops).

import { get, post, executionPath, outputURL, archiveURL, authFetch, sessionQuery, query } from '../api.js';
import { h, replace, badge, poll, errorBox } from '../dom.js';
import { usd, turnsOf, spendOf, ranFor, terminal, bytes, count, when, oneLine } from '../format.js';
import { renderEvent, attachResult } from './events.js';

// eventTypes are the SSE event names the API sends (one per event type).
const eventTypes = ['status', 'text', 'tool_call', 'tool_result', 'model_call', 'retry', 'file', 'budget', 'warning', 'error', 'output', 'network', 'system', 'child', 'claim', 'rewind'];

export function mount(el, id) {
  const v = {
    id,
    exec: null,
    summary: h('section', { class: 'summary', id: 'summary' }),
    tree: h('section', { class: 'tree', id: 'tree' }),
    branches: h('section', { class: 'branches', id: 'branches' }),
    actions: h('div', { class: 'actions', id: 'actions' }),
    outputs: h('section', { class: 'outputs', id: 'outputs' }),
    claims: h('section', { class: 'claims', id: 'claims', hidden: true }),
    viewer: h('section', { class: 'viewer', id: 'viewer', hidden: true }),
    events: h('div', { class: 'events', id: 'events' }),
    lastSeq: 0,
  };
  el.append(
    h('p', { class: 'crumbs' }, h('a', { href: '#/' }, 'Executions'), ' / ', id),
    h('div', { class: 'head' }, h('h1', {}, id), v.actions),
    v.summary,
    v.tree,
    v.branches,
    v.claims,
    h('h2', {}, 'Output files'), v.outputs, v.viewer,
    h('h2', {}, 'Events'), v.events,
  );
  const refresh = debounce(() => loadExecution(v), 150);
  const refreshOutputs = debounce(() => loadOutputs(v), 500);
  const refreshClaims = debounce(() => loadClaims(v), 300);
  const stopPoll = poll(async () => {
    if (!v.exec || !terminal(v.exec.status)) await loadExecution(v);
  }, 2000);
  loadOutputs(v);
  loadClaims(v);
  const source = follow(v, (ev) => {
    if (['model_call', 'status', 'budget', 'tool_call', 'child'].includes(ev.type)) refresh();
    if (ev.type === 'file' || ev.type === 'status') refreshOutputs();
    if (ev.type === 'claim' || ev.type === 'status') refreshClaims();
  });
  return () => {
    source.close();
    stopPoll();
    refresh.cancel();
    refreshOutputs.cancel();
    refreshClaims.cancel();
  };
}

// follow opens the event stream and renders each event once, in seq
// order; it closes the stream after the execution's final status, since
// the server ends it there and EventSource would otherwise reconnect.
function follow(v, onEvent) {
  const es = new EventSource(`${executionPath(v.id)}/events${sessionQuery()}`);
  const handle = (msg) => {
    let ev;
    try {
      ev = JSON.parse(msg.data);
    } catch {
      return;
    }
    if (ev.seq <= v.lastSeq) return;
    v.lastSeq = ev.seq;
    show(v, ev);
    onEvent(ev);
    if (ev.type === 'status' && ev.payload && terminal(ev.payload.status)) es.close();
  };
  for (const t of ['message', ...eventTypes]) es.addEventListener(t, handle);
  es.addEventListener('error', () => {
    if (es.readyState === EventSource.CLOSED) {
      v.events.append(h('p', { class: 'error' }, 'The event stream was refused; reload the page to follow it again.'));
    } else if (v.exec && terminal(v.exec.status)) {
      es.close(); // it ended and the stream has said all it will: do not reconnect for ever
    }
  });
  return es;
}

// show adds one event to the stream view, keeping it scrolled to the
// end if it was there.
function show(v, ev) {
  const atEnd = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
  if (ev.type === 'tool_result' && attachResult(v.events, ev)) {
    // shown under its call
  } else {
    const row = renderEvent(ev);
    if (ev.type === 'model_call') addCallActions(v, row, ev.payload || {});
    v.events.append(row);
  }
  if (atEnd && v.events.childElementCount > 1) window.scrollTo(0, document.body.scrollHeight);
}

async function loadExecution(v) {
  try {
    v.exec = await get(executionPath(v.id));
  } catch (e) {
    replace(v.summary, errorBox(e));
    return;
  }
  showSummary(v);
  showActions(v);
  await loadTree(v);
  await loadBranches(v);
}

// sessionPath is an agent session's API path.
const sessionPath = (id) => `/v1/sessions/${encodeURIComponent(id)}`;

// addCallActions puts "rewind here" and "branch here" on a finished model
// call's row: they take the session back (or a new one) to the state
// after this call, counted in this execution as its snapshots are.
function addCallActions(v, row, p) {
  const m = /\.call-(\d+)$/.exec(p.snapshot || '');
  if (p.phase === 'start' || !m) return;
  const call = Number(m[1]);
  const msg = h('span', { class: 'action-error' });
  const session = () => (v.exec ? v.exec.session : '');
  const rewind = h('button', { class: 'rewind-here', title: `put the session's files and conversation back as they were after this call (undoable)`,
    onclick: (e) => act(e.target, msg, 'Rewinding…', async () => {
      if (!session()) throw new Error('the execution is still loading');
      if (!confirm(`Rewind session ${session()} to after call ${call}? The state now is kept as a snapshot; undo with hearth agents rewind ${session()} --undo.`)) return;
      const r = await post(`${sessionPath(session())}/rewind`, { call, execution: v.id });
      msg.textContent = `rewound; the state before is snapshot ${r.undo}`;
    }) }, 'rewind here');
  const branch = h('button', { class: 'branch-here', title: 'start a new session as this one was after this call',
    onclick: (e) => act(e.target, msg, 'Branching…', async () => {
      if (!session()) throw new Error('the execution is still loading');
      const b = await post(`${sessionPath(session())}/branches`, { call, execution: v.id });
      msg.textContent = `branched as session ${b.session.id}: continue it with hearth agents resume ${b.session.id}`;
      await loadBranches(v);
    }) }, 'branch here');
  row.querySelector('.body').append(' ', rewind, ' ', branch, ' ', msg);
}

// loadBranches shows where the session was branched from and the
// sessions branched from it.
async function loadBranches(v) {
  const s = v.exec && v.exec.session;
  if (!s) return;
  let me, kids;
  try {
    [me, kids] = await Promise.all([get(sessionPath(s)), get(`${sessionPath(s)}/branches`)]);
  } catch (err) {
    replace(v.branches, errorBox(err));
    return;
  }
  const from = me.branched_from ? h('p', { class: 'branched-from' }, `Session ${s} was branched from session ${me.branched_from} at snapshot ${me.branched_at}.`) : null;
  if (!from && kids.length === 0) {
    replace(v.branches);
    return;
  }
  replace(v.branches, h('h2', {}, `Branches (${kids.length})`), from,
    kids.length ? h('ul', { class: 'branch-list' }, kids.map((k) => h('li', { dataset: { id: k.id } },
      `${k.id} from ${k.branched_at}`, k.last_execution ? [' (last run ', h('a', { href: `#/execution/${encodeURIComponent(k.last_execution)}` }, k.last_execution), ')'] : ' (not run yet)'))) : null);
}

// loadTree shows the executions this one delegated to: each with its
// status and what it cost with its own children.
async function loadTree(v) {
  const e = v.exec;
  if (!e.children || e.children.length === 0) {
    replace(v.tree);
    return;
  }
  let kids;
  try {
    kids = await get(`/v1/executions${query({ parent: e.id, limit: 10000 })}`);
  } catch (err) {
    replace(v.tree, errorBox(err));
    return;
  }
  kids.reverse(); // oldest first, as delegated
  replace(v.tree, h('h2', {}, `Children (${kids.length})`), h('table', { class: 'list children' },
    h('thead', {}, h('tr', {}, ['execution', 'agent', 'status', 'cost with its children'].map((c) => h('th', {}, c)))),
    h('tbody', {}, kids.map((k) => h('tr', { dataset: { id: k.id, status: k.status } },
      h('td', {}, h('a', { href: `#/execution/${encodeURIComponent(k.id)}` }, k.id)),
      h('td', {}, k.agent),
      h('td', {}, badge(k.status)),
      h('td', { class: 'c-total' }, usd(k.total_usd)))))));
}

function showSummary(v) {
  const e = v.exec;
  const t = e.tokens || {};
  const rows = [
    ['status', badge(e.status)],
    ['agent', e.agent],
    ['session', [h('a', { class: 'session-link', href: `#/session/${encodeURIComponent(e.session)}` }, e.session), ' ', archiveLink(e.session, 'tar.gz'), ' ', archiveLink(e.session, 'zip')]],
    ['kind', e.previous ? [e.kind, ' of ', h('a', { href: `#/execution/${encodeURIComponent(e.previous)}` }, e.previous)] : e.kind],
    ['parent', e.parent ? [h('a', { href: `#/execution/${encodeURIComponent(e.parent)}`, id: 'parent-link' }, e.parent), ` (depth ${e.depth})`] : null],
    ['prompt', h('span', { class: 'prompt' }, e.prompt)],
    ['created', when(e.created)],
    ['elapsed', ranFor(e)],
    ['calls', turnsOf(e)],
    ['tokens', `${count(t.input)} in / ${count(t.output)} out` + (t.cache_read || t.cache_creation ? ` (cache ${count(t.cache_read)} read, ${count(t.cache_creation)} written)` : '')],
    ['cost', spendOf(e)],
    ['with children', e.parent || (e.children && e.children.length) || e.total_usd !== e.usd ? `${usd(e.total_usd)}, ${count((e.total_tokens || {}).input)} in / ${count((e.total_tokens || {}).output)} out tokens` : null],
    ['limits', limitsOf(e.limits)],
    ['result', e.result ? h('span', { class: 'result' }, e.result) : null],
    ['error', e.error ? h('span', { class: 'error' }, e.error) : null],
  ];
  replace(v.summary, h('dl', {}, rows.filter(([, val]) => val !== null && val !== '' && val !== undefined)
    .map(([k, val]) => [h('dt', {}, k), h('dd', { class: `f-${k.replace(/ /g, '-')}` }, val)])));
}

function limitsOf(l = {}) {
  const parts = [];
  if (l.usd) parts.push(usd(l.usd));
  if (l.turns) parts.push(`${l.turns} model calls`);
  if (l.wall_time) parts.push(l.wall_time);
  return parts.join(', ') || 'none';
}

// showActions offers Cancel while it runs (and Top up when it has a
// dollar limit: one awaiting budget goes on) and Retry once it failed or
// was stopped.
function showActions(v) {
  const e = v.exec;
  const msg = h('span', { class: 'action-error' });
  const buttons = [];
  if (!terminal(e.status)) {
    buttons.push(h('button', { id: 'cancel', class: 'danger', onclick: (ev) => act(ev.target, msg, 'Cancelling…', async () => {
      await post(`${executionPath(e.id)}/cancel`);
      await loadExecution(v);
    }) }, 'Cancel'));
    if (e.limits && e.limits.usd) {
      const amount = h('input', { id: 'topup-usd', type: 'number', min: '0.01', step: '0.01', value: '1', 'aria-label': 'dollars to add' });
      buttons.push(amount, h('button', { id: 'topup', onclick: (ev) => act(ev.target, msg, 'Topping up…', async () => {
        const add = Number(amount.value);
        if (!(add > 0)) throw new Error('give a positive number of dollars to add');
        await post(`${executionPath(e.id)}/topup`, { usd: add });
        await loadExecution(v);
      }) }, e.status === 'awaiting_budget' ? 'Top up and resume' : 'Top up'));
    }
  } else if (e.status !== 'completed') {
    buttons.push(h('button', { id: 'retry', onclick: (ev) => act(ev.target, msg, 'Retrying…', async () => {
      const next = await post(`${executionPath(e.id)}/retry`, {});
      location.hash = `#/execution/${encodeURIComponent(next.id)}`;
    }) }, 'Retry'));
  }
  // Keep the buttons shown if they are the same: a button replaced
  // between mouse down and up loses the click.
  const key = buttons.map((b) => b.id).join(',') + (e.status === 'awaiting_budget' ? ',awaiting' : '');
  if (v.actions.dataset.key === key) return;
  v.actions.dataset.key = key;
  replace(v.actions, ...buttons, msg);
}

async function act(button, msg, busy, fn) {
  const label = button.textContent;
  button.disabled = true;
  button.textContent = busy;
  try {
    await fn();
  } catch (e) {
    msg.textContent = e.message;
    button.disabled = false;
    button.textContent = label;
  }
}

async function loadOutputs(v) {
  let files;
  try {
    files = await get(`${executionPath(v.id)}/outputs`);
  } catch (e) {
    replace(v.outputs, errorBox(e));
    return;
  }
  if (files.length === 0) {
    replace(v.outputs, h('p', { class: 'muted' }, 'No files in outputs/ yet.'));
    return;
  }
  replace(v.outputs, h('table', { class: 'list' },
    h('thead', {}, h('tr', {}, ['file', 'size', 'modified', '', ''].map((c) => h('th', {}, c)))),
    h('tbody', {}, files.map((f) => h('tr', { dataset: { path: f.path } },
      h('td', {}, f.path, f.matched ? h('span', { class: 'tag', title: 'matched by the output patterns' }, 'output') : null),
      h('td', {}, bytes(f.size)),
      h('td', {}, when(f.modified)),
      h('td', {}, h('button', { class: 'link open', onclick: () => openFile(v, f) }, 'open')),
      h('td', {}, h('a', { class: 'download', href: '#', dataset: { url: outputURL(v.id, f.path) }, onclick: (e) => download(e, f.path.split('/').pop()) }, 'download')))))));
}

// archiveLink downloads the whole session (its .home left out) as an
// archive of format, read by the daemon from a snapshot.
function archiveLink(session, format) {
  return h('a', { class: `archive archive-${format.replace('.', '')}`, href: '#', title: `download the session's files as a .${format}`,
    dataset: { url: archiveURL(session, format) }, onclick: (e) => download(e, `${session}.${format}`) }, `download .${format}`);
}

// loadClaims shows the leases on workspace paths the execution holds, if
// any: a small list, hidden when there are none.
async function loadClaims(v) {
  let list;
  try {
    list = await get(`/v1/claims${query({ holder: v.id })}`);
  } catch (e) {
    v.claims.hidden = false;
    replace(v.claims, errorBox(e));
    return;
  }
  v.claims.hidden = list.length === 0;
  replace(v.claims, h('h2', {}, 'Leases held'),
    h('ul', { class: 'claims-list' }, list.map((c) => h('li', { dataset: { path: c.path } },
      h('code', {}, c.path), h('span', { class: 'muted' }, ` until ${when(c.expires)}`)))));
}

// download saves an output or an archive as name: fetched with the session (a plain link
// would carry none), then handed to the browser as a blob.
async function download(e, name) {
  e.preventDefault();
  const link = e.currentTarget;
  try {
    const resp = await authFetch(link.dataset.url);
    if (!resp.ok) throw new Error(`${resp.status}: ${oneLine(await resp.text())}`);
    // Typed as bytes whatever the file: a blob: URL is this origin's, and
    // an agent's HTML opened from it would run with the session.
    const url = URL.createObjectURL(new Blob([await resp.arrayBuffer()], { type: 'application/octet-stream' }));
    const a = h('a', { href: url, download: name });
    a.click();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  } catch (err) {
    link.replaceWith(errorBox(err));
  }
}

const images = { png: 'image/png', jpg: 'image/jpeg', jpeg: 'image/jpeg', gif: 'image/gif', webp: 'image/webp', svg: 'image/svg+xml' };
const maxView = 2 << 20;

// openFile shows an output in the page: an image as an image, anything
// else as text (never as HTML: an agent's file must not run in the
// dashboard's origin).
async function openFile(v, f) {
  const close = h('button', { class: 'link', onclick: () => { v.viewer.hidden = true; replace(v.viewer); } }, 'close');
  v.viewer.hidden = false;
  replace(v.viewer, h('div', { class: 'viewer-head' }, h('strong', {}, f.path), close), h('p', { class: 'muted' }, 'Loading…'));
  if (f.size > maxView) {
    v.viewer.lastChild.textContent = `${bytes(f.size)} is too big to show here: download it.`;
    return;
  }
  try {
    const resp = await authFetch(outputURL(v.id, f.path));
    if (!resp.ok) throw new Error(`${resp.status}: ${oneLine(await resp.text())}`);
    const type = images[f.path.split('.').pop().toLowerCase()];
    const body = type
      ? h('img', { src: URL.createObjectURL(new Blob([await resp.arrayBuffer()], { type })), alt: f.path })
      : h('pre', { class: 'file' }, await resp.text());
    v.viewer.lastChild.replaceWith(body);
  } catch (e) {
    v.viewer.lastChild.replaceWith(errorBox(e));
  }
}

// debounce runs fn once, ms after the last call.
function debounce(fn, ms) {
  let timer;
  const d = () => {
    clearTimeout(timer);
    timer = setTimeout(fn, ms);
  };
  d.cancel = () => clearTimeout(timer);
  return d;
}
