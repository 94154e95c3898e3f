// "#/workspace[/SESSION[/DIR]]": the shared tree agents coordinate
// through. Every session is a directory its own agent writes and every
// other agent reads; its .home is private and never shown. A session's
// page lists a directory, previews a file (text as text, a raster image
// from a blob: URL, never anything as HTML), lists its snapshots and
// downloads it as an archive.

import { get, query, authFetch, archiveURL, workspaceFileURL } from '../api.js';
import { h, replace, errorBox } from '../dom.js';
import { bytes, count, when, oneLine } from '../format.js';

export function mount(el, arg) {
  const [session, ...dir] = arg ? arg.split('/') : [];
  if (session) sessionPage(el, session, dir.join('/'));
  else sessions(el);
}

const rule = 'Each session\'s agent writes only its own directory and reads every other session\'s; its .home is private (not shown here).';

async function sessions(el) {
  const body = h('div', { id: 'ws-sessions' });
  el.append(h('h1', {}, 'Workspace'), h('p', { class: 'muted', id: 'ws-rule' }, rule), body);
  try {
    const [list, agentSessions] = await Promise.all([get('/v1/workspace/sessions'), get(`/v1/sessions${query({ limit: 10000 })}`)]);
    const agentOf = Object.fromEntries(agentSessions.map((s) => [s.id, s.agent]));
    replace(body, list.length === 0 ? h('p', { class: 'muted empty' }, 'No sessions yet: start a task.') : h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['session', 'writes here', 'reads here', 'files', 'size', 'created'].map((c) => h('th', {}, c)))),
      h('tbody', {}, list.map((s) => h('tr', { dataset: { session: s.ID } },
        h('td', {}, h('a', { href: `#/workspace/${encodeURIComponent(s.ID)}` }, `${s.ID}/`)),
        h('td', { class: 'c-writer' }, agentOf[s.ID] ? `${agentOf[s.ID]} (its executions in this session)` : 'the session\'s own sandboxes'),
        h('td', { class: 'muted' }, 'every agent'),
        h('td', { class: 'num' }, count(s.Files)), h('td', { class: 'num' }, bytes(s.Bytes)), h('td', {}, when(s.Created)))))));
  } catch (e) {
    replace(body, errorBox(e));
  }
}

function sessionPage(el, session, dir) {
  const v = { session, listing: h('div', { id: 'ws-files' }), viewer: h('div', { id: 'ws-viewer', class: 'viewer', hidden: true }), snapshots: h('div', { id: 'ws-snapshots' }) };
  el.append(h('p', { class: 'crumbs' }, h('a', { href: '#/workspace' }, 'Workspace'), ' / ', crumbs(session, dir)),
    h('div', { class: 'head' }, h('h1', {}, `${session}/${dir ? `${dir}/` : ''}`), h('a', { href: `#/session/${encodeURIComponent(session)}` }, 'its executions'),
      archiveButton(session, 'tar.gz'), archiveButton(session, 'zip')),
    h('p', { class: 'muted small' }, rule), v.listing, v.viewer, h('h2', {}, 'Snapshots'), v.snapshots);
  listDir(v, dir);
  listSnapshots(v);
}

// crumbs links each directory of the path.
function crumbs(session, dir) {
  const parts = dir ? dir.split('/') : [];
  const out = [h('a', { href: `#/workspace/${encodeURIComponent(session)}` }, session)];
  parts.forEach((p, i) => out.push(' / ', h('a', { href: `#/workspace/${[session, ...parts.slice(0, i + 1)].map(encodeURIComponent).join('/')}` }, p)));
  return out;
}

async function listDir(v, dir) {
  try {
    const list = await get(`/v1/workspace/sessions/${encodeURIComponent(v.session)}/files/list${query({ path: dir })}`);
    replace(v.listing, list.length === 0 ? h('p', { class: 'muted empty' }, 'Empty.') : h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['name', 'size', 'modified'].map((c) => h('th', {}, c)))),
      h('tbody', {}, list.map((f) => h('tr', { dataset: { path: f.path, type: f.type } },
        h('td', {}, entryLink(v, f)), h('td', { class: 'num' }, f.type === 'file' ? bytes(f.size) : ''), h('td', {}, when(f.modified)))))));
  } catch (e) {
    replace(v.listing, errorBox(e));
  }
}

