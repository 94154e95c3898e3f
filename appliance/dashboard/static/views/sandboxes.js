// The sandboxes and what each uses now, as the host measures it.

import { get, post } from '../api.js';
import { h, replace, badge, poll, errorBox } from '../dom.js';
import { bytes, when, count, duration, goDuration } from '../format.js';

export function mount(el) {
  const body = h('div', { id: 'sandboxes' });
  el.append(h('h1', {}, 'Sandboxes'), body);
  return poll(async () => {
    try {
      const list = await get('/v1/sandboxes');
      // Another cluster node's sandbox (no driver here) has its ports on that node.
      const ports = await Promise.all(list.map((s) => (s.driver ? get(`/v1/sandboxes/${encodeURIComponent(s.id)}/ports`).catch(() => []) : [])));
      show(body, list, ports);
    } catch (e) {
      replace(body, errorBox(e));
    }
  }, 2000);
}

function show(el, list, ports) {
  if (list.length === 0) {
    replace(el, h('p', { class: 'muted empty' }, 'No sandboxes: make one with ', h('code', {}, 'hearth sandboxes create'), '.'));
    return;
  }
  replace(el, h('table', { class: 'list' },
    h('thead', {}, h('tr', {}, ['sandbox', 'image', 'status', 'tier', 'session', 'CPU time', 'memory', 'processes', 'disk', 'ports', 'last active'].map((c) => h('th', {}, c)))),
    h('tbody', {}, list.map((s, i) => {
      const u = s.usage;
      return h('tr', { dataset: { id: s.id } },
        h('td', {}, s.id, s.node ? h('div', { class: 'muted small' }, `on ${s.node}`) : null),
        h('td', {}, s.image),
        h('td', {}, badge(s.auto_paused ? 'paused' : s.status), s.auto_paused ? h('div', { class: 'muted small' }, 'idle') : null),
        h('td', {}, s.driver),
        h('td', {}, s.session || ''),
        h('td', { title: u ? u.cpu_time : '' }, u ? cpuTime(u.cpu_time) : '–', s.cpus ? h('div', { class: 'muted small' }, `${s.cpus} cores`) : null),
        h('td', {}, u ? meter(u.memory, u.memory_limit || s.memory) : '–'),
        h('td', {}, u ? `${count(u.processes)}${s.pids ? ' of ' + count(s.pids) : ''}` : '–'),
        h('td', {}, u ? meter(u.disk, u.disk_limit || s.disk) : '–'),
        h('td', { class: 'ports' }, portLinks(s.id, ports[i] || [])),
        h('td', {}, when(s.last_active || s.created)));
    }))));
}

// meter is "12 MB of 512 MB" over a bar, or the use alone without a limit.
function meter(used, limit) {
  if (used < 0) return 'not counted';
  if (!limit) return bytes(used);
  const pct = Math.min(100, (100 * used) / limit);
  return h('div', { class: 'meter', title: `${pct.toFixed(1)}%` },
    `${bytes(used)} of ${bytes(limit)}`,
    h('div', { class: 'bar' }, h('div', { class: pct > 90 ? 'fill hot' : 'fill', style: { width: `${pct.toFixed(1)}%` } })));
}

// cpuTime is CPU time for people: "8ms", "1.5s", "3m 42s".
function cpuTime(s) {
  const ms = goDuration(s);
  if (Number.isNaN(ms)) return s;
  return ms < 1000 ? `${Math.round(ms)}ms` : duration(ms);
}

// portLinks are the sandbox's exposed ports. A preview is an origin of
// its own, so the dashboard's session is not sent there: a click asks the
// API for a one-time sign-in link to that preview and opens it.
function portLinks(id, ports) {
  if (ports.length === 0) return '–';
  return ports.map((p) => h('div', {},
    h('a', {
      href: p.url, target: '_blank', rel: 'noopener noreferrer', dataset: { port: String(p.port) },
      onclick: async (ev) => {
        ev.preventDefault();
        const tab = window.open('about:blank', '_blank'); // now, while the click lets it open
        if (tab) tab.opener = null; // the preview's page gets no handle on the dashboard
        const si = await post(`/v1/sandboxes/${encodeURIComponent(id)}/ports/${p.port}/signin`);
        if (tab) tab.location = si.url; else location.assign(si.url);
      },
    }, `:${p.port}`),
    p.public_url ? h('a', { class: 'muted small public', href: p.public_url, target: '_blank', rel: 'noopener noreferrer' }, ' public') : null));
}
