// The executions list (what `hearth agents list` shows) and the agent
// sessions, polled every second so they follow what runs.

import { get, query } from '../api.js';
import { h, replace, badge, poll, errorBox } from '../dom.js';
import { turnsOf, spendOf, ranFor, when } from '../format.js';

export function mount(el) {
  const list = h('tbody', { id: 'executions' });
  const status = h('div', { class: 'status-line' });
  const sessions = h('tbody', { id: 'sessions' });
  el.append(
    h('h1', {}, 'Executions'),
    status,
    h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['execution', 'agent', 'session', 'status', 'calls', 'spent', 'elapsed'].map((c) => h('th', {}, c)))),
      list),
    h('h2', {}, 'Sessions'),
    h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['session', 'agent', 'created', 'last execution'].map((c) => h('th', {}, c)))),
      sessions),
  );
  const stopExecutions = poll(async () => {
    try {
      showExecutions(list, status, await get('/v1/executions' + query({ limit: 100 })));
    } catch (e) {
      replace(status, errorBox(e));
    }
  }, 1000);
  const stopSessions = poll(async () => {
    try {
      showSessions(sessions, await get('/v1/sessions' + query({ limit: 100 })));
    } catch {
      // the executions' poll shows the error
    }
  }, 3000);
  return () => {
    stopExecutions();
    stopSessions();
  };
}

// showExecutions updates the table in place, one row per execution,
// newest first.
function showExecutions(tbody, status, list) {
  const running = list.filter((e) => e.status === 'running' || e.status === 'pending').length;
  replace(status, list.length === 0
    ? h('p', { class: 'muted empty' }, 'No executions yet: start one with ', h('code', {}, 'hearth agents run AGENT "PROMPT"'), '.')
    : h('p', { class: 'muted' }, `${list.length} shown, ${running} running`));
  const rows = list.map((e) => {
    const tr = tbody.querySelector(`tr[data-id="${CSS.escape(e.id)}"]`) || h('tr', { dataset: { id: e.id } });
    fill(tr, e);
    return tr;
  });
  tbody.replaceChildren(...rows);
}

function fill(tr, e) {
  const cells = [
    h('a', { href: `#/execution/${encodeURIComponent(e.id)}` }, e.id),
    e.agent,
    e.session,
    badge(e.status),
    turnsOf(e),
    spendOf(e),
    ranFor(e),
  ];
  const names = ['id', 'agent', 'session', 'status', 'calls', 'spent', 'elapsed'];
  // Rewrite the row only when it changed, so that a click on it is not lost.
  const key = JSON.stringify([e.status, e.turns, e.usd, cells[6]]);
  if (tr.dataset.key === key) return;
  tr.dataset.key = key;
  tr.dataset.status = e.status;
  replace(tr, ...cells.map((c, i) => h('td', { class: `c-${names[i]}` }, c)));
}

function showSessions(tbody, list) {
  if (list.length === 0) {
    replace(tbody, h('tr', {}, h('td', { colspan: 4, class: 'muted' }, 'No sessions yet.')));
    return;
  }
  replace(tbody, ...list.map((s) => h('tr', { dataset: { id: s.id } },
    h('td', {}, s.id),
    h('td', {}, s.agent),
    h('td', {}, when(s.created)),
    h('td', {}, s.last_execution ? h('a', { href: `#/execution/${encodeURIComponent(s.last_execution)}` }, s.last_execution) : ''))));
}
