// "#/session/ID": an agent session: its executions, newest first, and a
// form to resume it (a new prompt, inputs and a budget; the agent keeps
// its whole conversation).

import { get, query } from '../api.js';
import { h, replace, badge, errorBox } from '../dom.js';
import { usd, when } from '../format.js';
import { taskForm, limitsFor } from './taskform.js';

export function mount(el, id) {
  const list = h('div', { id: 'session-executions' });
  const resume = h('div', { id: 'resume' });
  el.append(h('p', { class: 'crumbs' }, h('a', { href: '#/' }, 'Executions'), ' / session'),
    h('div', { class: 'head' }, h('h1', {}, id), h('a', { href: `#/workspace/${encodeURIComponent(id)}` }, 'its files')), list, resume);
  load(id, list, resume);
}

async function load(id, list, resume) {
  let execs, agents;
  try {
    [execs, agents] = await Promise.all([get(`/v1/executions${query({ session: id, limit: 100 })}`), get('/v1/agents')]);
  } catch (e) {
    replace(list, errorBox(e));
    return;
  }
  if (execs.length === 0) {
    replace(list, h('p', { class: 'muted empty' }, `No executions in session ${id}.`));
    return;
  }
  const agent = agents.find((a) => a.name === execs[0].agent);
  replace(list, h('table', { class: 'list' },
    h('thead', {}, h('tr', {}, ['execution', 'kind', 'status', 'spent', 'created', 'prompt'].map((c) => h('th', {}, c)))),
    h('tbody', {}, execs.map((e) => h('tr', { dataset: { id: e.id } },
      h('td', {}, h('a', { href: `#/execution/${encodeURIComponent(e.id)}` }, e.id)),
      h('td', {}, e.kind), h('td', {}, badge(e.status)), h('td', { class: 'num' }, usd(e.usd)),
      h('td', {}, when(e.created)), h('td', { class: 'prompt small' }, e.prompt))))));
  replace(resume, h('h2', {}, `Resume with ${execs[0].agent}`), taskForm({
    id: 'resume-form', label: 'Resume',
    path: () => `/v1/sessions/${encodeURIComponent(id)}/resume`,
    request: (prompt, dollars) => ({ prompt, limits: limitsFor(dollars) }),
    limit: () => (agent && agent.limits.usd) || 0,
  }));
}