function entryLink(v, f) {
  if (f.type === 'dir') return h('a', { href: `#/workspace/${[v.session, ...f.path.split('/')].map(encodeURIComponent).join('/')}` }, `${f.name}/`);
  if (f.type !== 'file') return h('span', { class: 'muted', title: `a ${f.type}: not opened here` }, f.name, h('span', { class: 'tag' }, f.type));
  return h('button', { class: 'link preview', type: 'button', onclick: () => preview(v, f) }, f.name);
}

const maxPreview = 2 << 20;

// preview shows a file by the type the daemon told from its bytes: an
// image from a blob: URL typed as that image, text as a text node, else
// only its size. Nothing is parsed as HTML, so an agent's file cannot run here.
async function preview(v, f) {
  const close = h('button', { class: 'link', type: 'button', onclick: () => { v.viewer.hidden = true; replace(v.viewer); } }, 'close');
  v.viewer.hidden = false;
  replace(v.viewer, h('div', { class: 'viewer-head' }, h('strong', {}, f.path), close), h('p', { class: 'muted' }, 'Loading…'));
  if (f.size > maxPreview) {
    v.viewer.lastChild.textContent = `${bytes(f.size)} is too big to show here: download the archive.`;
    return;
  }
  try {
    const resp = await authFetch(workspaceFileURL(v.session, f.path));
    if (!resp.ok) throw new Error(`${resp.status}: ${oneLine(await resp.text())}`);
    const type = resp.headers.get('Content-Type') || '';
    let body;
    if (/^image\/(png|jpeg|gif|webp)$/.test(type)) {
      body = h('img', { src: URL.createObjectURL(new Blob([await resp.arrayBuffer()], { type })), alt: f.name, dataset: { type } });
    } else if (type.startsWith('text/plain')) {
      body = h('pre', { class: 'file', dataset: { type: 'text' } }, await resp.text());
    } else {
      body = h('p', { class: 'muted', dataset: { type: 'binary' } }, `${bytes(f.size)} of binary data: download the archive to open it.`);
    }
    v.viewer.lastChild.replaceWith(body);
  } catch (e) {
    v.viewer.lastChild.replaceWith(errorBox(e));
  }
}

async function listSnapshots(v) {
  try {
    const list = await get(`/v1/workspace/snapshots${query({ session: v.session })}`);
    replace(v.snapshots, list.length === 0 ? h('p', { class: 'muted empty' }, 'No snapshots.') : h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['snapshot', 'taken', 'files', 'size'].map((c) => h('th', {}, c)))),
      h('tbody', {}, list.map((s) => h('tr', { dataset: { name: s.Name } },
        h('td', {}, h('code', {}, s.Name)), h('td', {}, when(s.Created)), h('td', { class: 'num' }, count(s.Files)), h('td', { class: 'num' }, bytes(s.Bytes)))))));
  } catch (e) {
    replace(v.snapshots, errorBox(e));
  }
}

// archiveButton downloads the session (its .home left out) as an
// archive: fetched with the browser's session, then saved from a blob
// typed as bytes.
function archiveButton(session, format) {
  const button = h('button', { class: `archive archive-${format.replace('.', '')}`, type: 'button', onclick: async () => {
    button.disabled = true;
    try {
      const resp = await authFetch(archiveURL(session, format));
      if (!resp.ok) throw new Error(`${resp.status}: ${oneLine(await resp.text())}`);
      const url = URL.createObjectURL(new Blob([await resp.arrayBuffer()], { type: 'application/octet-stream' }));
      h('a', { href: url, download: `${session}.${format}` }).click();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
    } catch (e) {
      button.replaceWith(errorBox(e));
    } finally {
      button.disabled = false;
    }
  } }, `download .${format}`);
  return button;
}
