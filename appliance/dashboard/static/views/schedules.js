// The schedules: when each runs next, how its last runs went; "#/schedules/ID"
// also lists that schedule's run history.

import { get, query } from '../api.js';
import { h, replace, poll, errorBox } from '../dom.js';
import { when, relative } from '../format.js';

export function mount(el, selected) {
  const body = h('div', { id: 'schedules' });
  const runs = h('div', { id: 'runs' });
  el.append(h('h1', {}, 'Schedules'), body, runs);
  return poll(async () => {
    try {
      const list = await get('/v1/schedules');
      showSchedules(body, list, selected);
      if (selected) showRuns(runs, selected, await get(`/v1/schedules/${encodeURIComponent(selected)}/runs${query({ limit: 20 })}`));
    } catch (e) {
      replace(body, errorBox(e));
    }
  }, 5000);
}

function showSchedules(el, list, selected) {
  if (list.length === 0) {
    replace(el, h('p', { class: 'muted empty' }, 'No schedules: add one with ', h('code', {}, 'hearth schedules add'),
      ' or a schedule in an agent\'s definition.'));
    return;
  }
  replace(el, h('table', { class: 'list' },
    h('thead', {}, h('tr', {}, ['schedule', 'spec', 'agent', 'next run', 'last run', 'now'].map((c) => h('th', {}, c)))),
    h('tbody', {}, list.map((s) => h('tr', { dataset: { id: s.id }, class: s.id === selected ? 'selected' : null },
      h('td', {}, h('a', { href: `#/schedules/${encodeURIComponent(s.id)}` }, s.id), h('div', { class: 'muted small' }, s.prompt)),
      h('td', {}, h('code', {}, s.spec)),
      h('td', {}, s.agent),
      h('td', { title: when(s.next) }, s.next ? [when(s.next), h('div', { class: 'muted small' }, relative(s.next))] : 'none'),
      h('td', {}, s.last ? runSummary(s.last) : 'never'),
      h('td', {}, [s.running ? `${s.running} running` : 'idle', s.queued ? ', one queued' : ''].join(''))))),
  ));
}

// runSummary is how a run went: its execution, why it was skipped, or
// its error.
function runSummary(r) {
  const out = [h('span', {}, when(r.scheduled))];
  if (r.execution) out.push(' ', h('a', { href: `#/execution/${encodeURIComponent(r.execution)}` }, r.execution));
  if (r.skipped) out.push(h('div', { class: 'muted small' }, `skipped: ${r.skipped}`));
  if (r.error) out.push(h('div', { class: 'error small' }, r.error));
  if (r.manual) out.push(h('span', { class: 'tag' }, 'manual'));
  if (r.catch_up) out.push(h('span', { class: 'tag' }, 'catch-up'));
  return out;
}

function showRuns(el, id, runs) {
  replace(el, h('h2', {}, `Runs of ${id}`), runs.length === 0
    ? h('p', { class: 'muted' }, 'No runs yet.')
    : h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['due', 'started', 'ended', 'outcome'].map((c) => h('th', {}, c)))),
      h('tbody', {}, runs.map((r) => h('tr', {},
        h('td', {}, when(r.scheduled)),
        h('td', {}, when(r.started)),
        h('td', {}, when(r.ended)),
        h('td', {}, runSummary({ ...r, scheduled: '' })))))));
}
